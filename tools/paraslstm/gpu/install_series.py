#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Put a prefix of the stack into an installed vLLM (run on the GPU machine).

vllm/ files go into SITE, tests/ files into TESTS (the pristine tree's
tests/, optional). Every file the stack changes must still be the pristine
file (sha256 from the manifest), else nothing is written: the result is then
exactly the tree that `git am` of that prefix gives. A previous install is
undone first (its added files removed, its changed files restored from the
copies it kept), so prefixes can be installed one after the other.

Usage: python3 install_series.py SITE paraslstm_series-<folder>.tar [TESTS]
       python3 install_series.py --undo SITE   (SITE's vllm/ back to pristine)
"""

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

UNDO = ".paraslstm_undo.tar"


def root_of(path: str, site: Path, tests: Path | None) -> Path | None:
    if path.startswith("vllm/"):
        return site
    return tests


def undo(site: Path, tests: Path | None) -> None:
    undo_tar = site / UNDO
    if not undo_tar.is_file():
        return
    with tarfile.open(undo_tar) as tar:
        record = json.load(tar.extractfile("undo.json"))
        for path in record["added"]:
            root = root_of(path, site, tests)
            if root is not None:
                (root / path).unlink(missing_ok=True)
        for member in tar.getmembers():
            root = root_of(member.name, site, tests)
            if member.name != "undo.json" and root is not None:
                (root / member.name).write_bytes(tar.extractfile(member).read())
    undo_tar.unlink()
    print(f"install_series: undid {record['folder']}")


def main() -> int:
    if sys.argv[1] == "--undo":
        undo(Path(sys.argv[2]).resolve(), None)
        return 0
    site, archive = Path(sys.argv[1]).resolve(), sys.argv[2]
    tests = Path(sys.argv[3]).resolve() if len(sys.argv) > 3 else None
    undo(site, tests)
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        added, kept = [], {}
        for path, digest in manifest["modified"].items():
            root = root_of(path, site, tests)
            if root is None:
                continue
            have = (root / path).read_bytes()
            if hashlib.sha256(have).hexdigest() != digest:
                raise SystemExit(
                    f"install_series: {root / path} is not the pristine file "
                    "the stack was made against"
                )
            kept[path] = have
        for path in manifest["added"]:
            root = root_of(path, site, tests)
            if root is None:
                continue
            if (root / path).exists():
                raise SystemExit(f"install_series: {root / path} already exists")
            added.append(path)
        with tarfile.open(site / UNDO, "w") as out:
            blob = json.dumps({"folder": manifest["folder"], "added": added}).encode()
            for name, data in [("undo.json", blob), *kept.items()]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
        n = 0
        for member in tar.getmembers():
            root = root_of(member.name, site, tests)
            if member.name == "manifest.json" or root is None:
                continue
            tar.extract(member, root, filter="data")
            n += 1
    print(f"install_series: {manifest['folder']}: {n} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
