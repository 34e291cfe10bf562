#!/usr/bin/env python3
"""What the plugin's TCP transport carried per all_reduce size, from PODLINK_NCCL_TRACE lines in NCCL's log.

    python3 tcp_trace_summary.py SETUP_DIR [SETUP_DIR...]

SETUP_DIR holds all_reduce.rank0.nccl.log and all_reduce.rank1.nccl.log of a tests/gpu/nccl_tests.sh run with
PODLINK_NCCL_TRACE=N (the plugin logs every isend, irecv, send completion and receive arrival through NCCL's
logger) and NCCL_DEBUG_SUBSYS including TUNING (NCCL logs "AllReduce: <bytes> Bytes -> Algo ..." per operation)
and NCCL_DEBUG_TIMESTAMP_LEVELS=INFO with NCCL_DEBUG_TIMESTAMP_FORMAT='%T.%6f_' (microsecond wall-clock stamps;
both pods share the host's clock). Only rank 0's log has the TUNING line: a send belongs to the batch of operations
(nccl-tests: each size's warm-up, then each size's timed loop, waited for one by one) of rank 0's last enqueue
before it; receives and completions belong to the size of their send. The k-th "connection to" of one rank and the k-th "connection
from" of the other are the two ends of one connection, so a send and its receive are joined by (connection, seq).

Per size and message size (medians, microseconds; each timestamp is taken when the line was logged, so every
interval includes a few microseconds of logging):
  sends/op    messages one rank sent per all_reduce (both channels)
  inline      of those, how many travelled inline on the control socket
  send        sender: isend accepted -> test() saw it done (bytes handed to the kernel's socket)
  transit     sender's isend -> the receiver's test() saw the data there
  turnaround  a rank's receive arrived -> that rank's next isend on the same channel (NCCL's GPU kernel consumed
              the step and produced the next one; the proxy noticed; NCCL called isend)
  op span     one all_reduce's first isend (either rank) to the last arrival of its messages (launching the
              kernel and its first step's production on the GPU are not in it)
"""
import bisect
import collections
import re
import statistics
import sys

TS = r"(\d\d):(\d\d):(\d\d)\.(\d{6})"
LINE = re.compile(TS + r" (\S+) \[\d+\] NCCL INFO (.*)$")
ALLRED = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
CONN = re.compile(r"connection (to|from) (\S+) via TCP")
ISEND = re.compile(r"trace tcp isend (inline )?comm=(\S+) peer=\S+ seq=(\d+) index=\d+ tag=-?\d+ size=(\d+)")
IRECV = re.compile(r"trace tcp irecv comm=(\S+) peer=\S+ seq=(\d+) n=\d+ tag0=-?\d+ size0=(\d+)")
DONE = re.compile(r"trace tcp send done comm=(\S+) seq=(\d+)")
ARRIVED = re.compile(r"trace tcp recv arrived comm=(\S+) seq=(\d+)")


def us(m):
    h, mi, s, f = (int(x) for x in m[:4])
    return ((h * 60 + mi) * 60 + s) * 1_000_000 + f


def parse(path):
    ev = []  # (t, kind, fields)
    conns = {"to": [], "from": []}
    for line in open(path, errors="replace"):
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        t, msg = us(m.groups()), m.group(6)
        if (a := ALLRED.search(msg)):
            ev.append((t, "op", (int(a.group(1)), a.group(2), a.group(3), int(a.group(5)) - int(a.group(4)) + 1)))
        elif (c := CONN.search(msg)):
            conns[c.group(1)].append(c.group(2))
        elif (s := ISEND.search(msg)):
            ev.append((t, "isend", (s.group(2), int(s.group(3)), int(s.group(4)), bool(s.group(1)))))
        elif (r := IRECV.search(msg)):
            ev.append((t, "irecv", (r.group(1), int(r.group(2)), int(r.group(3)))))
        elif (d := DONE.search(msg)):
            ev.append((t, "done", (d.group(1), int(d.group(2)))))
        elif (a := ARRIVED.search(msg)):
            ev.append((t, "arrived", (a.group(1), int(a.group(2)))))
    return ev


def med(v):
    return f"{statistics.median(v):.1f}" if v else "-"


def p90(v):
    if not v:
        return "-"
    v = sorted(v)
    return f"{v[min(len(v) - 1, int(0.9 * (len(v) - 1) + 0.5))]:.1f}"


def human(n):
    return f"{n >> 10} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def summarize(d):
    ranks = [parse(f"{d}/all_reduce.rank{r}.nccl.log") for r in (0, 1)]
    # Comm pointers are per process; name a connection by (sending rank, order of first use by that rank).
    # Sender comm order: first isend seen; receiver comm order: first irecv seen. Both ranks open channel 0
    # first, so the k-th send comm of rank a and the k-th receive comm of rank b are one connection.
    send_order = [[], []]
    recv_order = [[], []]
    for r, ev in enumerate(ranks):
        for t, k, f in ev:
            if k == "isend" and f[0] not in send_order[r]:
                send_order[r].append(f[0])
            if k == "irecv" and f[0] not in recv_order[r]:
                recv_order[r].append(f[0])
    conn_of = {}  # (rank, comm) -> connection id
    for r in (0, 1):
        for i, c in enumerate(send_order[r]):
            conn_of[(r, c)] = (r, i)
        for i, c in enumerate(recv_order[r]):
            conn_of[(r, c)] = (1 - r, i)
    # The size each line belongs to. Only rank 0's log has NCCL's per-operation TUNING line. nccl-tests enqueues
    # a batch of operations of one size (the warm-up of each size, then each size's timed loop) and waits for it
    # before the next: every send and receive of a batch falls between rank 0's first enqueue of that batch and
    # its first enqueue of the next (rank 1 cannot send before rank 0's proxy posted the receive, and rank 0
    # enqueues the next batch only after it received everything of this one). A line belongs to the batch of the
    # last enqueue before it (both pods share the host's clock).
    batches = []  # [start_t, size, ops]
    opinfo = {}
    for t, k, f in ranks[0]:
        if k == "op":
            if not batches or batches[-1][1] != f[0]:
                batches.append([t, f[0], 0])
                opinfo[f[0]] = f[1:]
            batches[-1][2] += 1
    starts = [b[0] for b in batches]

    def batch_of(t):
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 else None

    sends, arrivals, done = {}, {}, {}
    per_rank_sends = collections.defaultdict(list)  # (rank, size) -> [(t, conn, seq, bytes, inline)]
    per_rank_arrivals = collections.defaultdict(list)
    batch_span = collections.defaultdict(lambda: [None, None])  # batch -> [first isend, last arrival]
    nops = collections.Counter()
    for b in batches:
        nops[b[1]] += b[2]
    for r, ev in enumerate(ranks):
        for t, k, f in ev:
            if k != "isend":
                continue
            bi = batch_of(t)
            if bi is None:
                continue
            size = batches[bi][1]
            conn = conn_of[(r, f[0])]
            sends[(conn, f[1])] = (t, f[2], f[3], size, r, bi)
            per_rank_sends[(r, size)].append((t, conn, f[1], f[2], f[3]))
            sp = batch_span[bi]
            sp[0] = t if sp[0] is None else min(sp[0], t)
    for r, ev in enumerate(ranks):
        for t, k, f in ev:
            if k not in ("done", "arrived"):
                continue
            conn = conn_of.get((r, f[0]))
            if (conn, f[1]) not in sends:
                continue
            if k == "done":
                done[(conn, f[1])] = t
            else:
                arrivals[(conn, f[1])] = t
                snd = sends[(conn, f[1])]
                per_rank_arrivals[(r, snd[3])].append((t, conn, f[1]))
                sp = batch_span[snd[5]]
                sp[1] = t if sp[1] is None else max(sp[1], t)
    out = [f"## {d}", "",
           "| all_reduce | NCCL's choice | message | sends/op (per rank) | inline | send us (median / p90) "
           "| transit us (median / p90) | turnaround us (median / p90) |",
           "|---|---|---|---|---|---|---|---|"]
    for size in sorted(opinfo):
        algo, proto, nch = opinfo[size]
        by_msg = collections.defaultdict(lambda: {"n": 0, "inl": 0, "send": [], "transit": [], "turn": []})
        for r in (0, 1):
            for t, conn, seq, b, inl in per_rank_sends[(r, size)]:
                x = by_msg[b]
                x["n"] += 1
                x["inl"] += inl
                if (conn, seq) in done:
                    x["send"].append(done[(conn, seq)] - t)
                if (conn, seq) in arrivals:
                    x["transit"].append(arrivals[(conn, seq)] - t)
            # Turnaround: on this rank, each arrival on channel k -> the next isend of this rank on channel k.
            # Channel k: this rank's receive connection (1-r, k) and send connection (r, k).
            arr = sorted(per_rank_arrivals[(r, size)])
            snd = sorted(per_rank_sends[(r, size)])
            for t, conn, seq in arr:
                k = conn[1]
                nxt = next((s for s in snd if s[0] >= t and s[1] == (r, k)), None)
                if nxt is not None and nxt[0] - t < 100000:
                    by_msg[nxt[3]]["turn"].append(nxt[0] - t)
        for b in sorted(by_msg):
            x = by_msg[b]
            out.append(f"| {human(size)} | {algo} {proto}, {nch} channels | {human(b)} | {x['n'] / 2 / nops[size]:.1f} | "
                       f"{x['inl']}/{x['n']} | {med(x['send'])} / {p90(x['send'])} | {med(x['transit'])} / "
                       f"{p90(x['transit'])} | {med(x['turn'])} / {p90(x['turn'])} |")
    # Op time: a batch's operations run one after another on the stream, each rank sending the same number of
    # messages per operation: operation i of a batch is the i-th group of sends of each rank in it. Its span is
    # its first isend (either rank) to the last arrival of those sends. Only batches of 20 operations or more
    # (each size's timed loops and checks, not its warm-up of 5).
    out.append("")
    out.append("| all_reduce | operations | messages per op (per rank) | wire bytes per op (per rank) | "
               "op span us (median / p90), first isend -> last arrival |")
    out.append("|---|---|---|---|---|")
    for size in sorted(opinfo):
        spans, msgs, wire = [], [], []
        for bi, b in enumerate(batches):
            if b[1] != size or b[2] < 20:
                continue
            per_rank = [sorted((v[0], k) for k, v in sends.items() if v[5] == bi and v[4] == r) for r in (0, 1)]
            if len(per_rank[0]) % b[2] or len(per_rank[1]) != len(per_rank[0]):
                continue
            m = len(per_rank[0]) // b[2]
            for i in range(b[2]):
                group = per_rank[0][i * m:(i + 1) * m] + per_rank[1][i * m:(i + 1) * m]
                arr = [arrivals.get(k) for _, k in group]
                if None in arr:
                    continue
                spans.append(max(arr) - min(t for t, _ in group))
            msgs.append(m)
            wire.append(sum(sends[k][1] for _, k in per_rank[0]) // b[2])
        out.append(f"| {human(size)} | {len(spans)} | {med(msgs)} | {human(int(statistics.median(wire))) if wire else '-'} "
                   f"| {med(spans)} / {p90(spans)} |")
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(summarize(d) for d in sys.argv[1:]))
