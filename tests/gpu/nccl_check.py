"""One rank of the NCCL test between two pods: checks all_reduce, all_gather
and send/recv results, then measures all_reduce bus bandwidth over a range of
sizes, checking one all_reduce of every timed size (outside the timing).
Prints JSON lines; exits 1 when any check fails on any rank. Environment: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torch.distributed's env:// rendezvous),
LABEL. With WORLD_SIZE=1 (a smoke test of this script on one GPU) send/recv is
skipped.

    python3 nccl_check.py [--sizes-mib 1,4,...] [--check-only]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def emit(**kw):
    print(json.dumps(kw), flush=True)


def expected_sum(shape, world, dtype):
    total = torch.zeros(shape, dtype=dtype, device="cuda")
    for r in range(world):
        g = torch.Generator(device="cuda").manual_seed(1000 + r)
        total += torch.randint(-1000, 1000, shape, generator=g, device="cuda").to(dtype)
    return total


def agree(ok):
    """True when `ok` holds on every rank."""
    flag = torch.tensor([1.0 if ok else 0.0], device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item() == 1.0)


def checked_all_reduce(numel, rank, world):
    """One all_reduce of rank-seeded integers, compared with their sum."""
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    x = torch.randint(-1000, 1000, (numel,), generator=g, device="cuda").float()
    dist.all_reduce(x)
    ok = bool(torch.equal(x, expected_sum((numel,), world, torch.float32)))
    del x
    return agree(ok)


def checks(rank, world):
    results = {}
    for numel in (1 << 10, 1 << 24):  # 4 KiB and 64 MiB of float32
        g = torch.Generator(device="cuda").manual_seed(1000 + rank)
        x = torch.randint(-1000, 1000, (numel,), generator=g, device="cuda").float()
        dist.all_reduce(x)
        results[f"all_reduce_{numel * 4}B"] = bool(torch.equal(x, expected_sum((numel,), world, torch.float32)))

        mine = torch.full((numel,), float(rank + 1), device="cuda")
        out = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(out, mine)
        results[f"all_gather_{numel * 4}B"] = all(bool(torch.all(out[r] == r + 1)) for r in range(world))

        if world < 2:
            continue
        ref = torch.arange(numel, device="cuda", dtype=torch.float32) * 3 + 7
        if rank == 0:
            dist.send(ref, dst=1)
            back = torch.empty_like(ref)
            dist.recv(back, src=1)
            ok = bool(torch.equal(back, ref * 2))
        else:
            got = torch.empty_like(ref)
            dist.recv(got, src=0)
            ok = bool(torch.equal(got, ref))
            dist.send(got * 2, dst=0)
        results[f"send_recv_{numel * 4}B"] = ok
    torch.cuda.synchronize()
    # Every rank must agree that every check passed.
    return results, agree(all(results.values()))


def bench(rank, world, sizes_mib):
    rows = []
    for mib in sizes_mib:
        n = (mib << 20) // 4
        x = torch.ones(n, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        one = time.perf_counter() - t0
        iters = int(max(3, min(50, 0.6 / max(one, 1e-6))))
        # Every rank must run the same number of collectives: agree on the
        # largest count (each rank timed its own warm-up).
        agreed = torch.tensor([iters], device="cuda")
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        iters = int(agreed.item())
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        sec = start.elapsed_time(end) / 1000 / iters
        algbw = (mib << 20) / sec / 1e9
        busbw = algbw * 2 * (world - 1) / world
        del x
        ok = checked_all_reduce(n, rank, world)
        rows.append({"mib": mib, "us": round(sec * 1e6, 1), "algbw": round(algbw, 2), "busbw": round(busbw, 2),
                     "iters": iters, "ok": ok})
        emit(event="bw", label=os.environ.get("LABEL", ""), **rows[-1])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mib", default="1,4,16,64,128,256,512,1024")
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    rank, world = dist.get_rank(), dist.get_world_size()
    emit(event="start", rank=rank, world=world, host=os.uname().nodename,
         gpu=torch.cuda.get_device_name(0), visible=torch.cuda.device_count(), nccl=".".join(map(str, torch.cuda.nccl.version())))
    results, all_ok = checks(rank, world)
    emit(event="checks", rank=rank, ok=all_ok, **results)
    if not a.check_only:
        rows = bench(rank, world, [int(s) for s in a.sizes_mib.split(",")])
        all_ok = all_ok and all(r["ok"] for r in rows)
    dist.destroy_process_group()
    emit(event="end", rank=rank, ok=all_ok)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
