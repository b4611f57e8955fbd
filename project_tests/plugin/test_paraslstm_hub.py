# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The hub checkpoints (tools/paraslstm/hub/repos.json) and the tiny fixture.

- drift: `make_tiny_models.py`, run again with pararnn-torch, writes the same
  tiny checkpoint files and the same fixture (tokens exactly, logprobs to the
  stored precision) as committed;
- the fixture makes exact token comparisons fair (a clear top-1 lead at every
  greedy step, no EOS, varied continuations) and stays small;
- every folder is ready to upload (model card with licence and sections);
- `seed_hf_cache.py` builds an offline cache from which vLLM loads the models
  by repo id, as vLLM's CI loads them, with the fixture's greedy tokens.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from project_tests.plugin.paraslstm_pararnn_utils import (
    assert_entries_close,
    reference_python,
)

ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / "tools" / "paraslstm" / "hub"
REPOS = json.loads((HUB / "repos.json").read_text())
FIXTURE_PATH = Path("tests/models/fixtures/paraslstm_tiny.json")
FIXTURE = json.loads((ROOT / FIXTURE_PATH).read_text())
TINY = list(FIXTURE["models"])
MIN_TOP1_MARGIN = 0.05
EOS_ID = 0


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hub")
    cmd = [reference_python(), "-I", str(HUB / "make_tiny_models.py"), "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return out


def test_tiny_fixture_has_not_drifted(regenerated):
    new = json.loads((regenerated / FIXTURE_PATH).read_text())
    for key in ("max_tokens", "num_logprobs", "prompts"):
        assert new[key] == FIXTURE[key], key
    assert list(new["models"]) == TINY
    for repo in TINY:
        for i, (n, o) in enumerate(
            zip(new["models"][repo]["outputs"], FIXTURE["models"][repo]["outputs"])
        ):
            where = f"{repo} prompt {i}"
            assert n["tokens"] == o["tokens"], where
            assert_entries_close(n["logprobs"], o["logprobs"], where)
            assert_entries_close(n["prompt_logprobs"], o["prompt_logprobs"], where)


@pytest.mark.parametrize("repo", TINY)
def test_tiny_checkpoint_files_have_not_drifted(regenerated, repo):
    """The same bytes: weights, config, model card and tokenizer."""
    committed, new = ROOT / REPOS[repo], regenerated / REPOS[repo]
    names = sorted(p.name for p in committed.iterdir())
    assert names == sorted(p.name for p in new.iterdir())
    for name in names:
        same = (committed / name).read_bytes() == (new / name).read_bytes()
        assert same, f"{REPOS[repo]}/{name} differs from make_tiny_models.py's"


def test_tiny_fixture_is_fair_and_compact():
    assert len((ROOT / FIXTURE_PATH).read_text().splitlines()) <= 200
    prompts = FIXTURE["prompts"]
    # One prompt is chunked by a 16-token budget; one shares its first 64
    # tokens (the prefix-caching test).
    assert max(len(p) for p in prompts) >= 80
    assert prompts[4][:64] == prompts[3][:64] and prompts[4][64] != prompts[3][64]
    for repo, ref in FIXTURE["models"].items():
        assert ref["min_top1_margin"] >= MIN_TOP1_MARGIN, repo
        tokens = [tuple(out["tokens"]) for out in ref["outputs"]]
        assert len(set(tokens)) == len(tokens), repo
        for out in ref["outputs"]:
            assert len(out["tokens"]) == FIXTURE["max_tokens"], repo
            assert EOS_ID not in out["tokens"] and len(set(out["tokens"])) > 3, repo
            for token, _, top in out["logprobs"]:
                assert token == top[0][0], repo
                assert top[0][1] - top[1][1] >= MIN_TOP1_MARGIN, repo


@pytest.mark.parametrize("repo", list(REPOS))
def test_hub_folder_is_ready_to_upload(repo):
    folder = ROOT / REPOS[repo]
    files = {p.name for p in folder.iterdir()}
    needed = {"README.md", "config.json", "model.safetensors", "tokenizer.json"}
    assert needed | {"tokenizer_config.json"} <= files, files
    assert "pytorch_model.bin" not in files
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\n"), repo
    for section in ("## Training", "## Evaluation", "## Use with vLLM", repo):
        assert section in card, (repo, section)
    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) <= config["vocab_size"]
    assert config["eos_token_id"] == EOS_ID
    if repo in TINY:
        assert sum(p.stat().st_size for p in folder.iterdir()) < 500_000


_LOAD_BY_REPO_ID = """
import json, sys
from vllm import LLM, SamplingParams
fixture = json.loads(sys.argv[1])
prompts = [{"prompt_token_ids": p} for p in fixture["prompts"]]
params = SamplingParams(temperature=0.0, max_tokens=fixture["max_tokens"])
for repo in fixture["models"]:
    llm = LLM(repo, dtype="float32", enforce_eager=True, max_model_len=1024,
              kv_cache_memory_bytes=2**26)
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    want = [o["tokens"] for o in fixture["models"][repo]["outputs"]]
    assert got == want, (repo, got, want)
    text = llm.generate(["def f(x):"], params)[0].outputs[0].text
    assert text, repo
    del llm
print("loaded by repo id:", list(fixture["models"]))
"""


def test_seeded_cache_loads_by_repo_id(tmp_path):
    """Offline, from the seeded cache, with the tokenizer: the fixture's
    greedy tokens."""
    seed = HUB.parent / "ci" / "seed_hf_cache.py"
    proc = subprocess.run(
        [sys.executable, str(seed), str(tmp_path / "hf"), *TINY],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "hf")
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_PLUGINS": "paraslstm",
    }
    env.pop("HF_HUB_CACHE", None)
    fixture = {k: FIXTURE[k] for k in ("prompts", "max_tokens", "models")}
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_BY_REPO_ID, json.dumps(fixture)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "loaded by repo id" in proc.stdout
