#!/usr/bin/env python3
"""Where the time of an NCCL step goes, from the plugin's step trace.

    python3 tests/gpu/nccl_steps.py DIR [DIR...]

DIR holds the podlink-steps.*.tsv files that PODLINK_NCCL_STEP_TRACE=DIR made
(client-lib/nccl/step_trace.h) in the pods of one run. A send and the receive
it filled are joined by (connection, sequence, buffer index). For each send
size, the median and 90th percentile (microseconds) of:

  wait      sender: NCCL first asked to send -> the receiver's clear-to-send was there
  submit    sender: accepted -> the copy queued on the relay ring
  relay     sender: queued -> test() saw the relay's completion (podlinkd
            picks it up, the copy engine copies, the completion comes back)
  notice    the sender's test() saw the completion -> the receiver's test() saw it
  recv      receiver: clear-to-send published -> test() saw the data there
  gap       sender: one step accepted -> the next accepted, same connection
            (1 / step rate; the bytes of one step over it is the connection's rate)
"""
import collections
import glob
import os
import statistics
import sys


def load(dirs):
    sends, recvs = {}, {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "podlink-steps.*.tsv"))):
            with open(path) as f:
                header = f.readline().rstrip("\n").split("\t")
                for line in f:
                    v = dict(zip(header, line.rstrip("\n").split("\t")))
                    if len(v) != len(header):
                        continue
                    key = (d, int(v["conn"]), int(v["seq"]), int(v["index"]))
                    row = {k: int(v[k]) for k in ("size", "t_try", "t_post", "t_submit", "t_done")}
                    (sends if v["kind"] == "s" else recvs)[key] = row
    return sends, recvs


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def main():
    dirs = sys.argv[1:]
    if not dirs:
        print(__doc__)
        return 2
    sends, recvs = load(dirs)
    if not sends:
        print("no send steps in", ", ".join(dirs))
        return 1
    by_size = collections.defaultdict(lambda: collections.defaultdict(list))
    last_post = {}
    for key in sorted(sends, key=lambda k: (k[0], k[1], sends[k]["t_post"])):
        s = sends[key]
        b = by_size[s["size"]]
        b["wait"].append(s["t_post"] - s["t_try"])
        b["submit"].append(s["t_submit"] - s["t_post"])
        b["relay"].append(s["t_done"] - s["t_submit"])
        conn = key[:2]
        if conn in last_post:
            b["gap"].append(s["t_post"] - last_post[conn])
        last_post[conn] = s["t_post"]
        r = recvs.get(key)
        if r is not None:
            b["notice"].append(r["t_done"] - s["t_done"])
            b["recv"].append(r["t_done"] - r["t_post"])
    cols = ["wait", "submit", "relay", "notice", "recv", "gap"]
    print(f"steps: {len(sends)} sends, {len(recvs)} receive buffers, from {', '.join(dirs)}")
    print("microseconds, median / p90 per send size")
    print()
    print("| send size | steps | " + " | ".join(cols) + " | bytes/gap (GB/s) |")
    print("|---|---|" + "---|" * len(cols) + "---|")
    for size in sorted(by_size):
        b = by_size[size]
        cells = []
        for c in cols:
            m, p = pct(b[c], 0.5), pct(b[c], 0.9)
            cells.append("-" if m is None else f"{m / 1e3:.1f} / {p / 1e3:.1f}")
        gap = pct(b["gap"], 0.5)
        rate = f"{size / gap:.1f}" if gap else "-"
        print(f"| {human(size)} | {len(b['submit'])} | " + " | ".join(cells) + f" | {rate} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
