#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Put the series into an installed vLLM 0.32.0 (run on the GPU machine).

Every file the series changes must still be the pristine v0.32.0 file
(sha256 from the manifest), else nothing is written: the result is then
exactly the tree that `git am patches/*` gives.

Usage: python3 install_series.py SITE paraslstm_series.tar
"""

import hashlib
import json
import sys
import tarfile
from pathlib import Path


def main() -> int:
    site, archive = Path(sys.argv[1]), sys.argv[2]
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        for path, digest in manifest["modified"].items():
            have = hashlib.sha256((site / path).read_bytes()).hexdigest()
            if have != digest:
                raise SystemExit(
                    f"install_series: {site / path} is not the v0.32.0 file "
                    "the series was made against"
                )
        for path in manifest["added"]:
            if (site / path).exists():
                raise SystemExit(f"install_series: {site / path} already exists")
        members = [m for m in tar.getmembers() if m.name != "manifest.json"]
        tar.extractall(site, members=members, filter="data")
    print(f"install_series: {len(members)} files into {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
