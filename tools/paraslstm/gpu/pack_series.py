#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Pack the stack's files for the GPU machine (run here, not there).

For every prefix of the PR stack (`series.py apply --upto FOLDER`) writes
DEST/paraslstm_series-<folder>.tar: every file under vllm/ and tests/ that
the prefix adds or changes, as the patched tree has it, plus manifest.json
with the sha256 of the pristine version of each changed file and the
prefix's pytest invocations (`tests`: all of the prefix's PRs; `only`: its
last PR's). install_series.py checks those hashes before
it overwrites anything, so the result is exactly the patched tree. The last
prefix is also written as DEST/paraslstm_series.tar.

Usage: python3 tools/paraslstm/gpu/pack_series.py DEST
"""

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERIES = [sys.executable, str(ROOT / "tools/paraslstm/series/series.py")]


def run(*args: str) -> str:
    return subprocess.run(
        args, check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout


def pack(folder: str, dest: Path) -> Path:
    tree = Path(run(*SERIES, "apply", "--upto", folder).strip().splitlines()[-1])
    base = run("git", "-C", str(tree), "rev-list", "--max-parents=0", "HEAD").split()[0]
    status = run(
        "git", "-C", str(tree), "diff", "--name-status", base, "HEAD",
        "--", "vllm/", "tests/",
    )  # fmt: skip
    tests, only = (
        [line.split("\t") for line in run(*SERIES, "tests", *args).splitlines()]
        for args in (("--upto", folder), ("--upto", folder, "--only"))
    )
    manifest: dict = {
        "folder": folder,
        "added": [],
        "modified": {},
        "tests": tests,
        "only": only,
    }
    out = dest / f"paraslstm_series-{folder}.tar"
    with tarfile.open(out, "w") as tar:
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
    print(f"pack_series: {folder}: {n} files -> {out}")
    return out


def main() -> int:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    last = None
    for folder in run(*SERIES, "folders").split():
        last = pack(folder, dest)
    assert last is not None
    shutil.copyfile(last, dest / "paraslstm_series.tar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
