#!/usr/bin/env python3
"""The KV hand-off of tests/gpu/kv_handoff.py, one-sided through `import podlink` instead of NCCL.

Two ranks (PMI_RANK: 0 = decode, the owner; 1 = prefill, the writer), each in its own pod with podlinkd's socket
(PODLINK_SOCKET_DIR). Decode exports a paged cache twice the blocks' size on its GPU by name; prefill opens it by
name, then for each block size writes N scattered blocks with one writev, KV_ITERS times after a warm-up, reads
them back and compares every block. Rank 1 prints one JSON line per size: {"block", "blocks", "gbps",
"checked", "wrong", "transport"} (the format of kv_handoff.py's). Exits 1 on a wrong block.

    KV_BLOCKS="16K:4096,64K:2048,256K:1024,1M:256,4M:64" KV_ITERS=10 python3 kv_podlink.py
"""
import json
import os
import sys
import time

import torch

import podlink


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def kv_block_ids(block, n):
    """The first n of a Fisher-Yates shuffle of range(2n) driven by splitmix64 seeded with `block` (podlink-bench's
    KvBlockIds computes the same list)."""
    m = (1 << 64) - 1
    x = block
    ids = list(range(2 * n))
    for i in range(2 * n - 1, 0, -1):
        x = (x + 0x9E3779B97F4A7C15) & m
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        z ^= z >> 31
        j = z % (i + 1)
        ids[i], ids[j] = ids[j], ids[i]
    return ids[:n]


def main():
    rank = int(os.environ.get("PMI_RANK", "0"))
    dev = int(os.environ.get("KV_DEVICE", "0"))
    spec = [tuple(x.split(":")) for x in os.environ.get("KV_BLOCKS", "16K:4096,64K:2048,256K:1024,1M:256,4M:64")
            .split(",") if x]  # none: rank 1 only opens the cache and notifies
    iters = int(os.environ.get("KV_ITERS", "10"))
    name = os.environ.get("KV_NAME", "kv-bench")
    torch.cuda.set_device(dev)
    ep = podlink.Endpoint(gpu=dev)
    if rank == 0:
        largest = max(parse_size(s) * int(n) for s, n in spec or [("4K", "1")])
        cache = ep.alloc_gpu(2 * largest, gpu=dev)
        region = ep.reg(cache, name=name)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if any(v == 0xD0E for r, v in ep.notifications() if r is not None and r.export_id == region.export_id):
                break
            time.sleep(0.01)
        ep.close()
        return 0
    remote = ep.wait_for(name, timeout=120)
    bad = 0
    for size_s, n_s in spec:
        block, n = parse_size(size_s), int(n_s)
        src = ep.alloc_gpu(n * block, gpu=dev)
        src.copy_(torch.randint(0, 255, (n * block,), dtype=torch.uint8, device=src.device))
        back = ep.alloc_gpu(n * block, gpu=dev)
        local, back_region = ep.reg(src), ep.reg(back)
        ids = kv_block_ids(block, n)
        ops = [(local, i * block, remote, bid * block, block) for i, bid in enumerate(ids)]
        ep.writev(ops)  # warm-up
        t0 = time.perf_counter()
        for _ in range(iters):
            ep.writev(ops)
        secs = time.perf_counter() - t0
        ep.readv([(back_region, i * block, remote, bid * block, block) for i, bid in enumerate(ids)])
        wrong = int((back.view(n, block) != src.view(n, block)).any(dim=1).sum())
        bad += wrong
        print(json.dumps({"impl": "python", "block": block, "blocks": n, "iters": iters, "gbps": n * block * iters / secs / 1e9,
                          "checked": n, "wrong": wrong, "transport": remote.transport}), flush=True)
        ep.unreg(local)
        ep.unreg(back_region)
    if os.environ.get("KV_NOTIFY", "1") != "0":
        ep.notify(remote, 0xD0E)
    ep.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
