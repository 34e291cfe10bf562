#!/usr/bin/env python3
"""The Python binding's KV writev benchmark against NCCL's batch_isend_irecv, from raw output.

    python3 tests/gpu/python_bench_table.py PYTHON_GPU_LOG NCCL_TESTS_OUT [--nccl-setup native]

PYTHON_GPU_LOG: tests/gpu/python_gpu.sh's python_gpu.log ({"bench": ...} lines); NCCL_TESTS_OUT: a
tests/gpu/nccl_tests.sh directory whose setup ran the KV hand-off (<setup>/kv.rank1.log). Prints GB/s per block
size and the ratios; exits 1 when a line reports wrong blocks or a size is missing on either side.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("python_log")
    ap.add_argument("nccl_out")
    ap.add_argument("--nccl-setup", default="native")
    a = ap.parse_args()
    py, bad = {}, []
    for line in open(a.python_log):
        if line.startswith("{"):
            r = json.loads(line)
            py[(r["bench"], r["block"])] = r
            if r["wrong"]:
                bad.append(f"podlink {r['bench']} {r['block']}: {r['wrong']} wrong")
    nccl = {}
    for line in open(os.path.join(a.nccl_out, a.nccl_setup, "kv.rank1.log")):
        if line.startswith("{"):
            r = json.loads(line)
            nccl[r["block"]] = r
            if r["wrong"]:
                bad.append(f"nccl {r['block']}: {r['wrong']} wrong")
    transports = sorted({t for t, _ in py})
    print(f"| block | " + " | ".join(f"podlink {t}" for t in transports) + f" | NCCL {a.nccl_setup} | " +
          " | ".join(f"{t}/NCCL" for t in transports) + " |")
    print("|" + "---|" * (2 + 2 * len(transports)))
    for block in sorted({b for _, b in py}):
        n = nccl.get(block)
        if n is None:
            bad.append(f"no NCCL result for {block}")
        cells = [f"{block >> 10} KiB"]
        cells += [f"{py[(t, block)]['gbps']:.1f}" if (t, block) in py else "-" for t in transports]
        cells.append(f"{n['gbps']:.1f}" if n else "-")
        cells += [f"{py[(t, block)]['gbps'] / n['gbps']:.2f}" if n and (t, block) in py else "-" for t in transports]
        print("| " + " | ".join(cells) + " |")
    if bad:
        print("FAILED: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
