#!/usr/bin/env python3
"""Medians over repeated tests/gpu/nccl_tests.sh runs (rounds), from their raw output.

    python3 tests/gpu/nccl_rounds_table.py --base native --setup native-pods OUT_1 OUT_2 ...

Small messages vary from run to run by more than the difference being measured (a process's per-operation
time on the same machine moves by 1-3 us between runs), so one run per setup cannot tell 0.97 from 0.80.
Run the setups alternately several times and compare medians: this prints, per collective and size, the
median time (us, below 1 MiB) or bus bandwidth (GB/s) of each setup over the rounds, the ratio of the
medians, and the spread (lowest and highest ratio of one round's pair), then the KV hand-off the same way.
Each round's own checks are nccl_tests_table.py's; this script exits 1 when a round lacks a result.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nccl_tests_table import expected_sizes, human, parse_log  # noqa: E402


def load(out, setup):
    d = os.path.join(out, setup)
    args = open(os.path.join(d, "args.txt")).read()
    want = expected_sizes(args)
    colls = open(os.path.join(d, "colls.txt")).read().split()
    # By the size nccl-tests ran (its 0-byte rows left out); each round's checks are nccl_tests_table.py's.
    data = {c: {k: v for k, v in parse_log(os.path.join(d, f"{c}.rank0.log")).items() if k > 0} for c in colls}
    kv = {}
    path = os.path.join(d, "kv.rank1.log")
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            if line.startswith("{"):
                r = json.loads(line)
                kv[r["block"]] = r
    return colls, want, data, kv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="native")
    ap.add_argument("--setup", default="native-pods")
    ap.add_argument("outs", nargs="+")
    a = ap.parse_args()
    rounds = [(load(o, a.base), load(o, a.setup)) for o in a.outs]
    colls, want = rounds[0][0][0], rounds[0][0][1]
    missing = []
    print(f"# {a.setup} against {a.base}: medians over {len(rounds)} alternating rounds ({', '.join(a.outs)})")
    print()
    print(f"| collective | size | unit | {a.base} | {a.setup} | ratio of medians | lowest round | highest round |")
    print("|---|---|---|---|---|---|---|---|")
    worst = {}
    for c in colls:
        sizes = sorted(set().union(*[r[0][2].get(c, {}).keys() for r in rounds]))
        for size in sizes:
            small = size < (1 << 20)
            vals_b, vals_s, pair = [], [], []
            for (cb, wb, db, _), (cs, ws, ds, _) in rounds:
                rb, rs = db.get(c, {}).get(size), ds.get(c, {}).get(size)
                if rb is None or rs is None:
                    missing.append(f"{c} {human(size)}")
                    continue
                vb, vs = (rb[0], rs[0]) if small else (rb[1], rs[1])
                vals_b.append(vb)
                vals_s.append(vs)
                if vb > 0 and vs > 0:
                    pair.append(vb / vs if small else vs / vb)
            if not vals_b or not pair:
                continue
            mb, ms = statistics.median(vals_b), statistics.median(vals_s)
            if mb <= 0 or ms <= 0:
                continue  # nccl-tests' 0-byte rows
            ratio = mb / ms if small else ms / mb
            worst[c] = min(worst.get(c, (9, 0)), (ratio, size))
            print(f"| {c} | {human(size)} | {'us' if small else 'GB/s'} | {mb:.1f} | {ms:.1f} | {ratio:.2f} | "
                  f"{min(pair):.2f} | {max(pair):.2f} |")
    kvb = [r[0][3] for r in rounds]
    kvs = [r[1][3] for r in rounds]
    if any(kvb) and any(kvs):
        print()
        print(f"KV hand-off, GB/s (median over rounds): block | {a.base} | {a.setup} | ratio of medians")
        print()
        print(f"| block | {a.base} | {a.setup} | ratio | lowest round | highest round |")
        print("|---|---|---|---|---|---|")
        for block in sorted(set().union(*[k.keys() for k in kvb])):
            b = [k[block]["gbps"] for k in kvb if block in k]
            s = [k[block]["gbps"] for k in kvs if block in k]
            pair = [y["gbps"] / x["gbps"] for x, y in ((kb.get(block), ks.get(block)) for kb, ks in zip(kvb, kvs))
                    if x and y]
            if b and s and pair:
                r = statistics.median(s) / statistics.median(b)
                worst["kv"] = min(worst.get("kv", (9, 0)), (r, block))
                print(f"| {human(block)} | {statistics.median(b):.1f} | {statistics.median(s):.1f} | {r:.2f} | "
                      f"{min(pair):.2f} | {max(pair):.2f} |")
    print()
    print("lowest ratio of medians per collective (target >= 0.97):")
    for c, (r, size) in worst.items():
        print(f"- {c}: {r:.2f} at {human(size)}: {'met' if r >= 0.97 else 'missed by %.2f' % (0.97 - r)}")
    if missing:
        print("missing: " + ", ".join(sorted(set(missing))))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
