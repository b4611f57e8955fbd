# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Seed an offline Hugging Face cache with this project's hub repos.

Writes `HF_HOME/hub/models--ORG--NAME/{blobs,snapshots/COMMIT,refs/main}`,
the layout huggingface_hub's downloads leave, from the folders that
`tools/paraslstm/hub/repos.json` maps the repo ids to. Then, with
`HF_HOME=... HF_HUB_OFFLINE=1`, vLLM and transformers load the models by
repo id (`LLM("pararnn/ParaSLSTM-tiny-random")`) without a network, as
vLLM's tests do. Standard library only; any Python 3.10+.

Usage (from anywhere):

    python3 tools/paraslstm/ci/seed_hf_cache.py HF_HOME [REPO_ID ...]

Every repo of repos.json unless REPO_IDs are given. A repo's cache entry is
rewritten from scratch; its commit hash is a digest of the folder's files, so
an unchanged folder gives the same snapshot path. Prints HF_HOME last.
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REPOS_FILE = ROOT / "tools" / "paraslstm" / "hub" / "repos.json"
# Files stored through Git LFS on the Hub: their blob name is the sha256.
LFS_SUFFIXES = (".safetensors", ".bin")


def repos() -> dict[str, Path]:
    """Repo id -> checkpoint folder (absolute)."""
    mapping = json.loads(REPOS_FILE.read_text())
    return {repo: ROOT / folder for repo, folder in mapping.items()}


def _blob_name(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    # A regular file's etag on the Hub is its git blob id.
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def seed_repo(hub_cache: Path, repo: str, folder: Path) -> Path:
    """Cache entry of `repo` from `folder`; returns its snapshot directory."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{repo}: no config.json in {folder}")
    blobs = {p.name: _blob_name(p) for p in files}
    commit = hashlib.sha1(json.dumps(blobs, sort_keys=True).encode()).hexdigest()

    entry = hub_cache / ("models--" + repo.replace("/", "--"))
    shutil.rmtree(entry, ignore_errors=True)
    (entry / "blobs").mkdir(parents=True)
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(commit)
    for path in files:
        blob = entry / "blobs" / blobs[path.name]
        shutil.copyfile(path, blob)
        os.symlink(Path("..", "..", "blobs", blobs[path.name]), snapshot / path.name)
    return snapshot


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    hf_home = Path(argv[0]).resolve()
    known = repos()
    wanted = argv[1:] or list(known)
    unknown = [r for r in wanted if r not in known]
    if unknown:
        print(f"unknown repo ids {unknown}; known: {list(known)}", file=sys.stderr)
        return 2
    for repo in wanted:
        snapshot = seed_repo(hf_home / "hub", repo, known[repo])
        print(f"{repo}: {snapshot}", file=sys.stderr)
    print(hf_home)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
