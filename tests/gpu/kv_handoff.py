#!/usr/bin/env python3
"""The prefill -> decode KV-cache hand-off through torch.distributed NCCL.

Two ranks (PMI_RANK/PMI_SIZE or RANK/WORLD_SIZE, MASTER_ADDR/MASTER_PORT):
rank 0 (prefill) sends N blocks of each block size in one batch_isend_irecv;
rank 1 (decode) receives them into scattered blocks of a paged cache twice
as large (block ids shuffled, as a paged KV cache hands them out). Each size
is timed over KV_ITERS batches after a warm-up, then every received block is
checked against what the sender wrote. One JSON line per size on stdout from
rank 1: {"block": bytes, "blocks": N, "gbps": ..., "checked": N, "wrong": W}.
Exits 1 when any block is wrong.

    KV_BLOCKS="16K:4096,64K:2048,256K:1024,1M:256,4M:64" KV_ITERS=10 python3 kv_handoff.py
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    rank = int(os.environ.get("PMI_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("PMI_SIZE", os.environ.get("WORLD_SIZE", "2")))
    os.environ.setdefault("MASTER_PORT", "29500")
    dev = int(os.environ.get("KV_DEVICE", rank))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, init_method="env://",
                            device_id=torch.device("cuda", dev))
    spec = os.environ.get("KV_BLOCKS", "16K:4096,64K:2048,256K:1024,1M:256,4M:64")
    iters = int(os.environ.get("KV_ITERS", "10"))
    bad = 0
    for item in spec.split(","):
        size_s, n_s = item.split(":")
        size, n = parse_size(size_s), int(n_s)
        g = torch.Generator().manual_seed(size)
        ids = torch.randperm(2 * n, generator=g)[:n].tolist()  # the decode side's block ids
        if rank == 0:
            blocks = torch.empty((n, size), dtype=torch.uint8, device="cuda")
            base = torch.arange(size, dtype=torch.int64, device="cuda")
            for i in range(n):
                blocks[i] = ((base + i * 7 + size) % 251).to(torch.uint8)
            ops = [dist.P2POp(dist.isend, blocks[i], 1) for i in range(n)]
        else:
            cache = torch.zeros((2 * n, size), dtype=torch.uint8, device="cuda")
            ops = [dist.P2POp(dist.irecv, cache[ids[i]], 0) for i in range(n)]

        def batch():
            for w in dist.batch_isend_irecv(ops):
                w.wait()

        batch()  # warm-up (and connections)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            batch()
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        if rank == 1:
            base = torch.arange(size, dtype=torch.int64, device="cuda")
            wrong = 0
            for i in range(n):
                want = ((base + i * 7 + size) % 251).to(torch.uint8)
                if not torch.equal(cache[ids[i]], want):
                    wrong += 1
            bad += wrong
            print(json.dumps({"block": size, "blocks": n, "iters": iters, "gbps": n * size * iters / secs / 1e9,
                              "checked": n, "wrong": wrong}), flush=True)
        dist.barrier()
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
