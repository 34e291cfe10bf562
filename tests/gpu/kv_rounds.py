#!/usr/bin/env python3
"""Every round of tests/gpu/kv_compare.sh, from its raw output: GB/s per block size for each run of
`import podlink` (python) and of podlink-bench --kv-open (c++), in the order they ran (which went first
alternates between rounds), and the ratio of the two medians.

    python3 tests/gpu/kv_rounds.py OUT/plugin/kvpl.rank1.log

Exits 1 when a run reports a wrong block or the two sides ran different rounds.
"""
import json
import statistics
import sys


def main():
    runs = {}  # block -> [(impl, gbps)] in the order run
    bad = 0
    for line in open(sys.argv[1], errors="replace"):
        if line.startswith("{"):
            r = json.loads(line)
            runs.setdefault(r["block"], []).append((r["impl"], r["gbps"]))
            bad += r["wrong"] != 0
    print("| block | runs, in order (impl GB/s) | python median | c++ median | python/c++ |")
    print("|---|---|---|---|---|")
    for block, rs in sorted(runs.items()):
        py = [g for i, g in rs if i == "python"]
        cc = [g for i, g in rs if i == "c++"]
        if len(py) != len(cc) or not py:
            bad += 1
            continue
        order = ", ".join(f"{i} {g:.1f}" for i, g in rs)
        mp, mc = statistics.median(py), statistics.median(cc)
        size = f"{block >> 20} MiB" if block >= 1 << 20 else f"{block >> 10} KiB"
        print(f"| {size} | {order} | {mp:.1f} | {mc:.1f} | {mp / mc:.2f} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
