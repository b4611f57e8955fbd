# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Generate text with ParaSLSTM in vLLM.

Usage: python examples/paraslstm_generate.py [--model DIR] [--max-tokens N]
The default model is the embedded demo checkpoint `examples/paraslstm-kjv`: a
1.7M-parameter ParaSLSTM trained by pararnn-torch on the King James Bible
(see `examples/paraslstm_demo_model/README.md`).
"""

import argparse
from pathlib import Path

from vllm import LLM, SamplingParams

DEFAULT_MODEL = Path(__file__).resolve().parent / "paraslstm-kjv"
PROMPTS = [
    "In the beginning",
    "And the LORD said unto Moses,",
    "Blessed are the",
    "The kingdom of heaven is like",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=64 * 2**20)
    args = parser.parse_args()

    llm = LLM(model=args.model, kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for out in llm.generate(PROMPTS, params):
        print(f"{out.prompt!r} -> {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()
