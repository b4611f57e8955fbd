# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Helper of vllm_test_diff.sh.

As a pytest plugin (`-p vllm_test_diff`): a test (setup, call and teardown)
still running after $VLLM_TEST_DIFF_LIMIT seconds (default 120) gets a
TimeoutError from SIGALRM.

`python3 vllm_test_diff.py report RUN ENTRY...`: reads RUN/{pristine,patched}/
NN.xml (junit, xunit1; NN = the entry's 1-based index), prints per entry the
passed/failed/error/skipped counts of each tree, then each test whose outcome
differs, then the tests only the patched tree has. Exit 1 if a test passed on
pristine and failed, errored or is absent on patched.
"""

import os
import signal
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

LIMIT = int(os.environ.get("VLLM_TEST_DIFF_LIMIT", "120"))
RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
ORDER = ("passed", "failed", "error", "skipped")


def _alarm(signum, frame):
    raise TimeoutError(f"vllm_test_diff: test ran over {LIMIT} s")


def pytest_runtest_logstart(nodeid, location):
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT)


def pytest_runtest_logfinish(nodeid, location):
    signal.alarm(0)


def outcomes(xml: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    if not xml.is_file():
        return found
    for case in ET.parse(xml).iter("testcase"):
        path, cls = case.get("file"), case.get("classname", "")
        if path:
            module = path.removesuffix(".py").replace("/", ".")
            cls = cls[len(module) + 1 :] if cls.startswith(module) else cls
            test = "::".join(p for p in (path, cls, case.get("name")) if p)
        else:  # a collection error
            test = f"{cls}::{case.get('name')}".strip(":")
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        kind = {"failure": "failed", "error": "error", "skipped": "skipped"}
        outcome = max([kind[k] for k in kinds] or ["passed"], key=RANK.get)
        if test not in found or RANK[outcome] > RANK[found[test]]:
            found[test] = outcome
    return found


def report(run: Path, entries: list[str]) -> int:
    diffs, new, regressions = [], [], 0
    print(f"{'entry':58} pristine p/f/e/s    patched p/f/e/s")
    for i, entry in enumerate(entries, 1):
        pri, pat = (outcomes(run / t / f"{i:02d}.xml") for t in ("pristine", "patched"))
        counts = []
        for tree in (pri, pat):
            c = Counter(tree.values())
            counts.append("/".join(str(c[k]) for k in ORDER))
        print(f"{entry:58} {counts[0]:19} {counts[1]}")
        for test in sorted(pri.keys() | pat.keys()):
            before, after = pri.get(test, "absent"), pat.get(test, "absent")
            if before == "absent":
                new.append(f"{test} {after}")
            elif before != after:
                diffs.append(f"{test} {before} -> {after}")
                regressions += before == "passed" and after != "skipped"
    print(f"\n{len(diffs)} tests differ ({regressions} passed on pristine only):")
    print("\n".join(f"  {d}" for d in diffs))
    print(f"\n{len(new)} tests only on patched:")
    print("\n".join(f"  {n}" for n in new))
    return 1 if regressions else 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "report":
        sys.exit("usage: vllm_test_diff.py report RUN ENTRY...")
    sys.exit(report(Path(sys.argv[2]), sys.argv[3:]))
