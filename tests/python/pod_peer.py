"""A process in a pod driven by the tests: JSON commands on stdin, one JSON answer each on stdout.

    {"cmd": "export", "nbytes": N, "name": "kv", "memory": M} -> {"descriptor": "...", "export_id": E}
        M: "podlink" (alloc_host, the default), "numpy", "bytearray", "slice" (of a larger numpy array),
        "mmap" (an anonymous mapping of its own, which "unmap" takes away)
    {"cmd": "read", "seed": S, "nbytes": N, "memory": M}   reads N bytes of the peer into memory M, checks S
    {"cmd": "unmap"}                                     munmaps the "mmap" memory while peers use it
    {"cmd": "fill", "seed": S}                          fills the exported region with pattern S
    {"cmd": "check", "seed": S, "offset": O, "length": L} -> {"ok": bool, "first_bad": i}
    {"cmd": "open", "descriptor": "...", "force_relay": bool} -> {"nbytes": N, "transport": "..."} or error
    {"cmd": "write", "seed": S, "count": C, "nbytes": N}   C writes of N bytes of pattern S, each waited
    {"cmd": "notify", "value": V}
    {"cmd": "notifications", "timeout": T}              -> {"values": [...]}
Errors come back as {"error": "<podlink exception class>", "code": "...", "message": "..."}.
"""
import ctypes
import json
import sys
import time

import numpy as np

import podlink


def pattern(seed, n):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


def host_memory(ep, kind, n):
    """n bytes of host memory of `kind`, as a uint8 numpy view, and what registers (the object itself)."""
    if kind == "podlink":
        buf = ep.alloc_host(n)
        return buf, buf
    if kind == "numpy":
        buf = np.zeros(n, dtype=np.uint8)
        return buf, buf
    if kind == "bytearray":
        obj = bytearray(n)
        return np.frombuffer(obj, dtype=np.uint8), obj
    if kind == "slice":
        whole = np.zeros(n + 8192, dtype=np.uint8)
        view = whole[4097:4097 + n]
        return view, view
    if kind == "mmap":
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        addr = libc.mmap(None, n, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
        assert addr not in (None, ctypes.c_void_p(-1).value)
        mmaps[addr] = n
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))
        return buf, buf
    raise ValueError(kind)


libc = ctypes.CDLL(None, use_errno=True)
mmaps = {}  # address -> length of the "mmap" memory


def main():
    ep = None
    local = buf = remote = None
    for line in sys.stdin:
        cmd = json.loads(line)
        c = cmd["cmd"]
        out = {}
        try:
            if ep is None:
                ep = podlink.Endpoint(force_relay=cmd.get("force_relay", False))
            if c == "export":
                buf, obj = host_memory(ep, cmd.get("memory", "podlink"), cmd["nbytes"])
                local = ep.reg(obj, name=cmd.get("name"))
                out = {"descriptor": ep.describe(local).decode(), "export_id": local.export_id}
            elif c == "read":
                n = cmd["nbytes"]
                dst, obj = host_memory(ep, cmd.get("memory", "podlink"), n)
                region = ep.reg(obj)
                ep.read(region, remote, length=n, timeout=cmd.get("timeout"))
                bad = np.nonzero(dst != pattern(cmd["seed"], n))[0]
                ep.unreg(region)
                out = {"ok": bad.size == 0, "first_bad": int(bad[0]) if bad.size else -1}
            elif c == "unmap":
                for addr, n in mmaps.items():
                    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                    assert libc.munmap(addr, n) == 0
                mmaps.clear()
                buf = None  # its pages are gone
            elif c == "fill":
                buf[:] = pattern(cmd["seed"], buf.size)
            elif c == "check":
                o, n = cmd.get("offset", 0), cmd.get("length", buf.size)
                bad = np.nonzero(buf[o:o + n] != pattern(cmd["seed"], n))[0]
                out = {"ok": bad.size == 0, "first_bad": int(bad[0]) if bad.size else -1}
            elif c == "open":
                remote = ep.open(cmd["descriptor"].encode())
                out = {"nbytes": remote.nbytes, "transport": remote.transport}
            elif c == "write":
                n = cmd["nbytes"]
                if buf is None or buf.size < n or "memory" in cmd:
                    buf, obj = host_memory(ep, cmd.get("memory", "podlink"), n)
                    local = ep.reg(obj)
                buf[:n] = pattern(cmd["seed"], n)
                for _ in range(cmd.get("count", 1)):
                    ep.write(local, remote, length=n, timeout=cmd.get("timeout"))
                out = {"written": n * cmd.get("count", 1)}
            elif c == "notify":
                # "message": hex of the bytes to send instead of a value
                ep.notify(remote, bytes.fromhex(cmd["message"]) if "message" in cmd else cmd["value"])
            elif c == "write_notify":
                # Each round: a write of pattern seed+i, then a notification with bytes naming the round; the
                # receiver checks that each message's data had landed (docs/python.md: after every earlier write).
                # Round i lands at i * nbytes of the peer's region, so no later round overwrites it.
                n = cmd["nbytes"]
                if buf is None or buf.size < n:
                    buf = ep.alloc_host(n)
                    local = ep.reg(buf)
                for i in range(cmd["count"]):
                    buf[:n] = pattern(cmd["seed"] + i, n)
                    ep.write(local, remote, remote_offset=i * n, length=n)
                    ep.notify(remote, json.dumps({"round": i, "pad": "x" * cmd.get("pad", 0)}).encode())
                out = {"rounds": cmd["count"]}
            elif c == "notifications":
                deadline = time.monotonic() + cmd.get("timeout", 5)
                values = []
                while time.monotonic() < deadline and len(values) < cmd.get("want", 1):
                    values += [v.hex() if isinstance(v, bytes) else v for _, v in ep.notifications()]
                    time.sleep(0.01)
                out = {"values": values}
            elif c == "receive_rounds":
                # Checks each round's data when its notification arrives (bytes from write_notify).
                deadline = time.monotonic() + cmd.get("timeout", 20)
                got, bad = [], []
                while time.monotonic() < deadline and len(got) < cmd["count"]:
                    for _, v in ep.notifications():
                        r = json.loads(bytes(v))["round"]
                        got.append(r)
                        n = cmd["nbytes"]
                        if not np.array_equal(buf[r * n:(r + 1) * n], pattern(cmd["seed"] + r, n)):
                            bad.append(r)
                    time.sleep(0.0005)
                out = {"rounds": got, "bad": bad}
            else:
                out = {"error": "unknown command"}
        except podlink.Error as e:
            out = {"error": type(e).__name__, "code": e.code, "message": str(e)}
        print(json.dumps(out), flush=True)
    if ep is not None:
        ep.close()


if __name__ == "__main__":
    main()
