#!/usr/bin/env python3
"""torch's own GPU memory between two pods on one GPU (tests/gpu/torch_segments.sh runs it with a podlinkd).

The owner allocates with torch's caching allocator in expandable segments (PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True: cuMem allocations of 2 MiB for small tensors, 20 MiB for large ones, mapped back to
back), as vLLM allocates its KV cache:
  - a, b: two 1 MiB tensors in one 2 MiB allocation; only b is registered, a must stay untouched;
  - view: 200 MiB of a 256 MiB tensor from byte 5 MiB + 512, so it starts inside one allocation and ends inside
    the eleventh; the bytes of the tensor around it must stay untouched.
A peer process in its own PID, IPC and mount namespaces (unshare; said in the output when unshare is missing)
opens both by name, reads them into its own expandable-segment tensors (which start inside their allocations
too) and checks every byte, writes new patterns back, and the owner checks every byte. Once through podlinkd's
relay, once mapped directly. Last, torch's default allocator (cudaMalloc): refused, with the way out.
One JSON line per step; exit 1 when a check fails.
"""
import json
import os
import subprocess
import sys
import time

if sys.argv[1:2] != ["default"]:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

import podlink  # noqa: E402

MiB = 1 << 20
VIEW_START = 5 * MiB + 512
VIEW_LEN = 200 * MiB
failed = []


def pattern(n, seed):
    i = torch.arange(n, dtype=torch.int64, device="cuda")
    return ((i * 2654435761 + seed) % 251).to(torch.uint8)


def report(step, **kw):
    kw["step"] = step
    print(json.dumps(kw), flush=True)


def check(step, ok, **kw):
    report(step, ok=bool(ok), **kw)
    if not ok:
        failed.append(step)


def peer(mode):
    """Reads the owner's b and view, checks them, writes new patterns back (stdout: JSON lines)."""
    with podlink.Endpoint(force_relay=(mode == "relay")) as ep:
        rb = ep.wait_for("seg-b")
        rv = ep.wait_for("seg-view")
        pad = torch.zeros(512 * 1024, dtype=torch.uint8, device="cuda")  # lb starts half-way into its allocation
        lb = torch.zeros(MiB, dtype=torch.uint8, device="cuda")
        whole = torch.zeros(VIEW_LEN + 40 * MiB, dtype=torch.uint8, device="cuda")
        lv = whole[3 * MiB + 256:3 * MiB + 256 + VIEW_LEN]  # starts inside an allocation too
        gb, gv = ep.reg(lb), ep.reg(lv)
        torch.cuda.synchronize()
        t = time.perf_counter()
        ep.read(gb, rb, length=MiB)
        ep.read(gv, rv, length=VIEW_LEN)
        read_s = time.perf_counter() - t
        torch.cuda.synchronize()
        check(f"{mode}: read b", torch.equal(lb, pattern(MiB, 1)), transport=rb.transport)
        check(f"{mode}: read view", torch.equal(lv, pattern(VIEW_LEN + VIEW_START, 2)[VIEW_START:]),
              transport=rv.transport)
        lb.copy_(pattern(MiB, 11))
        lv.copy_(pattern(VIEW_LEN, 12))
        torch.cuda.synchronize()
        t = time.perf_counter()
        ep.write(gb, rb, length=MiB)
        ep.write(gv, rv, length=VIEW_LEN)
        write_s = time.perf_counter() - t
        report(f"{mode}: moved", bytes=MiB + VIEW_LEN, read_gbps=(MiB + VIEW_LEN) / read_s / 1e9,
               write_gbps=(MiB + VIEW_LEN) / write_s / 1e9, note="one transfer each, first use (a smoke number)")
        ep.notify(rb, 1)
        del pad, whole
    sys.exit(1 if failed else 0)


def refused_default():
    """Child without expandable segments: torch's default allocator (cudaMalloc) is refused with the way out."""
    x = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
    with podlink.Endpoint() as ep:
        try:
            ep.reg(x)
        except podlink.Error as e:
            msg = str(e)
            check("default allocator refused", "expandable_segments:True" in msg and "alloc_gpu" in msg,
                  error=type(e).__name__, message=msg)
            sys.exit(1 if failed else 0)
    check("default allocator refused", False, error="registered")
    sys.exit(1)


def run_peer(mode):
    cmd = [sys.executable, __file__, "peer", mode]
    isolated = subprocess.run(["unshare", "-p", "-f", "-i", "-m", "--mount-proc", "true"],
                              capture_output=True).returncode == 0
    if isolated:
        cmd = ["unshare", "-p", "-f", "-i", "-m", "--mount-proc"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        failed.append(f"{mode}: peer exited {p.returncode}: {p.stderr[-2000:]}")
    return isolated


def owner():
    report("torch", version=torch.__version__, alloc_conf=os.environ["PYTORCH_CUDA_ALLOC_CONF"],
           gpu=torch.cuda.get_device_name(0))
    a = torch.zeros(MiB, dtype=torch.uint8, device="cuda")
    b = torch.zeros(MiB, dtype=torch.uint8, device="cuda")
    big = torch.zeros(VIEW_LEN + 56 * MiB, dtype=torch.uint8, device="cuda")
    view = big[VIEW_START:VIEW_START + VIEW_LEN]
    with podlink.Endpoint() as ep:
        t = time.perf_counter()
        rb = ep.reg(b, name="seg-b")
        reg_b_s = time.perf_counter() - t
        t = time.perf_counter()
        rv = ep.reg(view, name="seg-view")
        reg_view_s = time.perf_counter() - t
        report("registered", b_offset_in_chunk=b.data_ptr() - a.data_ptr(), reg_b_ms=reg_b_s * 1e3,
               reg_view_ms=reg_view_s * 1e3, view_bytes=VIEW_LEN)
        for mode in ("relay", "direct"):
            a.fill_(0xAA)
            b.copy_(pattern(MiB, 1))
            big.copy_(pattern(big.numel(), 2))
            torch.cuda.synchronize()
            isolated = run_peer(mode)
            got = []
            deadline = time.time() + 30
            while not got and time.time() < deadline:
                got = ep.notifications()
                time.sleep(0.01)
            torch.cuda.synchronize()
            check(f"{mode}: notified", bool(got), isolated_peer=isolated)
            check(f"{mode}: a untouched", bool((a == 0xAA).all()))
            check(f"{mode}: b written", torch.equal(b, pattern(MiB, 11)))
            check(f"{mode}: view written", torch.equal(view, pattern(VIEW_LEN, 12)))
            around = pattern(big.numel(), 2)
            check(f"{mode}: bytes around the view untouched",
                  torch.equal(big[:VIEW_START], around[:VIEW_START]) and
                  torch.equal(big[VIEW_START + VIEW_LEN:], around[VIEW_START + VIEW_LEN:]))
        ep.unreg(rb)
        ep.unreg(rv)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF")
    p = subprocess.run([sys.executable, __file__, "default"], env=env, capture_output=True, text=True, timeout=120)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        failed.append(f"default allocator: exited {p.returncode}: {p.stderr[-2000:]}")
    report("summary", failed=failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "peer":
        peer(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "default":
        refused_default()
    else:
        owner()
