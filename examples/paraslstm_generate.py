# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Generate text with ParaSLSTM in vLLM.

Usage: python examples/paraslstm_generate.py [--model DIR] [--max-tokens N]
The default model is the embedded demo checkpoint `examples/paraslstm-tiny`.
"""

import argparse
from pathlib import Path

from vllm import LLM, SamplingParams

DEFAULT_MODEL = Path(__file__).resolve().parent / "paraslstm-tiny"
PROMPTS = [
    "Return the number of items",
    "Create a new dictionary",
    "The",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=64 * 2**20)
    args = parser.parse_args()

    llm = LLM(model=args.model, kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for out in llm.generate(PROMPTS, params):
        print(f"{out.prompt!r} -> {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()
