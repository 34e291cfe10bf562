#!/usr/bin/env python3
"""What the Python binding adds per operation: synchronous 64 B and 4 KiB host-memory writes between two
endpoints of one process, from Python (`ep.write`) and from C++ (tests/python/op_latency.cc, the same calls on
TransferEngine), against one podlinkd. A benchmark: it reports, it asserts nothing.

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
        p = next(x for x in py if x["bytes"] == c["bytes"])
        print(f"| {c['bytes']} | {c['us_per_op']:.2f} | {p['us_per_op']:.2f} | {p['us_per_op'] - c['us_per_op']:.2f} |")


if __name__ == "__main__":
    main()
