#!/usr/bin/env python3
"""Markdown table from tests/mesh/bench.sh's raw.jsonl: median Gbit/s per case and the ratios the mesh issue
sets targets for (one link / raw TCP, two links / one link, one relay hop / one link)."""
import json
import statistics
import sys


def main(path):
    runs = {}
    for line in open(path):
        line = line.strip()
        if line:
            d = json.loads(line)
            runs.setdefault(d["case"], []).append(d["gbit_per_s"])
    med = {c: statistics.median(v) for c, v in runs.items()}
    print("| case | runs | median Gbit/s | min | max |")
    print("|---|---|---|---|---|")
    for c, v in runs.items():
        print(f"| {c} | {len(v)} | {med[c]:.3f} | {min(v):.3f} | {max(v):.3f} |")

    def ratio(name, num, den, target):
        if num in med and den in med and med[den] > 0:
            r = med[num] / med[den]
            verdict = "met" if r >= target else f"missed by {target - r:.3f}"
            print(f"| {name} | {num} / {den} | {r:.3f} | {target} | {verdict} |")

    print()
    print("| ratio | cases | value | target | |")
    print("|---|---|---|---|---|")
    ratio("one link vs raw TCP (4 conn)", "podlink_1cable", "raw_tcp_1cable_4conn", 0.9)
    ratio("one link vs raw TCP (1 conn)", "podlink_1cable", "raw_tcp_1cable_1conn", 0.9)
    ratio("two links vs one", "podlink_2cables", "podlink_1cable", 1.8)
    ratio("two links vs raw TCP on both", "podlink_2cables", "raw_tcp_2cables_4conn", 0.9)
    ratio("one relay hop vs one link", "podlink_relay", "podlink_1cable", 0.9)
    # Optional in the issue, without a target of its own: a direct cable plus
    # a two-hop route are two links' worth at best (the 1.8 of two cables).
    ratio("direct cable + two-hop route vs one link", "podlink_two_hop", "podlink_1cable", 1.8)


if __name__ == "__main__":
    main(sys.argv[1])
