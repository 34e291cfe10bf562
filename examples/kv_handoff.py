#!/usr/bin/env python3
"""Prefill -> decode KV-cache hand-off with podlink, as a disaggregated-serving engine would do it.

The decode pod owns a paged KV cache: [layers x blocks x block_bytes]. For one request it hands out block ids
(scattered, as a paged allocator does); the prefill pod computes the KV of each layer and writes that layer's
blocks into the decode pod's cache with one writev, then notifies the layer's index. The decode pod checks
every block of each layer as its notification arrives. Both pods must share a podlink.io/peer-group.

    python3 kv_handoff.py decode  --name kv-req-1 [--layers 4 --blocks 1024 --used 256 --block-kib 16 --gpu]
    python3 kv_handoff.py prefill --name kv-req-1 [same sizes]
    python3 kv_handoff.py demo    # both roles in this process (two endpoints), host memory

Host memory without a GPU; with --gpu, GPU memory and torch (the prefill's "KV" is made by a kernel and
written without a synchronize: podlink sends what the current stream's kernels wrote).
"""
import argparse
import sys
import threading
import time

import numpy as np

import podlink


def block_ids(args):
    """The block ids the decode side's allocator handed out for this request (both sides agree by seed)."""
    return np.random.default_rng(args.seed).permutation(args.blocks)[:args.used]


def expected(layer, i, nbytes):
    """What prefill writes into the i-th block of `layer` (a stand-in for real K/V values)."""
    return ((np.arange(nbytes, dtype=np.uint64) * 31 + layer * 7919 + i * 104729) % 251).astype(np.uint8)


def decode(args, ep=None, ready=None):
    own = ep is None
    ep = ep or podlink.Endpoint()
    block = args.block_kib << 10
    n = args.layers * args.blocks * block
    cache = ep.alloc_gpu(n) if args.gpu else ep.alloc_host(n)
    region = ep.reg(cache, name=args.name)
    if ready:
        ready.set()
    print(f"decode: cache of {args.layers} layers x {args.blocks} blocks x {args.block_kib} KiB exported as "
          f"{args.name!r}; waiting for prefill", flush=True)
    ids = block_ids(args)
    done, bad, deadline = set(), 0, time.monotonic() + args.timeout
    while len(done) < args.layers:
        if time.monotonic() > deadline:
            raise podlink.Timeout(f"only {len(done)} of {args.layers} layers arrived")
        for r, layer in ep.notifications():
            if r is None or r.export_id != region.export_id or layer in done or not 0 <= layer < args.layers:
                continue
            view = cache.cpu().numpy() if args.gpu else cache
            for i, bid in enumerate(ids):
                at = (layer * args.blocks + int(bid)) * block
                if not np.array_equal(np.asarray(view[at:at + block]), expected(layer, i, block)):
                    bad += 1
            done.add(layer)
            print(f"decode: layer {layer}: {len(ids)} blocks checked", flush=True)
        time.sleep(0.001)
    print(f"decode: {args.layers * len(ids)} blocks, {bad} wrong", flush=True)
    if own:
        ep.close()
    return bad


def prefill(args, ep=None):
    own = ep is None
    ep = ep or podlink.Endpoint()
    block = args.block_kib << 10
    remote = ep.wait_for(args.name, timeout=args.timeout)
    ids = block_ids(args)
    per_layer = len(ids) * block
    if args.gpu:
        import torch
        staging = ep.alloc_gpu(per_layer)
    else:
        staging = ep.alloc_host(per_layer)
    local = ep.reg(staging)
    t0 = time.monotonic()
    for layer in range(args.layers):
        if args.gpu:
            # The layer's KV "computed" on the GPU: a copy and a kernel on torch's current stream, no synchronize.
            src = torch.from_numpy(np.concatenate([expected(layer, i, block) for i in range(len(ids))]))
            staging.copy_(src.to(staging.device, non_blocking=True))
        else:
            for i in range(len(ids)):
                staging[i * block:(i + 1) * block] = expected(layer, i, block)
        ops = [(local, i * block, remote, (layer * args.blocks + int(bid)) * block, block) for i, bid in enumerate(ids)]
        ep.writev(ops)
        ep.notify(remote, layer)
    took = time.monotonic() - t0
    print(f"prefill: {args.layers} layers x {len(ids)} blocks of {args.block_kib} KiB via {remote.transport}: "
          f"{args.layers * per_layer / took / 1e9:.2f} GB/s (with the filling)", flush=True)
    if own:
        ep.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["decode", "prefill", "demo"])
    ap.add_argument("--name", default="kv-cache")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=1024, help="blocks per layer in the decode cache")
    ap.add_argument("--used", type=int, default=256, help="blocks this request uses (scattered)")
    ap.add_argument("--block-kib", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    if args.used > args.blocks:
        ap.error("--used must not exceed --blocks")
    if args.role == "decode":
        return 1 if decode(args) else 0
    if args.role == "prefill":
        prefill(args)
        return 0
    with podlink.Endpoint() as d, podlink.Endpoint() as p:
        ready, result = threading.Event(), []
        t = threading.Thread(target=lambda: result.append(decode(args, d, ready)))
        t.start()
        ready.wait(10)
        prefill(args, p)
        t.join()
    return 1 if not result or result[0] else 0


if __name__ == "__main__":
    sys.exit(main())
