#!/usr/bin/env python3
"""Host memory as applications have it, on a GPU machine (tests/gpu/host_memory_gpu.sh runs it with a podlinkd):
what registers and moves between two endpoints, every transfer checked.

1. torch.empty(..., pin_memory=True): pinned by torch's caching host allocator (cudaHostAlloc, the driver's own
   mapping): registered or refused, with the reason (docs/python.md says which to expect).
2. A numpy array pinned with cudaHostRegister (as LMCache and vLLM's CPU offload pin what they allocated): written to
   and read from a peer's podlink host memory through the relay, checked.
3. A plain CPU tensor (torch.zeros): the same.
4. Process memory to a peer's GPU memory through the relay: refused UNIMPLEMENTED with the reason (not yet built).
One JSON line per case; exits 1 when a check fails (a wrong byte, or a refusal without a reason).
"""
import json
import sys

import numpy as np
import torch

import podlink

N = 8 << 20
failed = []


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


def report(case, **kw):
    kw["case"] = case
    print(json.dumps(kw), flush=True)


def round_trip(case, obj, view):
    """Registers obj (view: its bytes as a uint8 numpy array), writes it to a peer's podlink host memory and reads
    it back, through the relay; checks both."""
    with podlink.Endpoint() as owner, podlink.Endpoint(force_relay=True) as peer:
        dst = owner.alloc_host(N)
        remote = peer.open(owner.describe(owner.reg(dst)))
        try:
            region = peer.reg(obj)
        except podlink.Error as e:
            report(case, registered=False, error=type(e).__name__, message=str(e))
            if not str(e):
                failed.append(case)
            return False
        view[:] = pattern(N, 1)
        peer.write(region, remote, length=N)
        ok_write = bool(np.array_equal(dst, pattern(N, 1)))
        dst[:] = pattern(N, 2)
        peer.read(region, remote, length=N)
        ok_read = bool(np.array_equal(view, pattern(N, 2)))
        report(case, registered=True, transport=remote.transport, write_ok=ok_write, read_ok=ok_read)
        if not (ok_write and ok_read):
            failed.append(case)
        return True


def main():
    pinned = torch.empty(N, dtype=torch.uint8, pin_memory=True)
    round_trip("torch pin_memory=True (cudaHostAlloc)", pinned, pinned.numpy())

    arr = np.zeros(N, dtype=np.uint8)
    cudart = torch.cuda.cudart()
    rc = cudart.cudaHostRegister(arr.ctypes.data, N, 0)
    report("cudaHostRegister", rc=int(rc))
    round_trip("numpy pinned with cudaHostRegister", arr, arr)
    cudart.cudaHostUnregister(arr.ctypes.data)

    t = torch.zeros(N, dtype=torch.uint8)
    round_trip("torch.zeros on the CPU", t, t.numpy())

    with podlink.Endpoint(gpu=0) as owner, podlink.Endpoint(gpu=0, force_relay=True) as peer:
        remote = peer.open(owner.describe(owner.reg(owner.alloc_gpu(N, gpu=0))))
        host = np.zeros(N, dtype=np.uint8)
        region = peer.reg(host)
        try:
            peer.write(region, remote, length=N)
            report("process memory to GPU memory", refused=False)
            failed.append("process memory to GPU memory: expected UNIMPLEMENTED")
        except podlink.Error as e:
            report("process memory to GPU memory", refused=True, error=type(e).__name__, message=str(e))
    print(json.dumps({"failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
