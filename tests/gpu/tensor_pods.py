#!/usr/bin/env python3
"""RemoteRegion.tensor between two isolated direct-mode pods (each can open both GPUs, own namespaces).

PMI_RANK 0 (the owner, KV_DEVICE): exports 64 MiB of GPU memory by name, waits for the user's notification and
checks every byte a kernel of the other pod stored there. PMI_RANK 1 (the user): opens it by name, stores into it
with torch kernels through `remote.tensor()` (no copy engine, no daemon on the path) and, where Triton is
installed, with a Triton kernel; times both against `ep.write` of the same bytes (copy engine). The final pattern is
stored by the Triton kernel (torch's where Triton is missing), read back by another Triton kernel and checked
here, then scaled in place by a torch kernel (a load and a store of the peer's memory); synchronizes, notifies.
One JSON line each; exit 1 on a wrong byte or a transport other than direct.
"""
import json
import os
import sys
import time

import torch

import podlink

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    def triton_copy(src, dst):
        """dst[:] = src[:] by a Triton kernel (loads and stores; either may be another pod's GPU memory)."""
        n = src.numel()
        _copy_kernel[(triton.cdiv(n, 4096),)](src, dst, n, BLOCK=4096)
except ImportError:  # the machine's torch came without Triton
    triton = None

N = 64 << 20
DONE = 0x7E5


def pattern(device):
    return (torch.arange(N // 4, dtype=torch.int64, device=device) * 2654435761 % 1000003).to(torch.float32)


def main():
    rank = int(os.environ.get("PMI_RANK", "0"))
    dev = int(os.environ.get("KV_DEVICE", str(rank)))
    torch.cuda.set_device(dev)
    ep = podlink.Endpoint(gpu=dev)
    if rank == 0:
        mem = ep.alloc_gpu(N, gpu=dev)
        region = ep.reg(mem, name="tensor-bench")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if any(v == DONE for r, v in ep.notifications() if r is not None and r.export_id == region.export_id):
                break
            time.sleep(0.01)
        ok = bool(torch.equal(mem.view(torch.float32), pattern(mem.device)))
        print(json.dumps({"owner_check": ok}), flush=True)
        ep.close()
        return 0 if ok else 1
    remote = ep.wait_for("tensor-bench", timeout=120)
    if remote.transport != "direct":
        print(json.dumps({"error": f"transport {remote.transport}, not direct"}), flush=True)
        return 1
    raw = remote.tensor(torch.uint8, (N,))
    src = torch.full((N,), 9, dtype=torch.uint8, device=f"cuda:{dev}")
    for _ in range(3):
        raw.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        raw.copy_(src)                  # a kernel storing into the other pod's GPU memory over NVLink
    torch.cuda.synchronize()
    kernel = 20 * N / (time.perf_counter() - t0) / 1e9
    tri = None
    if triton is not None:
        src32, raw32 = src.view(torch.int32), raw.view(torch.int32)
        for _ in range(3):
            triton_copy(src32, raw32)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            triton_copy(src32, raw32)   # a Triton kernel storing into the other pod's GPU memory
        torch.cuda.synchronize()
        tri = 20 * N / (time.perf_counter() - t0) / 1e9
    local = ep.reg(ep.alloc_gpu(N, gpu=dev))
    ep.write(local, remote)
    t0 = time.perf_counter()
    for _ in range(20):
        ep.write(local, remote)         # the copy engine, same bytes
    ce = 20 * N / (time.perf_counter() - t0) / 1e9
    t = remote.tensor(torch.float32, (N // 4,))
    want = pattern(t.device)
    read_ok = None
    if triton is not None:
        triton_copy(want, t)            # the pattern, stored by Triton
        back = torch.empty_like(want)
        triton_copy(t, back)            # and loaded back from the peer by Triton
        torch.cuda.synchronize()
        read_ok = bool(torch.equal(back, want))
    else:
        t.copy_(want)
    t.mul_(1.0)                         # read and write the peer's memory in one kernel
    torch.cuda.synchronize()
    ep.notify(remote, DONE)
    print(json.dumps({"transport": remote.transport, "bytes": N, "tensor_copy_gbps": kernel,
                      "triton_copy_gbps": tri, "ep_write_gbps": ce, "triton": triton.__version__ if triton else None,
                      "triton_read_back_ok": read_ok}), flush=True)
    if read_ok is False:
        return 1
    del raw, t
    ep.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
