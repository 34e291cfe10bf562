#!/usr/bin/env python3
"""Host memory as the application has it against podlink's memfd memory: writes and reads between two endpoints
of one process against one podlinkd, per source and destination kind (memfd: `alloc_host`, mapped by the peer or
copied by the relay; numpy: process memory, read and written by podlinkd through /proc/<pid>/mem), at sizes from
4 KiB to 64 MiB, every result checked. A benchmark: it reports (JSON lines, then a table made from them), it
asserts only that the bytes arrived.

    PODLINK_SOCKET_DIR=... PYTHONPATH=build/python python3 tests/python/bench_host_memory.py [MAX_MIB] > raw.jsonl
"""
import json
import sys
import time

import numpy as np

import podlink

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def memory(ep, kind, n):
    return ep.alloc_host(n) if kind == "memfd" else np.zeros(n, dtype=np.uint8)


def case(src_kind, dst_kind, force_relay, max_bytes, results):
    sizes = [s for s in SIZES if s <= max_bytes]
    n = sizes[-1]
    with podlink.Endpoint() as owner, podlink.Endpoint(force_relay=force_relay) as writer:
        dst = memory(owner, dst_kind, n)
        remote = writer.open(owner.describe(owner.reg(dst)))
        src = memory(writer, src_kind, n)
        src[:] = (np.arange(n, dtype=np.uint64) % 251).astype(np.uint8)
        local = writer.reg(src)
        for size in sizes:
            iters = max(3, min(1000, (256 << 20) // size))
            for op in ("write", "read"):
                fn = writer.write if op == "write" else writer.read
                if op == "read":
                    dst[:size] = np.flip(src[:size])  # what the read must bring back
                fn(local, remote, length=size)  # warm-up, checked
                want = src[:size] if op == "write" else dst[:size]
                got = dst[:size] if op == "write" else src[:size]
                if not np.array_equal(got, want):
                    raise SystemExit(f"{src_kind}->{dst_kind} {op} {size}: bytes differ")
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn(local, remote, length=size)
                dt = time.perf_counter() - t0
                rec = {"local": src_kind, "remote": dst_kind, "transport": remote.transport, "op": op,
                       "bytes": size, "iters": iters, "gbps": size * iters / dt / 1e9,
                       "us_per_op": dt / iters * 1e6}
                print(json.dumps(rec), flush=True)
                results.append(rec)
                if op == "read":
                    src[:size] = (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)


def main():
    max_bytes = (int(sys.argv[1]) if len(sys.argv) > 1 else 64) << 20
    results = []
    for src_kind, dst_kind, relay in (("memfd", "memfd", False), ("memfd", "memfd", True),
                                      ("numpy", "memfd", False), ("numpy", "memfd", True),
                                      ("memfd", "numpy", False), ("numpy", "numpy", False)):
        case(src_kind, dst_kind, relay, max_bytes, results)
    # The table, from the records above.
    sizes = sorted({r["bytes"] for r in results})
    head = "| local → remote | transport | op | " + " | ".join(f"{s >> 10} KiB" if s < (1 << 20) else
                                                          f"{s >> 20} MiB" for s in sizes) + " |"
    print(head, file=sys.stderr)
    print("|" + "---|" * (3 + len(sizes)), file=sys.stderr)
    keys = []
    for r in results:
        k = (r["local"], r["remote"], r["transport"], r["op"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        row = {r["bytes"]: r["gbps"] for r in results if (r["local"], r["remote"], r["transport"], r["op"]) == k}
        print(f"| {k[0]} → {k[1]} | {k[2]} | {k[3]} | " + " | ".join(f"{row[s]:.2f}" if s in row else "-"
                                                                   for s in sizes) + " |", file=sys.stderr)
    print("(GB/s)", file=sys.stderr)


if __name__ == "__main__":
    main()
