"""podlink for Python: one-sided writes and reads between pods, through podlinkd.

    import podlink
    with podlink.Endpoint() as ep:                      # podlinkd at $PODLINK_SOCKET_DIR or /run/podlink
        kv = ep.alloc_host(64 << 20)                    # numpy uint8 array in memory podlinkd can share
        region = ep.reg(kv)
        wire = ep.describe(region)                      # bytes: send them through your own channel
        ...in the peer...
        peer = ep.open(wire)
        ep.write(region, peer)                          # every byte is in the peer's memory on return
        ep.notify(peer, 42)                             # delivered after the data is visible

Memory must be memory podlinkd can hand to another pod: what `alloc_host` / `alloc_gpu` return (and any
contiguous view of it: numpy slices, `torch.from_numpy`, memoryview), or GPU memory allocated with cuMem and a
POSIX-FD handle type. Anything else is refused with `InvalidArgument` (podlink never copies it silently).

Errors are `podlink.Error` subclasses that are also the matching built-in exceptions: `PermissionDenied`
(PermissionError), `NotFound` (LookupError), `Timeout` (TimeoutError), `InvalidArgument` (ValueError),
`Unavailable` (ConnectionError), `FailedPrecondition`, `AlreadyExists`, `ResourceExhausted`; each has `.code`,
podlinkd's status code name. Every call that can block releases the GIL.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _podlink
from ._podlink import (  # noqa: F401  (re-exported)
    AlreadyExists,
    Error,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Timeout,
    Unavailable,
)

__version__ = "0.1.0"
__all__ = [
    "Endpoint", "Region", "RemoteRegion", "Transfer", "Error", "PermissionDenied", "NotFound", "Timeout",
    "InvalidArgument", "Unavailable", "FailedPrecondition", "AlreadyExists", "ResourceExhausted",
]


def _torch():
    try:
        import torch  # noqa: WPS433
        return torch
    except ImportError:
        return None


def _numpy():
    try:
        import numpy  # noqa: WPS433
        return numpy
    except ImportError:
        return None


def _memory_of(obj: Any) -> Tuple[int, int, bool, int]:
    """(address, nbytes, is_cuda, device) of a contiguous object; InvalidArgument otherwise."""
    if isinstance(obj, Region):
        raise InvalidArgument("already a Region: pass it to write/read directly")
    if isinstance(obj, (_podlink.HostMemory,)):
        return obj.address, obj.nbytes, False, -1
    if isinstance(obj, _podlink.GpuMemory):
        return obj.address, obj.nbytes, True, obj.device
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        if not obj.is_contiguous():
            raise InvalidArgument("the tensor is not contiguous: register tensor.contiguous() (a copy) or a "
                                  "contiguous view of podlink memory")
        nbytes = obj.numel() * obj.element_size()
        return obj.data_ptr(), nbytes, obj.is_cuda, (obj.device.index if obj.is_cuda else -1)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") not in (None,):
            raise InvalidArgument("only C-contiguous CUDA arrays can be registered")
        n = 1
        for d in cai["shape"]:
            n *= d
        itemsize = int(cai["typestr"][2:])
        return int(cai["data"][0]), n * itemsize, True, -1
    np = _numpy()
    if np is not None and isinstance(obj, np.ndarray):
        if not obj.flags["C_CONTIGUOUS"]:
            raise InvalidArgument("the array is not C-contiguous: register np.ascontiguousarray(a) (a copy) or a "
                                  "contiguous view of podlink memory")
        return obj.__array_interface__["data"][0], obj.nbytes, False, -1
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument(f"cannot register a {type(obj).__name__}: pass a numpy array, torch tensor, "
                              "memoryview or podlink allocation") from None
    if not mv.c_contiguous:
        raise InvalidArgument("the buffer is not contiguous")
    if np is not None:
        a = np.frombuffer(mv, dtype=np.uint8)
        return a.__array_interface__["data"][0], a.nbytes, False, -1
    import ctypes  # noqa: WPS433
    c = (ctypes.c_char * mv.nbytes).from_buffer(mv)  # TypeError for read-only buffers
    return ctypes.addressof(c), mv.nbytes, False, -1


def _writable_host(obj: Any) -> Any:
    """What keeps host memory registered as it is in place: the object, or a memoryview of it (an exported
    buffer cannot be resized, so its address stays); InvalidArgument for read-only memory, which peers would
    write into."""
    np = _numpy()
    if np is not None and isinstance(obj, np.ndarray):
        if not obj.flags["WRITEABLE"]:
            raise InvalidArgument("the array is read-only: peers could write into it")
        return obj
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj
    mv = memoryview(obj)
    if mv.readonly:
        raise InvalidArgument(f"a read-only {type(obj).__name__} cannot be registered: peers could write into it "
                              "(use a bytearray or a numpy array)")
    return (obj, mv)


class Region:
    """Memory of this process registered with an Endpoint (a view of one registered allocation)."""

    __slots__ = ("_ep", "_local", "_offset", "_nbytes", "_keep", "is_cuda", "device", "stream")

    def __init__(self, ep, local, offset, nbytes, keep, is_cuda, device):
        self._ep, self._local, self._offset, self._nbytes = ep, local, offset, nbytes
        self._keep, self.is_cuda, self.device = keep, is_cuda, device
        self.stream = None

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def export_id(self) -> int:
        return self._local.export_id

    def __repr__(self):
        return f"<podlink.Region export {self.export_id} +{self._offset} {self._nbytes} B>"


class RemoteRegion:
    """A peer's region, opened by an Endpoint."""

    __slots__ = ("_ep", "_remote", "_closed", "_mapped")

    def __init__(self, ep, remote):
        self._ep, self._remote, self._closed, self._mapped = ep, remote, False, None

    @property
    def nbytes(self) -> int:
        return self._remote.nbytes

    @property
    def transport(self) -> str:
        """How bytes reach it: host (its memory mapped here), direct (its GPU memory mapped here), relay
        (podlinkd copies) or mesh (another node)."""
        return self._remote.transport

    def close(self) -> None:
        """Drops this process's opening (transfers to it must be complete). Tensors from tensor() keep
        their own mapping."""
        if not self._closed:
            self._closed = True
            self._mapped = None
            self._ep._ep.close_remote(self._remote)

    def tensor(self, dtype=None, shape=None, offset: int = 0):
        """A torch CUDA tensor aliasing the peer's GPU memory, for kernels (torch ops, Triton, CUDA) to load
        and store over NVLink with no copy engine and no daemon on the path.

        Only for the direct transport (this pod may open the peer's GPU: podlink.io/peer-direct); otherwise
        FailedPrecondition. dtype defaults to torch.uint8, shape to the whole region from `offset`. The tensor
        holds the mapping: if the owner withdraws the region, the memory stays mapped until the tensor goes
        (writes then land in memory the owner no longer uses; nothing faults)."""
        if self._closed:
            raise FailedPrecondition("the remote region was closed")
        if self._mapped is None:
            self._mapped = self._ep._ep.map_remote(self._remote, self._ep.gpu)  # refuses other transports
        torch = _torch()
        if torch is None:
            raise FailedPrecondition("RemoteRegion.tensor needs torch")
        m = self._mapped
        dtype = dtype or torch.uint8
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset % itemsize:
            raise InvalidArgument(f"offset {offset} is not a multiple of the element size {itemsize}")
        raw = torch.as_tensor(m, device=f"cuda:{m.device}")
        if shape is None:
            count = (self.nbytes - offset) // itemsize
            shape = (count,)
        count = 1
        for d in shape:
            count *= int(d)
        if offset + count * itemsize > self.nbytes:
            raise InvalidArgument(f"{count} elements of {itemsize} bytes at {offset} do not fit the region's "
                                  f"{self.nbytes} bytes")
        return raw[offset:offset + count * itemsize].view(dtype).view(*shape)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<podlink.RemoteRegion export {self._remote.export_id} {self.nbytes} B via {self.transport}>"


class Transfer:
    """An asynchronous write or read: done() polls, wait() blocks (GIL released)."""

    __slots__ = ("_ep", "_batch", "_done", "_keep")

    def __init__(self, ep, batch, keep):
        self._ep, self._batch, self._done, self._keep = ep, batch, False, keep

    def done(self) -> bool:
        if not self._done:
            self._done = self._ep._ep.poll(self._batch)
        return self._done

    def wait(self, timeout: Optional[float] = None) -> None:
        """Returns once every byte is at its destination; Timeout leaves the transfer pending."""
        self._ep._ep.wait(self._batch, -1.0 if timeout is None else float(timeout))
        self._done = True
        self._keep = None


Op = Tuple[Region, int, RemoteRegion, int, int]


class Endpoint:
    """A session with this node's podlinkd and its transfer engine.

    gpu: the CUDA ordinal that runs in-process copies and `alloc_gpu` (default 0, or torch's current device).
    socket_dir: podlinkd's socket directory (default $PODLINK_SOCKET_DIR, else /run/podlink).
    """

    def __init__(self, gpu: Optional[int] = None, socket_dir: Optional[str] = None, *, timeout: float = 30.0,
                 allow_direct: bool = True, force_relay: bool = False):
        if gpu is None:
            torch = _torch()
            gpu = torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
        self.gpu = gpu
        self._ep = _podlink.Endpoint(socket_dir or "", gpu, allow_direct, force_relay, float(timeout))
        # alloc_host/alloc_gpu allocations by start address: (end, weak reference). A registered allocation
        # lives until unreg() or close() (peers may write into it); an unregistered one while something uses it
        # (the array or tensor handed out, a Region, a transfer in flight).
        self._allocs = {}
        self._registered = {}  # allocation start -> (Local, the memory: held while registered)
        self._by_export = {}   # export id -> allocation start, or the Region (memory registered in place)
        self._pending = []     # transfers not yet seen complete: they hold their memory until then

    # --- lifetime -----------------------------------------------------------
    def close(self) -> None:
        """Ends the session: podlinkd withdraws this endpoint's exports; opened regions are dropped."""
        self._ep.close()
        self._registered.clear()
        self._by_export.clear()
        self._allocs.clear()
        self._pending.clear()

    def _forget(self, start: int) -> None:
        """An allocation's last user went: withdraw its export (before the memory is unmapped)."""
        self._allocs.pop(start, None)
        local = self._registered.pop(start, (None, None))[0]
        if local is not None:
            self._by_export.pop(local.export_id, None)
            if not self._ep.closed:
                try:
                    self._ep.unregister(local)
                except Error:
                    pass

    def _track(self, mem) -> None:
        start = mem.address
        self._allocs[start] = (start + mem.nbytes, weakref.ref(mem))
        weakref.finalize(mem, Endpoint._forget_weak, weakref.ref(self), start)

    @staticmethod
    def _forget_weak(ep_ref, start: int) -> None:
        ep = ep_ref()
        if ep is not None:
            ep._forget(start)

    @property
    def closed(self) -> bool:
        return self._ep.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- memory ---------------------------------------------------------------
    def alloc_host(self, nbytes: int):
        """Zero-filled host memory podlinkd can share: a numpy uint8 array (a memoryview without numpy)."""
        mem = self._ep.alloc_host(int(nbytes))
        self._track(mem)
        np = _numpy()
        return np.frombuffer(mem, dtype=np.uint8) if np is not None else memoryview(mem)

    def alloc_gpu(self, nbytes: int, gpu: Optional[int] = None):
        """Exportable GPU memory (size rounded up to the allocation granularity): a torch uint8 CUDA tensor
        when torch is importable, else an object with __cuda_array_interface__."""
        mem = self._ep.alloc_gpu(int(nbytes), self.gpu if gpu is None else gpu)
        self._track(mem)
        torch = _torch()
        if torch is None:
            return mem
        t = torch.as_tensor(mem, device=f"cuda:{mem.device}")
        return t

    def reg(self, obj: Any, name: Optional[str] = None) -> Region:
        """Registers `obj` (contiguous, writable) and returns its Region.

        Memory from alloc_host/alloc_gpu: the whole allocation holding it is exported once (named `name`, if
        given: peers then find it with `wait_for`) and the Region is the object's part of it; peers map it.
        Any other host memory (a numpy array, bytearray, memoryview, a CPU or pinned torch tensor) is
        registered as it is: podlinkd's relay copies it, and the object is held (a bytearray cannot be resized)
        until unreg. CUDA memory: see docs/python.md (cuMem with a POSIX-FD handle)."""
        addr, nbytes, is_cuda, device = _memory_of(obj)
        for start, (end, ref) in list(self._allocs.items()):
            mem = ref()
            if mem is not None and start <= addr and addr + nbytes <= end:
                local = self._registered.get(start, (None, None))[0]
                if local is None:
                    if isinstance(mem, _podlink.HostMemory):
                        local = self._ep.register_host(mem, name or "")
                    else:
                        local = self._ep.register_gpu(mem, name or "")
                    self._registered[start] = (local, mem)
                region = Region(self, local, addr - start, nbytes, (obj, mem), is_cuda,
                                getattr(mem, "device", -1))
                self._by_export.setdefault(local.export_id, start)
                return region
        if not is_cuda:
            keep = _writable_host(obj)
            local, offset = self._ep.register_host_range(addr, nbytes, name or "")
            region = Region(self, local, offset, nbytes, keep, False, -1)
            self._by_export.setdefault(local.export_id, region)
            return region
        try:
            local = self._ep.register_existing(addr, nbytes, name or "")
        except (InvalidArgument, FailedPrecondition, NotFound) as e:
            raise InvalidArgument(
                f"this CUDA memory is not memory podlink can share with another pod ({e}): allocate it with "
                "Endpoint.alloc_gpu(), or with cuMemCreate and a POSIX-FD handle type") from None
        region = Region(self, local, 0, nbytes, obj, True, device)
        self._by_export.setdefault(local.export_id, region)
        return region

    def unreg(self, region: Region) -> None:
        """Withdraws the allocation's export (every Region of it); transfers already submitted complete. The
        memory is freed once nothing uses it any more."""
        self._ep.unregister(region._local)
        for k, v in list(self._registered.items()):
            if v[0].export_id == region.export_id:
                del self._registered[k]
        self._by_export.pop(region.export_id, None)

    # --- descriptors ------------------------------------------------------------
    def describe(self, region: Region) -> bytes:
        """What a peer needs to open `region`'s allocation (ship it through your own channel)."""
        return self._ep.describe(region._local)

    def open(self, descriptor: bytes) -> RemoteRegion:
        """Opens a peer's region from its descriptor (podlinkd applies the owner's policy)."""
        if isinstance(descriptor, str):
            descriptor = descriptor.encode()
        return RemoteRegion(self, self._ep.open(bytes(descriptor)))

    def wait_for(self, name: str, timeout: float = 30.0) -> RemoteRegion:
        """Opens the export named `name` ("name" or "namespace/name") once it exists (Timeout after `timeout`)."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                return RemoteRegion(self, self._ep.open_named(name))
            except NotFound:
                if time.monotonic() >= deadline:
                    raise Timeout(f"no export named {name!r} that this pod may import appeared within "
                                  f"{timeout} s") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    # --- transfers --------------------------------------------------------------
    @staticmethod
    def _op(local: Region, local_offset: int, remote: RemoteRegion, remote_offset: int, length: Optional[int]):
        if not isinstance(local, Region) or not isinstance(remote, RemoteRegion):
            raise InvalidArgument("an operation is (Region, local_offset, RemoteRegion, remote_offset, length)")
        if remote._closed:
            raise FailedPrecondition("the remote region was closed")
        if length is None:
            length = min(local.nbytes - local_offset, remote.nbytes - remote_offset)
        if local_offset < 0 or remote_offset < 0 or length < 0:
            raise InvalidArgument("offsets and lengths must not be negative")
        if local_offset + length > local.nbytes:
            raise InvalidArgument(f"local range {local_offset}+{length} is outside the region's {local.nbytes} "
                                  "bytes")
        return (local._local, local._offset + local_offset, remote._remote, remote_offset, length)

    def _sync(self, device: int, stream) -> None:
        """Stream order for CUDA sources: what kernels queued before the call wrote is what is sent."""
        torch = _torch()
        if torch is None:
            return
        s = stream if stream is not None else torch.cuda.current_stream(device)
        s.synchronize()  # releases the GIL

    def prepare(self, ops: Iterable[Op]) -> "_podlink.Batch":
        """Checks and converts a list of (Region, local_offset, RemoteRegion, remote_offset, length) once, for
        writev/readv (and their async forms) to take as many times as you like: a KV hand-off that writes the
        same block list every step pays the per-operation cost once. The batch holds the regions it names;
        a remote region closed since is refused at submission."""
        return _podlink.prepare(ops)

    def _submit(self, ops, write: bool, stream) -> Transfer:
        batch = ops if isinstance(ops, _podlink.Batch) else _podlink.prepare(ops)
        if write and batch.cuda_device >= 0:
            self._sync(batch.cuda_device, stream)
        t = Transfer(self, self._ep.submit_batch(batch, write), batch)
        # Kept until seen complete, so their memory outlives them even if the caller drops the handle.
        self._pending = [p for p in self._pending if not p._done]
        if len(self._pending) > 64:
            self._pending = [p for p in self._pending if not p.done()]
        self._pending.append(t)
        return t

    def write_async(self, local: Region, remote: RemoteRegion, local_offset: int = 0, remote_offset: int = 0,
                    length: Optional[int] = None, stream=None) -> Transfer:
        return self._submit([(local, local_offset, remote, remote_offset, length)], True, stream)

    def read_async(self, local: Region, remote: RemoteRegion, local_offset: int = 0, remote_offset: int = 0,
                   length: Optional[int] = None) -> Transfer:
        return self._submit([(local, local_offset, remote, remote_offset, length)], False, None)

    def writev_async(self, ops: Sequence[Op], stream=None) -> Transfer:
        return self._submit(ops, True, stream)

    def readv_async(self, ops: Sequence[Op]) -> Transfer:
        return self._submit(ops, False, None)

    def write(self, local: Region, remote: RemoteRegion, local_offset: int = 0, remote_offset: int = 0,
              length: Optional[int] = None, stream=None, timeout: Optional[float] = None) -> None:
        """Writes `length` bytes (default: as many as both sides hold) into the peer's region; returns once
        they are there. A CUDA source is sent as the kernels queued before this call on `stream` (default:
        torch's current stream) left it."""
        if timeout is not None:
            self.write_async(local, remote, local_offset, remote_offset, length, stream).wait(timeout)
            return
        op = self._op(local, local_offset, remote, remote_offset, length)
        if local.is_cuda:
            self._sync(local.device, stream)
        self._ep.transfer(*op, True)  # one call, one release of the GIL

    def read(self, local: Region, remote: RemoteRegion, local_offset: int = 0, remote_offset: int = 0,
             length: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Reads from the peer's region; on return the bytes are in `local` (visible to later kernels)."""
        if timeout is not None:
            self.read_async(local, remote, local_offset, remote_offset, length).wait(timeout)
            return
        self._ep.transfer(*self._op(local, local_offset, remote, remote_offset, length), False)

    def writev(self, ops: Sequence[Op], stream=None, timeout: Optional[float] = None) -> None:
        """Writes a list of (Region, local_offset, RemoteRegion, remote_offset, length), or a Batch from
        prepare(), as one batch."""
        self.writev_async(ops, stream).wait(timeout)

    def readv(self, ops: Sequence[Op], timeout: Optional[float] = None) -> None:
        self.readv_async(ops).wait(timeout)

    # --- notifications -------------------------------------------------------------
    #: The most bytes one notification carries.
    MAX_NOTIFY_BYTES = 4096

    def notify(self, remote: RemoteRegion, value: Union[int, bytes, bytearray, memoryview]) -> None:
        """Tells the owner of `remote` `value` once every earlier transfer of this endpoint is visible.

        `value` is an int (64 bits) or bytes (at most MAX_NOTIFY_BYTES; a peer on this node only)."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            self._ep.notify_bytes(remote._remote, bytes(value))
        else:
            self._ep.notify(remote._remote, int(value))

    def notifications(self) -> List[Tuple[Optional[Region], Union[int, bytes]]]:
        """Notifications peers sent to this endpoint's regions since the last call: (Region, value), value an
        int or, for a notification sent with bytes, bytes."""
        out = []
        for eid, value in self._ep.notifications():
            out.append((self._region_of(eid), value))
        return out

    def _region_of(self, export_id: int) -> Optional[Region]:
        """A Region of a whole allocation of this endpoint (or the registered memory) by its export id."""
        entry = self._by_export.get(export_id)
        if isinstance(entry, Region) or entry is None:
            return entry
        local, mem = self._registered.get(entry, (None, None))
        if local is None:
            return None
        return Region(self, local, 0, mem.nbytes, mem, isinstance(mem, _podlink.GpuMemory), getattr(mem, "device", -1))

    def __repr__(self):
        state = "closed" if self.closed else f"session {self._ep.session_id}"
        return f"<podlink.Endpoint {state}>"
