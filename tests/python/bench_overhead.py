#!/usr/bin/env python3
"""What the Python binding adds per operation: synchronous 64 B and 4 KiB host-memory writes between two
endpoints of one process, from Python (`ep.write`) and from C++ (tests/python/op_latency.cc, the same calls on
TransferEngine), against one podlinkd; and a writev of 4096 scattered 16 B operations (as a KV hand-off writes
blocks), from a list each call, from a batch made once with `ep.prepare`, and from C++. A benchmark: it reports,
it asserts nothing.

    PODLINK_SOCKET_DIR=... PYTHONPATH=build/python python3 tests/python/bench_overhead.py build/tests/op_latency [OPS]
"""
import json
import subprocess
import sys
import time

import podlink


def python_side(ops):
    out = []
    with podlink.Endpoint() as owner, podlink.Endpoint() as writer:
        remote = writer.open(owner.describe(owner.reg(owner.alloc_host(1 << 16))))
        local = writer.reg(writer.alloc_host(1 << 16))
        for nbytes in (64, 4096):
            for _ in range(1000):
                writer.write(local, remote, length=nbytes)
            t0 = time.perf_counter()
            for _ in range(ops):
                writer.write(local, remote, length=nbytes)
            out.append({"api": "python", "bytes": nbytes, "ops": ops,
                        "us_per_op": (time.perf_counter() - t0) / ops * 1e6})
        batch = [(local, i * 16, remote, i * 32 % (1 << 16), 16) for i in range(4096)]
        calls = ops // 100 + 1
        for api, arg in (("python", batch), ("python prepared", writer.prepare(batch))):
            for _ in range(20):
                writer.writev(arg)
            t0 = time.perf_counter()
            for _ in range(calls):
                writer.writev(arg)
            out.append({"api": api, "call": "writev", "bytes": 16, "batch": len(batch),
                        "us_per_op": (time.perf_counter() - t0) / calls / len(batch) * 1e6})
    return out


def main():
    tool, ops = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    cpp = [json.loads(l) for l in subprocess.run([tool, str(ops)], capture_output=True, text=True,
                                                 check=True).stdout.splitlines() if l.startswith("{")]
    py = python_side(ops)
    for r in cpp + py:
        print(json.dumps(r))
    print()
    print("| bytes | C++ us/op | Python us/op | added by the binding us |")
    print("|---|---|---|---|")
    for c in cpp:
        if "call" in c:
            continue
        p = next(x for x in py if x["bytes"] == c["bytes"] and "call" not in x)
        print(f"| {c['bytes']} | {c['us_per_op']:.2f} | {p['us_per_op']:.2f} | {p['us_per_op'] - c['us_per_op']:.2f} |")
    print()
    print("writev of 4096 scattered 16 B operations, per operation:")
    print()
    print("| caller | us/op | added over C++ us/op |")
    print("|---|---|---|")
    c = next(x for x in cpp if x.get("call") == "writev")
    for r in [c] + [x for x in py if x.get("call") == "writev"]:
        print(f"| {r['api']} | {r['us_per_op']:.3f} | {r['us_per_op'] - c['us_per_op']:.3f} |")


if __name__ == "__main__":
    main()
