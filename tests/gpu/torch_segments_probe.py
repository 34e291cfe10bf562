#!/usr/bin/env python3
"""What torch's allocator hands out, as the CUDA driver sees it (run on a GPU machine; no podlink involved).

For tensors from expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, set here before torch
loads) and, in a child process, from the default caching allocator: the cuMem allocations under each tensor
(cuMemGetAddressRange and cuMemRetainAllocationHandle at each chunk, walked from the tensor's first byte), each
one's size, requested handle types and device. One JSON line per tensor; the facts the multi-chunk export
(client-lib/engine/existing_range.cc) is built on.

    python3 tests/gpu/torch_segments_probe.py [default]
"""
import ctypes
import json
import os
import subprocess
import sys

DEFAULT = len(sys.argv) > 1 and sys.argv[1] == "default"
if not DEFAULT:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402

cuda = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64


def walk(addr, nbytes, limit=4096):
    """The allocations under [addr, addr + nbytes): one entry per mapped chunk."""
    chunks = []
    p = addr
    while p < addr + nbytes and len(chunks) < limit:
        base, size = u64(0), ctypes.c_size_t(0)
        rc = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), u64(p))
        entry = {"at": p - addr, "range_rc": rc, "base_off": base.value - addr if rc == 0 else None,
                 "size": size.value}
        h = u64(0)
        rrc = cuda.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(p))
        entry["retain_rc"] = rrc
        if rrc == 0:
            prop = (ctypes.c_int * 16)()
            entry["prop_rc"] = cuda.cuMemGetAllocationPropertiesFromHandle(prop, h)
            entry["type"], entry["handle_types"], entry["loc_type"], entry["loc_id"] = prop[0], prop[1], prop[2], prop[3]
            cuda.cuMemRelease(h)
        chunks.append(entry)
        if rc != 0 or size.value == 0:
            break
        p = base.value + size.value
    return chunks


def report(name, t):
    addr, nbytes = t.data_ptr(), t.numel() * t.element_size()
    chunks = walk(addr, nbytes)
    sizes = sorted({c["size"] for c in chunks})
    print(json.dumps({"allocator": "default" if DEFAULT else "expandable_segments", "tensor": name, "nbytes": nbytes,
                      "chunks": len(chunks), "chunk_sizes": sizes, "first": chunks[0], "last": chunks[-1],
                      "contiguous": all(chunks[i]["base_off"] + chunks[i]["size"] == chunks[i + 1]["base_off"]
                                        for i in range(len(chunks) - 1) if chunks[i]["base_off"] is not None
                                        and chunks[i + 1]["base_off"] is not None)}), flush=True)


def main():
    torch.cuda.init()
    if not DEFAULT:
        print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                          "gpu": torch.cuda.get_device_name(0)}), flush=True)
    a = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    b = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    report("a (1 MiB)", a)
    report("b (1 MiB, after a)", b)
    big = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    report("big (256 MiB)", big)
    report("big[5 MiB + 512:]", big[(5 << 20) + 512:])
    kv = torch.zeros((2, 64, 16, 8, 128), dtype=torch.float16, device="cuda")
    report("kv-shaped (2x64x16x8x128 fp16)", kv)
    if not DEFAULT:
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
        subprocess.run([sys.executable, __file__, "default"], env=env, check=False)


if __name__ == "__main__":
    main()
