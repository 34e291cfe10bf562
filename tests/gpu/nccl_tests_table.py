#!/usr/bin/env python3
"""The table of a tests/gpu/nccl_tests.sh run, generated from its raw output.

    python3 tests/gpu/nccl_tests_table.py OUT_DIR [--setups a,b,...] [--colls x,y,...]

Reads OUT_DIR/setups.txt and, per setup, args.txt, colls.txt, <coll>.rc and
rank 0's nccl-tests output (<coll>.rank0.log). Prints one markdown table of
out-of-place bus bandwidth (GB/s) per collective and size, with ratios to
native, then the issue's targets as measured. Exits 1 when a rank failed, a
result was wrong or unchecked (#wrong not 0), or a size that the arguments
ask for is missing: a benchmark reports, the checks decide.
"""
import os
import re
import sys

SIZE = re.compile(r"^(\d+)([KMG]?)$")


def parse_size(text):
    m = SIZE.match(text)
    if not m:
        raise ValueError(f"size {text!r}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def expected_sizes(args):
    """The sizes nccl-tests runs for -b/-e/-f (a factor of 1 is not used here)."""
    a = args.split()
    b, e, f = parse_size(a[a.index("-b") + 1]), parse_size(a[a.index("-e") + 1]), int(a[a.index("-f") + 1])
    out = []
    while b <= e:
        out.append(b)
        b *= f
    return out


def parse_log(path):
    """{size: (time_us, busbw, wrong)} of the out-of-place columns; wrong is an int, or None when unchecked.
    NCCL's own log lines go to a file of their own (NCCL_DEBUG_FILE): interleaved, they split rows."""
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path, errors="replace"):
        if line.startswith("#"):
            continue
        t = line.split()
        if len(t) != 13 or not t[0].isdigit():
            continue
        size = int(t[0])
        # nccl-tests 2.19 checks the out-of-place result (-c 1) and prints N/A for in-place.
        try:
            wrong = int(t[8]) + (int(t[12]) if t[12] != "N/A" else 0)
        except ValueError:
            wrong = None
        rows[size] = (float(t[5]), float(t[7]), wrong)
    return rows


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--setups", help="only these setups, in this order (checks still cover every setup run)")
    ap.add_argument("--colls", help="only these collectives in the table")
    ap.add_argument("--base", default="native", help="the setup ratios are taken to (default native)")
    a = ap.parse_args()
    out = a.out
    setups = [s.strip() for s in open(os.path.join(out, "setups.txt")) if s.strip()]
    data, problems, colls = {}, [], []
    for s in setups:
        d = os.path.join(out, s)
        args = open(os.path.join(d, "args.txt")).read()
        want = expected_sizes(args)
        for c in open(os.path.join(d, "colls.txt")).read().split():
            if c not in colls:
                colls.append(c)
            rc_path = os.path.join(d, f"{c}.rc")
            rc = open(rc_path).read().strip() if os.path.exists(rc_path) else "not run"
            if rc != "0":
                problems.append(f"{s}/{c}: a rank exited {rc}")
            rows = parse_log(os.path.join(d, f"{c}.rank0.log"))
            data[(s, c)] = rows
            for size in want:
                if size not in rows:
                    problems.append(f"{s}/{c}: no result at {human(size)}")
                elif rows[size][2] is None:
                    problems.append(f"{s}/{c}: {human(size)} was not checked")
                elif rows[size][2] != 0:
                    problems.append(f"{s}/{c}: {rows[size][2]} wrong values at {human(size)}")

    if a.setups:
        setups = [s for s in a.setups.split(",") if s in setups]
    if a.colls:
        colls = [c for c in a.colls.split(",") if c in colls]
    base = a.base
    ratio_of = [s for s in setups if s != base] if base in setups else []
    print(f"# nccl-tests between two pods: out-of-place bus bandwidth (GB/s), from {out}")
    print()
    head = ["collective", "size"] + setups + [f"{s}/{base}" for s in ratio_of]
    if "plugin" in setups and "direct" in setups:
        head.append("direct/plugin")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))

    def bw(s, c, size):
        r = data.get((s, c), {}).get(size)
        return r[1] if r else None

    for c in colls:
        sizes = sorted(set().union(*[data.get((s, c), {}).keys() for s in setups]))
        for size in sizes:
            cells = [c, human(size)]
            for s in setups:
                v = bw(s, c, size)
                cells.append("-" if v is None else f"{v:.1f}")
            n = bw(base, c, size)
            for s in ratio_of:
                v = bw(s, c, size)
                cells.append(f"{v / n:.2f}" if v is not None and n else "-")
            if "plugin" in setups and "direct" in setups:
                p, dct = bw("plugin", c, size), bw("direct", c, size)
                cells.append(f"{dct / p:.2f}" if p and dct is not None else "-")
            print("| " + " | ".join(cells) + " |")

    # The targets, as measured (reported, not asserted).
    targets = [("sendrecv", 64 << 20, 0.80), ("alltoall", 64 << 20, 0.80), ("all_reduce", 256 << 20, 0.90),
               ("all_gather", 256 << 20, 0.90), ("reduce_scatter", 256 << 20, 0.90), ("broadcast", 256 << 20, 0.90)]
    if "plugin" in setups and "native" in setups:
        print()
        print("targets (plugin / native, out-of-place busbw):")
        for c, start, goal in targets:
            ratios = [(size, bw("plugin", c, size) / bw("native", c, size))
                      for size in sorted(data.get(("native", c), {})) if size >= start and bw("plugin", c, size)
                      and bw("native", c, size)]
            if not ratios:
                continue
            worst = min(ratios, key=lambda x: x[1])
            verdict = "met" if worst[1] >= goal else f"missed by {goal - worst[1]:.2f}"
            print(f"- {c} >= {goal:.2f} from {human(start)}: lowest {worst[1]:.2f} at {human(worst[0])}: {verdict}")
        for size, goal in ((1 << 20, 0.50), (16 << 20, 0.70)):
            p, n = bw("plugin", "all_reduce", size), bw("native", "all_reduce", size)
            if p and n:
                r = p / n
                verdict = "met" if r >= goal else f"missed by {goal - r:.2f}"
                print(f"- all_reduce >= {goal:.2f} at {human(size)}: {r:.2f}: {verdict}")
    if "plugin" in setups and "direct" in setups:
        slower = [(c, size) for c in colls for size in sorted(data.get(("plugin", c), {}))
                  if bw("direct", c, size) is not None and bw("direct", c, size) < bw("plugin", c, size)]
        print(f"- direct >= plugin at every size: "
              f"{'met' if not slower else 'missed at ' + ', '.join(f'{c} {human(s)}' for c, s in slower)}")
    print()
    if problems:
        print("FAILED checks:")
        for p in problems:
            print(f"- {p}")
        return 1
    print("checks: every rank exited 0; every size asked for has a result; every result checked, 0 wrong")
    return 0


if __name__ == "__main__":
    sys.exit(main())
