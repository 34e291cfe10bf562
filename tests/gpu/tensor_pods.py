#!/usr/bin/env python3
"""RemoteRegion.tensor between two isolated direct-mode pods (each can open both GPUs, own namespaces).

PMI_RANK 0 (the owner, KV_DEVICE): exports 64 MiB of GPU memory by name, waits for the user's notification and
checks every byte a kernel of the other pod stored there. PMI_RANK 1 (the user): opens it by name, stores into it
with torch kernels through `remote.tensor()` (no copy engine, no daemon on the path), times that against
`ep.write` of the same bytes (copy engine), stores the final pattern, synchronizes, notifies. One JSON line each;
exit 1 on a wrong byte or a transport other than direct.
"""
import json
import os
import sys
import time

import torch

import podlink

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
    local = ep.reg(ep.alloc_gpu(N, gpu=dev))
    ep.write(local, remote)
    t0 = time.perf_counter()
    for _ in range(20):
        ep.write(local, remote)         # the copy engine, same bytes
    ce = 20 * N / (time.perf_counter() - t0) / 1e9
    t = remote.tensor(torch.float32, (N // 4,))
    t.copy_(pattern(t.device))
    t.mul_(1.0)                         # read and write the peer's memory in one kernel
    torch.cuda.synchronize()
    ep.notify(remote, DONE)
    print(json.dumps({"transport": remote.transport, "bytes": N, "tensor_copy_gbps": kernel, "ep_write_gbps": ce}),
          flush=True)
    del raw, t
    ep.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
