# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Recompute `paraslstm_reference.json` with pararnn-torch.

Runs in the pararnn-torch environment (`.venv-ref`, made by
`tools/paraslstm/ci/setup_reference_env.sh`), never in vLLM's; it does not
import vLLM. For every case of `paraslstm_utils.CASES` it

1. writes the checkpoint with `paraslstm_utils.write_checkpoint` and checks
   that its `config.json` and safetensors header (names, shapes, dtypes,
   metadata) are those pararnn-torch's own `save_pretrained` writes for the
   same config;
2. loads it with `ParaSLSTMForCausalLM.from_pretrained` (strict: a missing or
   unexpected weight raises);
3. greedily generates `MAX_TOKENS` tokens per prompt with the library's
   `generate()` in float32, and computes every prompt and generation logprob
   (top-`NUM_LOGPROBS` included) with the library's decode step on a float64
   copy of the weights (as `paraslstm_pararnn_ref.step_logits` does); the
   float64 argmax must be the float32 greedy token at every step.

Usage (from the repo root)::

    .venv-ref/bin/python project_tests/plugin/paraslstm_make_reference.py [OUT]

OUT defaults to `project_tests/intree/paraslstm_reference.json`, beside
`paraslstm_utils.py`. The drift test
(`test_paraslstm_pararnn.py`) runs it into a temporary file and compares.
"""

import copy
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load(name: str, where: Path = HERE):
    spec = importlib.util.spec_from_file_location(name, where / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


utils = _load("paraslstm_utils", HERE.parent / "intree")
pararnn_ref = _load("paraslstm_pararnn_ref")

from pararnn.models import ParaSLSTMConfig, ParaSLSTMForCausalLM  # noqa: E402


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    return {
        k: v if k == "__metadata__" else (v["dtype"], v["shape"])
        for k, v in header.items()
    }


def check_layout(name: str, ours: Path, work: Path) -> None:
    """Our files are pararnn-torch's files for the same config."""
    case = utils.CASES.get(name) or utils.UNSHARDABLE_CASES[name]
    model = ParaSLSTMForCausalLM(ParaSLSTMConfig(**case["config"]))
    if case["dtype"] == "bfloat16":
        model.to(torch.bfloat16)
    theirs = work / f"{name}-pararnn"
    model.save_pretrained(theirs)
    for fname in ("config.json",):
        a = json.loads((ours / fname).read_text())
        b = json.loads((theirs / fname).read_text())
        if a != b or list(a) != list(b):
            raise AssertionError(f"{name}: {fname} differs:\n{a}\n{b}")
    a, b = _header(ours / "model.safetensors"), _header(theirs / "model.safetensors")
    if a != b:
        raise AssertionError(f"{name}: safetensors header differs:\n{a}\n{b}")


def _entries(logits: torch.Tensor, targets: list[int], k: int) -> list:
    lp = torch.log_softmax(logits.double(), dim=-1)
    top_lp, top_id = lp.topk(k, dim=-1)
    return [
        [
            int(tok),
            round(float(lp[j, tok]), 5),
            [[int(i), round(float(v), 5)] for i, v in zip(top_id[j], top_lp[j])],
        ]
        for j, tok in enumerate(targets)
    ]


@torch.no_grad()
def run_case(name: str, work: Path) -> dict:
    ckpt = utils.write_checkpoint(name, work / name)
    check_layout(name, ckpt, work)
    model = ParaSLSTMForCausalLM.from_pretrained(ckpt).to(torch.float32).eval()
    model64 = copy.deepcopy(model).to(torch.float64)
    outputs, margins = [], []
    for prompt in utils.case_prompts(name):
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model.generate(ids, max_new_tokens=utils.MAX_TOKENS, temperature=0.0)
        gen = [int(t) for t in out[0, len(prompt) :].tolist()]
        logits = pararnn_ref.step_logits(model64, prompt + gen[:-1])
        gen_logits = logits[len(prompt) - 1 :]
        if gen_logits.argmax(dim=-1).tolist() != gen:
            raise AssertionError(f"{name}: float64 argmax is not generate()'s token")
        top2 = torch.log_softmax(gen_logits, dim=-1).topk(2, dim=-1).values
        margins.append(float((top2[:, 0] - top2[:, 1]).min()))
        outputs.append(
            {
                "tokens": gen,
                "gen_logprobs": _entries(gen_logits, gen, utils.NUM_LOGPROBS),
                "prompt_logprobs": _entries(
                    logits[: len(prompt) - 1], prompt[1:], utils.NUM_LOGPROBS
                ),
            }
        )
    return {
        "dtype": utils.CASES[name]["dtype"],
        "min_top1_margin": round(min(margins), 6),
        "prompts": utils.case_prompts(name),
        "outputs": outputs,
    }


def dump(ref: dict) -> str:
    """JSON with one prompt or logprob position per line."""
    one = json.dumps
    lines = ["{"]
    for key in ("pararnn_torch", "torch", "max_tokens", "num_logprobs"):
        lines.append(f"  {one(key)}: {one(ref[key])},")
    lines.append('  "cases": {')
    for c, (name, case) in enumerate(ref["cases"].items()):
        lines.append(f"    {one(name)}: {{")
        lines.append(f'      "dtype": {one(case["dtype"])},')
        lines.append(f'      "min_top1_margin": {one(case["min_top1_margin"])},')
        lines.append('      "prompts": [')
        lines.append(",\n".join(f"        {one(p)}" for p in case["prompts"]))
        lines.append("      ],")
        lines.append('      "outputs": [')
        outs = []
        for out in case["outputs"]:
            body = [f'          "tokens": {one(out["tokens"])}']
            for key in ("gen_logprobs", "prompt_logprobs"):
                rows = ",\n".join(f"            {one(e)}" for e in out[key])
                body.append(f'          "{key}": [\n{rows}\n          ]')
            outs.append("        {\n" + ",\n".join(body) + "\n        }")
        lines.append(",\n".join(outs))
        lines.append("      ]")
        lines.append("    }" + ("," if c < len(ref["cases"]) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == ref
    return text


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else utils.REFERENCE_FILE
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in utils.UNSHARDABLE_CASES:
            check_layout(name, utils.write_checkpoint(name, work / name), work)
        ref = {
            "pararnn_torch": importlib.metadata.version("pararnn-torch"),
            "torch": torch.__version__,
            "max_tokens": utils.MAX_TOKENS,
            "num_logprobs": utils.NUM_LOGPROBS,
            "cases": {name: run_case(name, work) for name in utils.CASES},
        }
    out.write_text(dump(ref))
    for name, case in ref["cases"].items():
        print(f"{name}: min top-1 margin {case['min_top1_margin']:.4f}")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
