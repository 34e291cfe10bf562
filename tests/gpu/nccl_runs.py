#!/usr/bin/env python3
"""One line per run (round, setup, collective) of repeated tests/gpu/nccl_tests.sh runs: the run's median time per
operation over its sizes below 4 KiB, from raw output. Small-message times on the test machine fall into states a
whole run keeps (about 6.5 or about 9.3 us per operation on 2x H200, 2026-11-27) whatever the setup, so a ratio of
medians over few rounds reflects which runs landed in which state; this shows it.

    python3 tests/gpu/nccl_runs.py ROUND_DIR...
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nccl_tests_table import parse_log  # noqa: E402


def main():
    print("| round | setup | collective | median us, sizes below 4 KiB | runs of 4 KiB and below |")
    print("|---|---|---|---|---|")
    for d in sys.argv[1:]:
        setups = open(os.path.join(d, "setups.txt")).read().split()
        for s in setups:
            colls = open(os.path.join(d, s, "colls.txt")).read().split()
            for c in colls:
                rows = parse_log(os.path.join(d, s, f"{c}.rank0.log"))
                t = [v[0] for k, v in rows.items() if 0 < k < 4096]
                if t:
                    print(f"| {os.path.basename(d.rstrip('/'))} | {s} | {c} | {statistics.median(t):.1f} | {len(t)} |")


if __name__ == "__main__":
    main()
