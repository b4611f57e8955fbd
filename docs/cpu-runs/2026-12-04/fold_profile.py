# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fold py-spy raw samples (`stack count` lines) of an engine-core or
worker process into the parts of a decode step: the first rule (in order)
whose pattern occurs in a sample's stack takes the sample.

    python fold_profile.py SAMPLES.txt
"""

import sys
from collections import Counter
from pathlib import Path

RULES = [
    ("ParaSLSTM metadata builder", "paraslstm_attn.py"),
    ("Mamba base metadata builder", "mamba_attn.py"),
    ("other attention metadata", "_build_attention_metadata"),
    ("ParaSLSTM model forward", "paraslstm"),
    ("model forward (other)", "_model_forward"),
    ("sampler", "Sampler."),
    ("input preparation", "_prepare_inputs"),
    ("input preparation", "_update_states"),
    ("model runner output", "_bookkeeping_sync"),
    ("model runner (other)", "GPUModelRunner."),
    ("scheduler.schedule", "Scheduler.schedule"),
    ("scheduler.update_from_output", "Scheduler.update_from_output"),
    ("outputs to the front end", "process_output_sockets"),
    ("waiting (engine core on the worker, worker on the engine core)", "dequeue"),
    (
        "waiting (engine core on the worker, worker on the engine core)",
        "_wait_for_response",
    ),
    ("shutdown", "shutdown"),
]


def main() -> None:
    counts: Counter[str] = Counter()
    for line in Path(sys.argv[1]).read_text().splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        key = "other"
        for name, pattern in RULES:
            if any(pattern in f for f in frames):
                key = name
                break
        counts[key] += int(n)
    total = sum(counts.values())
    for key, n in counts.most_common():
        print(f"{100 * n / total:5.1f}%  {key}")
    print(f"{total} samples")


if __name__ == "__main__":
    main()
