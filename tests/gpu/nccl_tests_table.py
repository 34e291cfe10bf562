#!/usr/bin/env python3
"""The table of a tests/gpu/nccl_tests.sh run, generated from its raw output.

    python3 tests/gpu/nccl_tests_table.py OUT_DIR [--setups a,b,...] [--colls x,y,...]

Reads OUT_DIR/setups.txt and, per setup, args.txt, colls.txt, <coll>.rc and
rank 0's nccl-tests output (<coll>.rank0.log). Prints one markdown table per
collective: out-of-place bus bandwidth (GB/s) from 1 MiB, time per operation
(us) below, with ratios to the base setup (for times: base time / time, so
above 1 is faster either way), then the issue's targets as measured. Exits 1 when a rank failed, a
result was wrong or unchecked (#wrong not 0), or a size that the arguments
ask for is missing: a benchmark reports, the checks decide.
"""
import json
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


def parse_log(path, want=None):
    """{size: (time_us, busbw, wrong)} of the out-of-place columns; wrong is an int, or None when unchecked.
    NCCL's own log lines go to a file of their own (NCCL_DEBUG_FILE): interleaved, they split rows.
    nccl-tests prints one row per size asked for, but rounds a size down to whole elements per rank (with 2
    ranks, all_gather's and reduce_scatter's 8 and 16 B rows print as 0 B, alltoall's 16 B as 0 B): when
    there are exactly as many rows as sizes in `want`, each row is taken as the size asked for in order."""
    rows = {}
    if not os.path.exists(path):
        return rows
    ordered = []
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
        ordered.append((size, rows[size]))
    if want and len(ordered) == len(want) and all(p <= w for (p, _), w in zip(ordered, want)):
        return {w: r for (_, r), w in zip(ordered, want)}
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
            rows = parse_log(os.path.join(d, f"{c}.rank0.log"), want)  # each size asked for: checked?
            # Shown by the size nccl-tests ran (its 0-byte rows, sizes it rounded to nothing, left out).
            data[(s, c)] = {k: v for k, v in parse_log(os.path.join(d, f"{c}.rank0.log")).items() if k > 0}
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
    print(f"# nccl-tests between two pods, from {out}")
    print()
    print("Out-of-place: bus bandwidth (GB/s) from 1 MiB, time per operation (us) below 1 MiB; ratios are to "
          f"{base} (bandwidth / {base}'s, or {base}'s time / time: above 1 is faster).")
    print()
    head = ["collective", "size", "unit"] + setups + [f"{s}/{base}" for s in ratio_of]
    if "plugin" in setups and "direct" in setups:
        head.append("direct/plugin")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))

    def bw(s, c, size):
        r = data.get((s, c), {}).get(size)
        return r[1] if r else None

    def us(s, c, size):
        r = data.get((s, c), {}).get(size)
        return r[0] if r else None

    def speed(s, c, size):
        """Bandwidth from 1 MiB, else 1/time: ratios of it compare like with like."""
        if size >= (1 << 20):
            return bw(s, c, size)
        t = us(s, c, size)
        return 1.0 / t if t else None

    for c in colls:
        sizes = sorted(set().union(*[data.get((s, c), {}).keys() for s in setups]))
        for size in sizes:
            small = size < (1 << 20)
            cells = [c, human(size), "us" if small else "GB/s"]
            for s in setups:
                v = us(s, c, size) if small else bw(s, c, size)
                cells.append("-" if v is None else f"{v:.1f}")
            n = speed(base, c, size)
            for s in ratio_of:
                v = speed(s, c, size)
                cells.append(f"{v / n:.2f}" if v is not None and n else "-")
            if "plugin" in setups and "direct" in setups:
                p, dct = speed("plugin", c, size), speed("direct", c, size)
                cells.append(f"{dct / p:.2f}" if p and dct is not None else "-")
            print("| " + " | ".join(cells) + " |")

    # The KV hand-off (tests/gpu/kv_handoff.py), where it ran: GB/s per block size.
    # The same hand-off one-sided through `import podlink` (kvpl: tests/gpu/kv_compare.sh, rounds of
    # kv_podlink.py and of podlink-bench --kv-open) is the column "<setup> podlink" and, in C++, "<setup> podlink
    # c++": the median of the rounds, and their ratio (what the binding costs).
    kv = {}
    rounds = {}
    columns = []
    for s in setups:
        for run in ("kv", "kvpl"):
            path = os.path.join(out, s, f"{run}.rank1.log")
            if not os.path.exists(os.path.join(out, s, f"{run}.rc")):
                continue
            rc = open(os.path.join(out, s, f"{run}.rc")).read().strip()
            if rc != "0":
                problems.append(f"{s}/{run}: a rank exited {rc}")
            seen = 0
            for line in open(path, errors="replace") if os.path.exists(path) else []:
                if line.startswith("{"):
                    r = json.loads(line)
                    seen += 1
                    col = s if run == "kv" else f"{s} podlink" + (" c++" if r.get("impl") == "c++" else "")
                    if col not in columns:
                        columns.append(col)
                    rounds.setdefault((col, r["block"]), []).append(r)
                    if r["wrong"] != 0 or r["checked"] != r["blocks"]:
                        problems.append(f"{s}/{run}: {r['wrong']} wrong blocks of {human(r['block'])}")
            if not seen:
                problems.append(f"{s}/{run}: no result")
    for key, rs in rounds.items():
        g = sorted(r["gbps"] for r in rs)
        kv[key] = dict(rs[0], gbps=(g[(len(g) - 1) // 2] + g[len(g) // 2]) / 2, rounds=len(rs))
    if kv:
        kv_setups = [c for c in columns if any(k[0] == c for k in kv)]
        kv_ratio = [s for s in kv_setups if s != base] if base in kv_setups else []
        binding = [s for s in kv_setups if s.endswith(" podlink") and f"{s} c++" in kv_setups]
        print()
        print("KV hand-off (torch batch_isend_irecv of many blocks into scattered cache blocks, every block "
              "checked): GB/s" + (" (podlink columns: the median of %s rounds)" %
                                  "/".join(sorted({str(v["rounds"]) for k, v in kv.items() if "podlink" in k[0]}))
                                  if any("podlink" in k[0] for k in kv) else ""))
        print()
        head = (["block", "blocks"] + kv_setups + [f"{s}/{base}" for s in kv_ratio] +
                [f"{s} python/c++" for s in binding])
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for size in sorted({k[1] for k in kv}):
            any_r = next(kv[(s, size)] for s in kv_setups if (s, size) in kv)
            cells = [human(size), str(any_r["blocks"])]
            for s in kv_setups:
                cells.append(f"{kv[(s, size)]['gbps']:.1f}" if (s, size) in kv else "-")
            for s in kv_ratio:
                a_, b_ = kv.get((s, size)), kv.get((base, size))
                cells.append(f"{a_['gbps'] / b_['gbps']:.2f}" if a_ and b_ else "-")
            for s in binding:
                a_, b_ = kv.get((s, size)), kv.get((f"{s} c++", size))
                cells.append(f"{a_['gbps'] / b_['gbps']:.2f}" if a_ and b_ else "-")
            print("| " + " | ".join(cells) + " |")

    if "native-pods" in setups and base in setups and base != "native-pods":
        print()
        print(f"native-pods target: >= 0.97 of {base} at every size (bandwidth, or time below 1 MiB):")
        for c in colls:
            ratios = [(size, speed("native-pods", c, size) / speed(base, c, size))
                      for size in sorted(data.get((base, c), {}))
                      if speed("native-pods", c, size) and speed(base, c, size)]
            if not ratios:
                continue
            worst = min(ratios, key=lambda x: x[1])
            under = [f"{human(sz)} {r:.2f}" for sz, r in ratios if r < 0.97]
            print(f"- {c}: lowest {worst[1]:.2f} at {human(worst[0])}; "
                  f"{'met at every size' if not under else 'under 0.97 at ' + ', '.join(under)}")
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
        for c, goal in (("sendrecv", 16.0), ("all_reduce", 30.0)):
            t = us("plugin", c, 8)
            if t:
                verdict = "met" if t <= goal else f"missed by {t - goal:.1f} us"
                print(f"- {c} 8 B <= {goal:.0f} us: {t:.1f} us (native {us('native', c, 8) or 0:.1f} us): {verdict}")
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
