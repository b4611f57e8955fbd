# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fold py-spy raw samples of a served engine core (v0.34, V2 runner, one
GPU: the runner's Python runs in the engine core) into the parts of a step.

Each sample goes to the first rule whose pattern occurs in one of its frames
(rules are ordered innermost part first); the samples no rule takes are
listed by their innermost frame.

    python3 tools/paraslstm/gpu/fold_pyspy.py pyspy-serving-7b.txt [--top N]
"""

import argparse
from collections import Counter
from pathlib import Path

RULES = [
    ("waiting for the GPU (event / stream sync)", "synchronize"),
    ("scheduler: allocate_slots", "KVCacheManager.allocate_slots"),
    ("scheduler: schedule (rest)", "Scheduler.schedule"),
    ("scheduler: update_from_output", "Scheduler.update_from_output"),
    ("runner: ParaSLSTM metadata builder", "paraslstm_attn.py"),
    ("runner: Mamba metadata builder", "mamba_attn.py"),
    ("runner: attention metadata (rest)", "prepare_attn"),
    ("runner: prepare_inputs", "prepare_inputs"),
    ("runner: request states", "_requests"),
    ("runner: sample_tokens", "sample_tokens"),
    ("runner: execute_model (rest: launch, graph replay)", "execute_model"),
    ("engine core: outputs to the front end", "process_output_sockets"),
    ("engine core: inputs from the front end", "process_input_sockets"),
    ("engine core: request intake", "add_request"),
    ("engine core: step (rest)", "EngineCore.step"),
]


def fold(path: Path) -> tuple[Counter, Counter]:
    parts: Counter[str] = Counter()
    unmatched: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        for name, pattern in RULES:
            if any(pattern in f for f in frames):
                parts[name] += int(n)
                break
        else:
            parts["other"] += int(n)
            unmatched[frames[-1]] += int(n)
    return parts, unmatched


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("samples", type=Path)
    p.add_argument("--top", type=int, default=8, help="unmatched frames listed")
    args = p.parse_args()
    parts, unmatched = fold(args.samples)
    total = sum(parts.values())
    if not total:
        raise SystemExit(f"{args.samples}: no samples")
    print("| part | share of samples |\n|---|---|")
    for name, n in parts.most_common():
        print(f"| {name} | {100 * n / total:.1f}% |")
    print(f"\n{total} samples")
    if unmatched:
        print("\nother, by innermost frame:")
        for frame, n in unmatched.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
