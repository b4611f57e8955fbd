# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""GPU SM activity during each served run.

Reads the serve stage's `nvidia-smi dmon -s u -o DT` log and its jsonl rows
(whose `started`/`ended` fields are in dmon's local time format) and prints,
per row, SM% in 5-s means over the run and the mean over its decode phase:
from `--head` seconds after the GPU's first busy stretch (5 s at SM >=
`--busy`%: the client has sent its requests; the head covers the first
batch's prefill) to the last `--tail` fraction of the run (the batch
draining below max-num-seqs). A run whose GPU never reaches `--busy` for
5 s (host-bound) gets no decode window; give it a lower `--busy`.

    python3 tools/paraslstm/gpu/dmon_window.py dmon-serving-7b.log serving-7b.jsonl
"""

import argparse
import json
import statistics
from datetime import datetime
from pathlib import Path

FMT = "%Y%m%d %H:%M:%S"


def read_dmon(path: str) -> list[tuple[datetime, int]]:
    out = []
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) < 4:
            continue
        try:
            t = datetime.strptime(f"{parts[0]} {parts[1]}", FMT)
            out.append((t, int(parts[3])))
        except ValueError:
            continue
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dmon")
    p.add_argument("jsonl")
    p.add_argument("--head", type=float, default=10.0)
    p.add_argument("--tail", type=float, default=0.3)
    p.add_argument("--busy", type=int, default=50)
    args = p.parse_args()
    sm = read_dmon(args.dmon)
    if not sm:
        raise SystemExit(f"{args.dmon}: no timed lines (dmon without -o DT?)")
    for line in Path(args.jsonl).read_text().splitlines():
        row = json.loads(line)
        if "started" not in row:
            continue
        t0 = datetime.strptime(row["started"], FMT)
        t1 = datetime.strptime(row["ended"], FMT)
        run = [(t, v) for t, v in sm if t0 <= t <= t1]
        span = (t1 - t0).total_seconds()
        busy = next(
            (
                (run[i][0] - t0).total_seconds()
                for i in range(len(run))
                if all(v >= args.busy for _, v in run[i : i + 5])
            ),
            None,
        )
        means = [
            round(statistics.mean(v for _, v in run[i : i + 5]))
            for i in range(0, len(run), 5)
        ]
        label = f"{row['model']} {row['workload']} rate {row['rate']}"
        if row.get("max_concurrency"):
            label += f"@{row['max_concurrency']}"
        print(f"{label}: {span:.0f} s, {row['output_tok_s']:.0f} out tok/s")
        print(f"  SM% 5-s means: {means}")
        if busy is None:
            print(f"  no 5-s stretch at SM >= {args.busy}%: no decode window")
            continue
        lo, hi = busy + args.head, span * (1 - args.tail)
        decode = [v for t, v in run if lo <= (t - t0).total_seconds() <= hi]
        if decode:
            print(
                f"  decode phase ({lo:.0f}-{hi:.0f} s): SM mean "
                f"{statistics.mean(decode):.1f}%, median "
                f"{statistics.median(decode):.0f}%, "
                f"{sum(v >= 90 for v in decode) / len(decode):.0%} of seconds >= 90%"
            )


if __name__ == "__main__":
    main()
