#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Pack the series' vllm/ files for the GPU machine (run here, not there).

`git am`s patches/ onto a pristine v0.32.0 tree (tools/paraslstm/series/series.py
apply) and writes DEST/paraslstm_series.tar: every file under vllm/ that the
series adds or changes, as the patched tree has it, plus manifest.json with
the sha256 of the pristine version of each changed file.
install_series.py checks those hashes against the carried wheel before it
overwrites anything, so the result is exactly the patched tree.

Usage: python3 tools/paraslstm/gpu/pack_series.py DEST
"""

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main() -> int:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/paraslstm/series/series.py"), "apply"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    tree = Path(out.strip().splitlines()[-1])
    base = subprocess.run(
        ["git", "-C", str(tree), "rev-list", "--max-parents=0", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[0]
    status = subprocess.run(
        ["git", "-C", str(tree), "diff", "--name-status", base, "HEAD", "--", "vllm/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    manifest: dict = {"added": [], "modified": {}}
    with tarfile.open(dest / "paraslstm_series.tar", "w") as tar:
        for line in status.splitlines():
            kind, path = line.split("\t")
            if kind == "A":
                manifest["added"].append(path)
            elif kind == "M":
                pristine = subprocess.run(
                    ["git", "-C", str(tree), "show", f"{base}:{path}"],
                    check=True,
                    capture_output=True,
                ).stdout
                manifest["modified"][path] = hashlib.sha256(pristine).hexdigest()
            else:
                raise SystemExit(f"pack_series: unexpected change {line!r}")
            tar.add(tree / path, arcname=path)
        blob = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    n = len(manifest["added"]) + len(manifest["modified"])
    print(f"pack_series: {n} files -> {dest / 'paraslstm_series.tar'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
