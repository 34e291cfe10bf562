"""A vLLM NixlConnector-shaped KV hand-off through NIXL's own Python API with backends=["PODLINK"].

Run as two processes (two pods), which meet through files in a shared folder (the test's own side channel, as
vLLM's is its ZMQ socket):

    python3 kv_flow.py prefill WORK [--layers L --blocks B --block-bytes N]
    python3 kv_flow.py decode  WORK [same]

The KV cache of each side is paged, [layers x blocks x block_bytes], one registered region per layer (vLLM
registers one per K/V tensor). Prefill fills its blocks with a pattern naming (layer, block). Decode loads
prefill's metadata, prepares both sides' block lists once, and pulls scattered prefill blocks into other block ids
of its own cache with make_prepped_xfer("READ", ..., notif_msg=b"req-7:1"), polls, and checks every byte; prefill
waits for that notification, as vLLM's producer does before freeing the blocks. Then the push mode: decode sends a
binary notification (send_notif), prefill WRITEs blocks into decode with a notification, decode checks them. The
same prepared handle is posted several times. Each side prints one JSON line of results; any failed check exits 1.

Host memory comes from podlink's allocator (a sealed memfd: what podlink registers today); the bytes NIXL sees are
plain numpy arrays.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import podlink
from nixl._api import nixl_agent, nixl_agent_config

NOTIF = b"req-7:1"


def pattern(layer, block, n, salt=0):
    i = np.arange(n, dtype=np.uint64)
    return ((i * 31 + layer * 7919 + block * 104729 + salt) % 251).astype(np.uint8)


def wait_file(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)
    with open(path) as f:
        return json.load(f)


def put_file(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.rename(tmp, path)


def wait_xfer(agent, handle, what, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        state = agent.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError(f"{what}: the transfer failed")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done within {timeout} s")


def name_of(agent_name):
    """NIXL's Python API gives agent names as bytes in some calls and str in others."""
    return agent_name.decode() if isinstance(agent_name, bytes) else agent_name


def wait_notif(agent, sender, want, timeout=30):
    deadline = time.monotonic() + timeout
    got = []
    while time.monotonic() < deadline:
        for agent_name, msgs in agent.get_new_notifs().items():
            got += [(name_of(agent_name), m) for m in msgs]
        if any(a == sender and m == want for a, m in got):
            return got
        time.sleep(0.0005)
    raise TimeoutError(f"no notification {want!r} from {sender} within {timeout} s (got {got})")


def make_agent(name):
    agent = nixl_agent(name, nixl_agent_config(backends=["PODLINK"]))
    if "PODLINK" not in agent.backends:
        # NIXL only warns when a backend's plugin is missing; vLLM would fail later with a KeyError.
        raise RuntimeError("NIXL has no PODLINK backend: put libplugin_PODLINK.so in NIXL_PLUGIN_DIR")
    return agent


class Cache:
    """[layers x blocks x block_bytes] of host memory, one registered region per layer: a numpy array as the
    application has it (malloc'd: podlinkd's relay copies it), or podlink host memory (a memfd: mapped by the
    peer)."""

    def __init__(self, agent, ep, layers, blocks, block_bytes, memory):
        self.layers, self.blocks, self.block_bytes = layers, blocks, block_bytes
        size = layers * blocks * block_bytes
        self.mem = ep.alloc_host(size) if memory == "podlink" else np.zeros(size, dtype=np.uint8)
        self.base = self.mem.ctypes.data
        self.layer_bytes = blocks * block_bytes
        regs = [(self.base + l * self.layer_bytes, self.layer_bytes, 0, "") for l in range(layers)]
        self.reg = agent.register_memory(regs, "DRAM")

    def block(self, layer, block):
        o = layer * self.layer_bytes + block * self.block_bytes
        return self.mem[o:o + self.block_bytes]

    def descs(self):
        # Descriptor id = layer * blocks + block, as vLLM numbers them.
        return [(self.base + l * self.layer_bytes + b * self.block_bytes, self.block_bytes, 0)
                for l in range(self.layers) for b in range(self.blocks)]


def prefill(args):
    agent = make_agent("prefill")
    ep = podlink.Endpoint()
    cache = Cache(agent, ep, args.layers, args.blocks, args.block_bytes, args.memory)
    for l in range(args.layers):
        for b in range(args.blocks):
            cache.block(l, b)[:] = pattern(l, b, args.block_bytes)
    put_file(os.path.join(args.work, "prefill.json"),
             {"meta": agent.get_agent_metadata().hex(), "descs": cache.descs()})
    # 1. The pull: decode READs and notifies; prefill frees the blocks once the notification is here.
    got = wait_notif(agent, "decode", NOTIF, timeout=args.timeout)
    # 2. The push: decode's binary notification, then prefill WRITEs into decode's blocks with a notification.
    dec = wait_file(os.path.join(args.work, "decode.json"), args.timeout)
    reg_msg = bytes.fromhex(dec["push_notif"])
    got += wait_notif(agent, "decode", reg_msg, timeout=args.timeout)
    name = name_of(agent.add_remote_agent(bytes.fromhex(dec["meta"])))
    assert name == "decode", name
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", cache.descs(), "DRAM")
    remote = agent.prep_xfer_dlist("decode", [tuple(d) for d in dec["descs"]], "DRAM")
    src_ids = [l * args.blocks + b for l in range(args.layers) for b in dec["push_src_blocks"]]
    dst_ids = [l * dec["blocks"] + b for l in range(args.layers) for b in dec["push_dst_blocks"]]
    h = agent.make_prepped_xfer("WRITE", local, src_ids, remote, dst_ids, notif_msg=b"pushed")
    for _ in range(args.reposts):  # the same prepared handle, posted again after each completion
        state = agent.transfer(h)
        assert state != "ERR", state
        wait_xfer(agent, h, "WRITE into decode", args.timeout)
    agent.release_xfer_handle(h)
    local.release()
    remote.release()
    wait_file(os.path.join(args.work, "decode-done.json"), args.timeout)
    agent.remove_remote_agent("decode")
    agent.deregister_memory(cache.reg)
    # Each notification as sender, length and its first bytes (the whole of a 2 KiB one says nothing more).
    print(json.dumps({"role": "prefill", "notifs": [[a, len(m), m[:16].hex()] for a, m in got], "ok": True}),
          flush=True)


def decode(args):
    agent = make_agent("decode")
    ep = podlink.Endpoint()
    blocks = args.blocks * 2  # the two sides have different block counts, as in vLLM
    cache = Cache(agent, ep, args.layers, blocks, args.block_bytes, args.memory)
    pre = wait_file(os.path.join(args.work, "prefill.json"), args.timeout)
    name = name_of(agent.add_remote_agent(bytes.fromhex(pre["meta"])))
    assert name == "prefill", name
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", cache.descs(), "DRAM")
    remote = agent.prep_xfer_dlist("prefill", [tuple(d) for d in pre["descs"]], "DRAM")
    rng = np.random.default_rng(7)
    # Scattered, non-contiguous block ids on both sides (NIXL cannot merge them).
    src_blocks = [int(b) for b in rng.choice(args.blocks, size=args.blocks // 2, replace=False)]
    dst_blocks = [int(b) for b in rng.choice(blocks, size=len(src_blocks), replace=False)]
    src_ids = [l * args.blocks + b for l in range(args.layers) for b in src_blocks]
    dst_ids = [l * blocks + b for l in range(args.layers) for b in dst_blocks]
    h = agent.make_prepped_xfer("READ", local, dst_ids, remote, src_ids, notif_msg=NOTIF)
    t0 = time.perf_counter()
    state = agent.transfer(h)
    assert state != "ERR", state
    wait_xfer(agent, h, "READ from prefill", args.timeout)
    seconds = time.perf_counter() - t0
    agent.release_xfer_handle(h)
    bad = []
    for l in range(args.layers):
        for s, d in zip(src_blocks, dst_blocks):
            if not np.array_equal(cache.block(l, d), pattern(l, s, args.block_bytes)):
                bad.append([l, s, d])
    # The push mode: a binary notification (vLLM's PUSH_REG: + msgpack), then prefill writes into us.
    push_notif = b"PUSH_REG:" + bytes(range(256)) * 8
    push_src = [int(b) for b in rng.choice(args.blocks, size=4, replace=False)]
    push_dst = [int(b) for b in rng.choice(blocks, size=4, replace=False)]
    put_file(os.path.join(args.work, "decode.json"),
             {"meta": agent.get_agent_metadata().hex(), "descs": cache.descs(), "blocks": blocks,
              "push_notif": push_notif.hex(), "push_src_blocks": push_src, "push_dst_blocks": push_dst})
    agent.send_notif("prefill", push_notif)
    notifs = []
    deadline = time.monotonic() + args.timeout
    while sum(1 for a, m in notifs if a == "prefill" and m == b"pushed") < args.reposts:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{args.reposts} 'pushed' notifications did not all arrive (got {notifs})")
        for agent_name, msgs in agent.get_new_notifs().items():
            notifs += [(name_of(agent_name), m) for m in msgs]
        time.sleep(0.0005)
    for l in range(args.layers):
        for s, d in zip(push_src, push_dst):
            if not np.array_equal(cache.block(l, d), pattern(l, s, args.block_bytes)):
                bad.append(["push", l, s, d])
    local.release()
    remote.release()
    agent.remove_remote_agent("prefill")
    agent.deregister_memory(cache.reg)
    moved = args.layers * len(src_blocks) * args.block_bytes
    out = {"role": "decode", "memory": args.memory, "read_descs": len(src_ids), "read_bytes": moved, "read_seconds": seconds,
           "read_gbps": moved / seconds / 1e9, "pushed_notifs": len(notifs), "bad_blocks": bad,
           "ok": not bad and len(notifs) == args.reposts}
    put_file(os.path.join(args.work, "decode-done.json"), out)
    print(json.dumps(out), flush=True)
    return out["ok"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["prefill", "decode"])
    p.add_argument("work")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--block-bytes", type=int, default=16 << 10)
    p.add_argument("--reposts", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--memory", choices=["numpy", "podlink"], default="numpy")
    args = p.parse_args()
    if args.role == "prefill":
        prefill(args)
        return 0
    return 0 if decode(args) else 1


if __name__ == "__main__":
    sys.exit(main())
