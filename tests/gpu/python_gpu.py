#!/usr/bin/env python3
"""`import podlink` on GPUs (tests/gpu/python_gpu.sh runs it with a podlinkd): checks, then a benchmark.

1. Stream order: a kernel fills a CUDA tensor (after a ~1 ms spin kernel, so the fill is still queued when the
   call starts) and the tensor is written right away, with no synchronize in this code; the destination must
   hold the fill's value, every round (relay and direct). A read then lands before the next kernel uses it.
2. The KV hand-off example with --gpu (both roles in this process, every block checked).
3. KV-style writev of many blocks GPU0 -> GPU1 through the relay and direct, 16 KiB to 4 MiB blocks, checked after
   timing: one JSON line per size on stdout ("bench").
Exits 1 when a check fails.
"""
import json
import os
import subprocess
import sys
import time

import torch

import podlink

ngpu = torch.cuda.device_count()
dst_gpu = 1 if ngpu > 1 else 0
failed = []


class NoSync:
    """A stream whose synchronize() does nothing: the negative control (what a write would send without it)."""

    def synchronize(self):
        pass


def stream_order(force_relay, control=False):
    with podlink.Endpoint(gpu=dst_gpu) as owner, podlink.Endpoint(gpu=0, force_relay=force_relay) as writer:
        n = 64 << 20
        dst = owner.alloc_gpu(n, gpu=dst_gpu)
        remote = writer.open(owner.describe(owner.reg(dst)))
        src = writer.alloc_gpu(n, gpu=0)
        region = writer.reg(src)
        back = writer.alloc_gpu(n, gpu=0)
        back_region = writer.reg(back)
        bad = 0
        with torch.cuda.device(0):
            for i in range(1, 21):
                torch.cuda._sleep(2_000_000)   # the fill below waits behind this on the current stream
                src.fill_(i)                   # queued, not yet run, when write() is called
                # No synchronize here: podlink orders the write after the fill (the control skips that).
                writer.write(region, remote, stream=NoSync() if control else None)
                writer.read(back_region, remote)
                if not bool((back == i).all()):  # a kernel after the read sees what it brought
                    bad += 1
        torch.cuda.synchronize()
        if control:
            print(f"control (stream not synchronized) via {remote.transport}: 20 rounds, {bad} wrong "
                  "(shows the check can fail)", flush=True)
            return
        ok = bad == 0 and bool((dst == 20).all())
        print(f"stream order via {remote.transport}: 20 rounds, {bad} wrong: {'ok' if ok else 'FAILED'}",
              flush=True)
        if not ok:
            failed.append(f"stream order ({remote.transport})")


def gpu_initiated():
    """A torch kernel stores into the peer's GPU memory through RemoteRegion.tensor (direct), then loads it."""
    with podlink.Endpoint(gpu=dst_gpu) as owner, podlink.Endpoint(gpu=0) as user:
        n = 16 << 20
        dst = owner.alloc_gpu(n, gpu=dst_gpu)
        remote = user.open(owner.describe(owner.reg(dst)))
        if remote.transport != "direct":
            print(f"remote.tensor: skipped ({remote.transport})", flush=True)
            return
        t = remote.tensor(torch.float32, (1024, 1024), offset=4096)
        with torch.cuda.device(0):
            t.copy_(torch.arange(1024 * 1024, dtype=torch.float32, device="cuda:0").view(1024, 1024))
            t.mul_(2)                   # a kernel reading and writing the peer's memory over NVLink
            total = float(t.sum())
        torch.cuda.synchronize()
        want = torch.arange(1024 * 1024, dtype=torch.float32, device=dst.device).view(1024, 1024) * 2
        seen = dst[4096:4096 + 4 * 1024 * 1024].view(torch.float32).view(1024, 1024)
        ok = bool(torch.equal(seen, want)) and int((dst[:4096] != 0).sum()) == 0 and total == float(want.sum())
        # Bandwidth of a kernel store into the peer against the copy engine's write.
        big = remote.tensor(torch.uint8, (n - 4096,), offset=4096)
        src = torch.full((n - 4096,), 7, dtype=torch.uint8, device="cuda:0")
        with torch.cuda.device(0):
            for _ in range(3):
                big.copy_(src)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                big.copy_(src)
            torch.cuda.synchronize()
            kern = 20 * (n - 4096) / (time.perf_counter() - t0) / 1e9
        local = user.reg(user.alloc_gpu(n, gpu=0))
        t0 = time.perf_counter()
        for _ in range(20):
            user.write(local, remote, 4096, 4096, n - 4096)
        ce = 20 * (n - 4096) / (time.perf_counter() - t0) / 1e9
        print(f"remote.tensor (direct): a torch kernel stored and loaded the peer's memory: "
              f"{'ok' if ok else 'FAILED'}; copy_ into it {kern:.1f} GB/s, ep.write of the same bytes "
              f"{ce:.1f} GB/s (16 MiB)", flush=True)
        if not ok:
            failed.append("remote.tensor")
        del t, big


def kv_example():
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "examples", "kv_handoff.py")
    r = subprocess.run([sys.executable, example, "demo", "--gpu", "--layers", "4", "--blocks", "512", "--used",
                        "128", "--block-kib", "64"], capture_output=True, text=True, timeout=300)
    print(r.stdout + r.stderr, end="", flush=True)
    if r.returncode != 0 or " 0 wrong" not in r.stdout:
        failed.append("kv example --gpu")


def bench(force_relay):
    with podlink.Endpoint(gpu=dst_gpu) as owner, podlink.Endpoint(gpu=0, force_relay=force_relay) as writer:
        for block, count in ((16 << 10, 4096), (64 << 10, 2048), (256 << 10, 1024), (1 << 20, 256), (4 << 20, 64)):
            n = block * count
            cache = owner.alloc_gpu(2 * n, gpu=dst_gpu)
            remote = writer.open(owner.describe(owner.reg(cache)))
            src = writer.alloc_gpu(n, gpu=0)
            with torch.cuda.device(0):
                src.copy_(torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:0"))
            torch.cuda.synchronize()
            local = writer.reg(src)
            ids = torch.randperm(2 * count)[:count].tolist()
            ops = [(local, i * block, remote, bid * block, block) for i, bid in enumerate(ids)]
            writer.writev(ops)  # warm-up
            iters = 10
            t0 = time.perf_counter()
            for _ in range(iters):
                writer.writev(ops)
            secs = time.perf_counter() - t0
            idx = torch.tensor(ids, device=cache.device)
            got = cache.view(2 * count, block).index_select(0, idx).to("cuda:0")
            wrong = int((got != src.view(count, block)).any(dim=1).sum())
            if wrong:
                failed.append(f"bench {block} via {remote.transport}: {wrong} wrong blocks")
            print(json.dumps({"bench": remote.transport, "block": block, "blocks": count,
                              "gbps": n * iters / secs / 1e9, "us_per_block": secs / iters / count * 1e6,
                              "wrong": wrong}), flush=True)
            remote.close()
            owner.unreg(owner.reg(cache))
            writer.unreg(local)


if __name__ == "__main__":
    print(f"{ngpu} GPU(s); destination GPU {dst_gpu}; torch {torch.__version__}", flush=True)
    stream_order(force_relay=True)
    stream_order(force_relay=True, control=True)
    if ngpu > 1:
        stream_order(force_relay=False)
    if ngpu > 1:
        gpu_initiated()
    kv_example()
    bench(force_relay=True)
    if ngpu > 1:
        bench(force_relay=False)
    print("FAILED: " + ", ".join(failed) if failed else "python GPU checks passed", flush=True)
    sys.exit(1 if failed else 0)
