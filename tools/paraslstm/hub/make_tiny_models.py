# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Write the tiny ParaSLSTM hub checkpoints and their reference fixture.

The two tiny repos of `repos.json` hold random weights, written by
pararnn-torch's own `save_pretrained`, and the tokenizer of
`examples/paraslstm-tiny`. The fixture (`tests/models/fixtures/
paraslstm_tiny.json`, read by vLLM's `test_paraslstm.py`) holds pararnn-torch's
outputs for fixed token-id prompts: greedy tokens from the library's float32
`generate()`, and prompt and generation logprobs (top-5) from its `eval()`
forward on a float64 copy of the weights, rounded to 1e-5.

Run from the repo root in the pararnn-torch environment (never vLLM's):

    .venv-ref/bin/python tools/paraslstm/hub/make_tiny_models.py
    .venv-ref/bin/python tools/paraslstm/hub/make_tiny_models.py --out DIR
    .venv-ref/bin/python tools/paraslstm/hub/make_tiny_models.py --search 60

`--out DIR` writes the folders and the fixture under DIR instead (the drift
test compares them with the committed ones). `--search N` scores seeds 0..N-1
of each model: every greedy step of the fixture must lead the runner-up by
MIN_TOP1_MARGIN nats, so that exact token comparisons are fair; SEEDS are
the seeds with the largest smallest lead.
"""

import argparse
import copy
import importlib.metadata
import json
import math
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402
from pararnn.models import ParaSLSTMConfig, ParaSLSTMForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
REPOS = json.loads((Path(__file__).with_name("repos.json")).read_text())
FIXTURE = Path("tests/models/fixtures/paraslstm_tiny.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
TOKENIZER_SOURCE = ROOT / REPOS["pararnn/ParaSLSTM-tiny-random"]
EOS_ID = 0
VOCAB = 512
MODELS = {
    "pararnn/ParaSLSTM-tiny-random": {
        "mix": "diag",
        "hidden_size": 48,
        "max_recurrent_norm": 0.5,
        "tie_word_embeddings": True,
    },
    "pararnn/ParaSLSTM-tiny-random-head": {
        "mix": "head",
        "n_heads": 5,
        "hidden_size": 40,
        "max_recurrent_norm": None,
        "tie_word_embeddings": False,
    },
}
SEEDS = {"pararnn/ParaSLSTM-tiny-random": 99, "pararnn/ParaSLSTM-tiny-random-head": 82}
MAX_TOKENS = 10
NUM_LOGPROBS = 5
MIN_TOP1_MARGIN = 0.05
# The 80-token prompt spans several chunks of a 16-token budget; the last
# prompt shares its first PREFIX_LEN tokens.
PROMPT_LENGTHS = (1, 7, 23, 80)
PREFIX_LEN = 64


def prompts() -> list[list[int]]:
    rng = random.Random(2026)
    out = [[rng.randrange(1, VOCAB) for _ in range(n)] for n in PROMPT_LENGTHS]
    out.append(out[-1][:PREFIX_LEN] + [rng.randrange(1, VOCAB) for _ in range(31)])
    return out


def config(repo: str) -> ParaSLSTMConfig:
    return ParaSLSTMConfig(
        vocab_size=VOCAB, num_hidden_layers=2, mlp_ratio=2.0, **MODELS[repo]
    )


@torch.no_grad()
def build(repo: str, seed: int) -> ParaSLSTMForCausalLM:
    """The library's model with every parameter drawn from `seed`.

    The library's own init (embeddings of std 0.02, zero biases, tiny R)
    gives near-uniform logits and repetitive greedy text. Here every term of
    the step is O(1): forget-gate biases over [-2, 3], recurrent weights
    mostly outside a 0.5 clamp, small tied embeddings and a large MLP output
    (else greedy decoding repeats the current token).
    """
    torch.manual_seed(seed)
    model = ParaSLSTMForCausalLM(config(repo)).eval()
    gen = torch.Generator().manual_seed(seed)
    d = model.config.hidden_size

    def normal(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64) * std)

    def uniform(t: torch.Tensor, lo: float, hi: float) -> None:
        t.copy_(lo + (hi - lo) * torch.rand(t.shape, generator=gen))

    normal(model.embed.weight, 0.5)
    for block in model.blocks:
        cell = model._cell_at(block)
        uniform(block.norm_rnn.weight, 0.7, 1.3)
        normal(cell.W_x.weight, 1.5 / math.sqrt(d))
        bias = cell.W_x.bias.view(4, d)
        normal(bias, 0.5)
        uniform(bias[1], -2.0, 3.0)
        if cell.R is not None:
            normal(cell.R, 0.8)
        else:
            normal(cell.R_head, 0.5)
        uniform(block.norm_mlp.weight, 0.7, 1.3)
        normal(block.mlp.up.weight, 1.0 / math.sqrt(d))
        normal(block.mlp.up.bias, 0.2)
        normal(block.mlp.down.weight, 8.0 / math.sqrt(block.mlp.down.in_features))
        normal(block.mlp.down.bias, 0.2)
    uniform(model.norm.weight, 0.7, 1.3)
    if not model.config.tie_word_embeddings:
        normal(model.lm_head.weight, 4.0 / math.sqrt(d))
    return model


def _entries(logprobs: torch.Tensor, targets: list[int]) -> list:
    top_lp, top_id = logprobs.topk(NUM_LOGPROBS, dim=-1)
    return [
        [
            tok,
            round(float(logprobs[j, tok]), 5),
            [[int(i), round(float(v), 5)] for i, v in zip(top_id[j], top_lp[j])],
        ]
        for j, tok in enumerate(targets)
    ]


@torch.no_grad()
def reference(model: ParaSLSTMForCausalLM) -> dict:
    """Greedy tokens, logprobs, and the smallest top-1 lead of any greedy
    step (-inf when a continuation is degenerate or hits EOS)."""
    model64 = copy.deepcopy(model).to(torch.float64)
    outputs, margin = [], math.inf
    for prompt in prompts():
        ids = torch.tensor([prompt])
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, temperature=0.0)
        tokens = out[0, len(prompt) :].tolist()
        seq = torch.tensor([prompt + tokens[:-1]])
        logprobs = torch.log_softmax(model64(seq)[0], dim=-1)
        gen = logprobs[len(prompt) - 1 :]
        top2 = gen.topk(2, dim=-1).values
        margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
        if gen.argmax(-1).tolist() != tokens or EOS_ID in tokens:
            margin = -math.inf
        if len(set(tokens)) <= 3:
            margin = -math.inf
        outputs.append(
            {
                "tokens": tokens,
                "logprobs": _entries(gen, tokens),
                "prompt_logprobs": _entries(logprobs[: len(prompt) - 1], prompt[1:]),
            }
        )
    if len({tuple(o["tokens"]) for o in outputs}) < len(outputs):
        margin = -math.inf
    return {"min_top1_margin": round(margin, 5), "outputs": outputs}


def write_folder(repo: str, model: ParaSLSTMForCausalLM, out: Path) -> None:
    """The library's files (no legacy `pytorch_model.bin`), the tokenizer and
    the model card."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        cfg["eos_token_id"] = EOS_ID
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for name in ("model.safetensors", "pararnn_model_type.json"):
            shutil.copyfile(Path(tmp) / name, out / name)
    if out.resolve() != TOKENIZER_SOURCE.resolve():
        for name in TOKENIZER_FILES:
            shutil.copyfile(TOKENIZER_SOURCE / name, out / name)
    params = sum(p.numel() for p in model.parameters())
    (out / "README.md").write_text(model_card(repo, cfg, params))


def model_card(repo: str, cfg: dict, params: int) -> str:
    mix = cfg["mix"]
    if mix == "head":
        heads = cfg["n_heads"]
        mix = f"head ({heads} heads of {cfg['hidden_size'] // heads} channels)"
    rows = [
        ("mix", mix),
        ("hidden size", cfg["hidden_size"]),
        ("layers", cfg["num_hidden_layers"]),
        ("intermediate size", cfg["intermediate_size"]),
        ("max_recurrent_norm", cfg["max_recurrent_norm"] or "none (unclamped)"),
        ("tied embeddings", "yes" if cfg["tie_word_embeddings"] else "no"),
        ("vocabulary", cfg["vocab_size"]),
        ("parameters", f"{params:,} (float32)"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    version = importlib.metadata.version("pararnn-torch")
    return f"""---
license: apache-2.0
library_name: vllm
pipeline_tag: text-generation
tags:
- paraslstm
- pararnn
- slstm
- random-weights
- test-model
---

# {repo.split("/")[1]}

A tiny ParaSLSTM (attention-free sLSTM language model) with **random
weights**, for tests: it writes no meaningful text. It is vLLM's CI model for
the ParaSLSTM architecture (`ParaSLSTMForCausalLM`), with the trained
[pararnn/ParaSLSTM-KJV-1.7M](https://huggingface.co/pararnn/ParaSLSTM-KJV-1.7M)
as the architecture's main example.

| | |
|---|---|
{table}

## Training and data

None. [pararnn-torch](https://pypi.org/project/pararnn-torch/) {version}
built the model and wrote these files with its own `save_pretrained`, after
drawing every parameter from seed {SEEDS[repo]} (recurrent weights, gate biases
and the MLP scaled so that the greedy continuations are varied and every
greedy step has a clear winner). The tokenizer is a byte-level BPE of 512
tokens (`<|endoftext|>` = 0), trained with `tokenizers` on the docstrings of
Python's built-ins. Script: `tools/paraslstm/hub/make_tiny_models.py` of the
ParaSLSTM-for-vLLM project.

## Evaluation

Random weights: nothing to evaluate. pararnn-torch's greedy tokens and float64
top-{NUM_LOGPROBS} prompt and generation logprobs for fixed token-id prompts
are stored in vLLM's `tests/models/fixtures/paraslstm_tiny.json`; vLLM must
give the same tokens and every logprob within 1e-3
(`tests/models/language/generation/test_paraslstm.py`).

## Use with vLLM

```python
from vllm import LLM, SamplingParams

llm = LLM("{repo}", dtype="float32")
out = llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=16))
print(out[0].outputs[0].text)
```

pararnn-torch loads it too:
`ParaSLSTMForCausalLM.from_pretrained(snapshot_download("{repo}"))`.
"""


def dump(fixture: dict) -> str:
    """Compact JSON: one line per prompt and per list of an output."""
    one = json.dumps
    lines = ["{"]
    for key in ("pararnn_torch", "torch", "max_tokens", "num_logprobs"):
        lines.append(f"  {one(key)}: {one(fixture[key])},")
    lines.append('  "prompts": [')
    lines.append(",\n".join(f"    {one(p)}" for p in fixture["prompts"]))
    lines.append("  ],")
    lines.append('  "models": {')
    models = []
    for repo, ref in fixture["models"].items():
        outs = []
        for out in ref["outputs"]:
            keys = ",\n".join(f"        {one(k)}: {one(v)}" for k, v in out.items())
            outs.append("      {\n" + keys + "\n      }")
        models.append(
            f"    {one(repo)}: {{\n"
            f'      "min_top1_margin": {one(ref["min_top1_margin"])},\n'
            '      "outputs": [\n' + ",\n".join(outs) + "\n      ]\n    }"
        )
    lines.append(",\n".join(models))
    lines.append("  }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == fixture
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write under this directory")
    parser.add_argument("--search", type=int, metavar="N", help="score seeds 0..N-1")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.search:
        for repo in MODELS:
            scores = {
                s: reference(build(repo, s))["min_top1_margin"]
                for s in range(args.search)
            }
            best = max(scores, key=scores.get)
            print(f"{repo}: best seed {best} (margin {scores[best]}); {scores}")
        return 0
    root = args.out or ROOT
    fixture = {
        "pararnn_torch": importlib.metadata.version("pararnn-torch"),
        "torch": torch.__version__,
        "max_tokens": MAX_TOKENS,
        "num_logprobs": NUM_LOGPROBS,
        "prompts": prompts(),
        "models": {},
    }
    for repo in MODELS:
        folder = root / REPOS[repo]
        write_folder(repo, build(repo, SEEDS[repo]), folder)
        # The reference of the files as written, loaded as users load them.
        ref = reference(ParaSLSTMForCausalLM.from_pretrained(folder).eval())
        if ref["min_top1_margin"] < MIN_TOP1_MARGIN:
            raise SystemExit(
                f"{repo}: seed {SEEDS[repo]} fails: {ref['min_top1_margin']}"
            )
        fixture["models"][repo] = ref
        print(f"{repo}: {folder} (min top-1 margin {ref['min_top1_margin']})")
    path = root / FIXTURE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(fixture))
    print(f"wrote {path} ({len(path.read_text().splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
