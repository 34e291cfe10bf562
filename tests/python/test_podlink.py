"""`import podlink` on host memory: two endpoints of this process (one identity), then pods of their own."""
import threading
import time

import numpy as np
import pytest

import podlink


def pattern(seed, n):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


@pytest.fixture
def pair(daemon):
    a, b = podlink.Endpoint(), podlink.Endpoint()
    yield a, b
    b.close()
    a.close()


def test_write_and_read_between_endpoints(pair):
    a, b = pair
    dst = a.alloc_host(1 << 20)
    region_a = a.reg(dst)
    src = b.alloc_host(1 << 20)
    src[:] = pattern(1, src.size)
    region_b = b.reg(src)
    remote = b.open(a.describe(region_a))
    assert remote.nbytes == 1 << 20
    assert remote.transport == "host"
    b.write(region_b, remote)
    assert np.array_equal(dst, pattern(1, dst.size))
    # A part, at offsets, and read back into another part.
    b.write(region_b, remote, local_offset=4096, remote_offset=100, length=5000)
    assert np.array_equal(dst[100:5100], pattern(1, src.size)[4096:9096])
    back = b.alloc_host(8192)
    b.read(b.reg(back), remote, remote_offset=100, length=5000)
    assert np.array_equal(back[:5000], dst[100:5100])


def test_views_register_as_their_part_of_the_allocation(pair):
    a, b = pair
    dst = a.alloc_host(1 << 16)
    remote = b.open(a.describe(a.reg(dst)))
    src = b.alloc_host(1 << 16)
    view = src[1000:3000]  # a slice of podlink memory registers as itself
    view[:] = 7
    b.write(b.reg(view), remote, remote_offset=0)
    assert (dst[:2000] == 7).all() and (dst[2000:] == 0).all()
    mv = memoryview(src)[5000:5008]
    b.write(b.reg(mv), remote, remote_offset=9000)
    assert (dst[9000:9008] == src[5000:5008]).all()


def test_writev_scattered_blocks_like_a_paged_kv_cache(pair):
    a, b = pair
    block, n = 4096, 64
    cache = a.alloc_host(2 * n * block)
    remote = b.open(a.describe(a.reg(cache)))
    src = b.alloc_host(n * block)
    src[:] = pattern(3, src.size)
    local = b.reg(src)
    ids = np.random.default_rng(5).permutation(2 * n)[:n]
    b.writev([(local, i * block, remote, int(bid) * block, block) for i, bid in enumerate(ids)])
    b.notify(remote, 99)
    got = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        got = a.notifications()
    assert [v for _, v in got] == [99]
    assert got[0][0] is not None and got[0][0].nbytes == cache.size
    for i, bid in enumerate(ids):
        assert np.array_equal(cache[bid * block:(bid + 1) * block], src[i * block:(i + 1) * block]), i


def test_async_transfers(pair):
    a, b = pair
    dst = a.alloc_host(4 << 20)
    remote = b.open(a.describe(a.reg(dst)))
    src = b.alloc_host(4 << 20)
    src[:] = pattern(4, src.size)
    local = b.reg(src)
    handles = [b.write_async(local, remote, i << 20, i << 20, 1 << 20) for i in range(4)]
    for h in handles:
        h.wait(timeout=10)
        assert h.done()
    assert np.array_equal(dst, src)
    back = b.alloc_host(4 << 20)
    h = b.readv_async([(b.reg(back), 0, remote, 0, 4 << 20)])
    h.wait()
    assert np.array_equal(back, src)


def test_bad_ranges_are_value_errors(pair):
    a, b = pair
    dst = a.alloc_host(4096)
    remote = b.open(a.describe(a.reg(dst)))
    local = b.reg(b.alloc_host(8192))
    with pytest.raises(ValueError):
        b.write(local, remote, length=8192)  # past the remote region
    with pytest.raises(podlink.InvalidArgument) as e:
        b.write(local, remote, remote_offset=4000, length=200)
    assert e.value.code in ("INVALID_ARGUMENT", "OUT_OF_RANGE")
    with pytest.raises(ValueError):
        b.write(local, remote, local_offset=8000, length=500)  # past the local region
    with pytest.raises(ValueError):
        b.write(local, remote, length=-1)


def test_a_prepared_batch_is_checked_once_and_reused(pair):
    a, b = pair
    block, n = 4096, 32
    cache = a.alloc_host(2 * n * block)
    remote = b.open(a.describe(a.reg(cache)))
    src = b.alloc_host(n * block)
    local = b.reg(src)
    ids = np.random.default_rng(7).permutation(2 * n)[:n]
    batch = b.prepare([(local, i * block, remote, int(bid) * block, block) for i, bid in enumerate(ids)])
    assert (batch.count, batch.nbytes, batch.cuda_device) == (n, n * block, -1)
    for seed in (1, 2, 3):  # the same batch, new bytes each time
        src[:] = pattern(seed, src.size)
        b.writev(batch)
        for i, bid in enumerate(ids):
            assert np.array_equal(cache[bid * block:(bid + 1) * block], src[i * block:(i + 1) * block]), (seed, i)
    back = b.alloc_host(n * block)
    b.readv_async(b.prepare([(b.reg(back), i * block, remote, int(bid) * block, block)
                             for i, bid in enumerate(ids)])).wait(timeout=10)
    assert np.array_equal(back, src)
    # A length left out is as much as both sides hold.
    b.writev([(local, 0, remote, 2 * n * block - 100)])
    assert np.array_equal(cache[-100:], src[:100])
    remote.close()
    with pytest.raises(podlink.FailedPrecondition, match="closed"):
        b.writev(batch)  # its remote region was closed since


def test_bad_operation_lists_are_value_errors(pair):
    a, b = pair
    remote = b.open(a.describe(a.reg(a.alloc_host(8192))))
    local = b.reg(b.alloc_host(4096))
    bad = [
        [(local, 0, remote)],                  # too short
        [(remote, 0, local, 0, 16)],           # the regions swapped
        [(local, 0, "remote", 0, 16)],         # not a region
        [42],                                  # not an operation
        [(local, -1, remote, 0, 16)],          # negative offset
        [(local, 0, remote, 0, -5)],           # negative length
        [(local, 0.5, remote, 0, 16)],         # not an integer
        [(local, 4000, remote, 0, 200)],       # past the local region
        [(local, 0, remote, 0, 1 << 70)],      # too large
    ]
    for ops in bad:
        with pytest.raises(ValueError):
            b.writev(ops)
        with pytest.raises(ValueError):
            b.prepare(ops)
    with pytest.raises(ValueError):
        b.writev([(local, 0, remote, 8000, 200)])  # past the remote region (podlinkd's check)


def test_memory_podlink_cannot_share_is_refused(pair):
    a, _ = pair
    ro = np.zeros(100, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        a.reg(ro)
    with pytest.raises(ValueError, match="read-only"):
        a.reg(b"immutable bytes")
    buf = a.alloc_host(4096)
    with pytest.raises(ValueError, match="contiguous"):
        a.reg(buf.reshape(64, 64)[:, :8])
    with pytest.raises(ValueError):
        a.reg(object())


def test_tensor_needs_the_direct_transport(pair):
    a, b = pair
    remote = b.open(a.describe(a.reg(a.alloc_host(4096))))
    with pytest.raises(podlink.FailedPrecondition, match="direct transport"):
        remote.tensor()


def test_descriptor_garbage(pair):
    _, b = pair
    for bad in (b"", b"garbage", b"podlink1;x;y;z;w;v", b"podlink1;" + b"9" * 100, b"\xff" * 70000):
        with pytest.raises(podlink.Error) as e:
            b.open(bad)
        assert isinstance(e.value, (ValueError, LookupError)), (bad[:20], e.value)


def test_use_after_close(daemon):
    a, b = podlink.Endpoint(), podlink.Endpoint()
    dst = a.alloc_host(4096)
    remote = b.open(a.describe(a.reg(dst)))
    local = b.reg(b.alloc_host(4096))
    b.close()
    assert b.closed
    with pytest.raises(podlink.FailedPrecondition):
        b.write(local, remote)
    with pytest.raises(podlink.FailedPrecondition):
        b.alloc_host(10)
    # The closed remote: refused before it reaches podlinkd.
    with podlink.Endpoint() as c:
        r = c.open(a.describe(a.reg(dst)))
        r.close()
        with pytest.raises(podlink.FailedPrecondition):
            c.write(c.reg(c.alloc_host(16)), r)
    a.close()


def test_named_exports_and_wait_for(pair):
    a, b = pair
    buf = a.alloc_host(4096)
    buf[:] = 5

    def export_later():
        time.sleep(0.3)
        a.reg(buf, name="kv-later")

    t = threading.Thread(target=export_later)
    t.start()
    remote = b.wait_for("kv-later", timeout=10)
    t.join()
    back = b.alloc_host(4096)
    b.read(b.reg(back), remote)
    assert (back == 5).all()
    b.notify(remote, 3)  # a region opened by name is opened like any other (podlinkd's import record stays)
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        got = a.notifications()
    assert [v for _, v in got] == [3]
    with pytest.raises(TimeoutError):
        b.wait_for("never-exported", timeout=0.2)


def test_the_gil_is_released_while_a_transfer_runs(pair):
    a, b = pair
    n = 256 << 20
    dst = a.alloc_host(n)
    remote = b.open(a.describe(a.reg(dst)))
    local = b.reg(b.alloc_host(n))
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    best = 0
    for _ in range(3):
        before = count[0]
        t0 = time.monotonic()
        b.write(local, remote)
        took = time.monotonic() - t0
        best = max(best, (count[0] - before) / max(took, 1e-6))
    stop.set()
    t.join()
    # Held for the call, the other thread would count almost nothing during it.
    assert best > 10000, f"{best:.0f} increments per second of transfer"


def test_exports_go_with_the_endpoint(daemon):
    before = daemon.metric("podlink_exports")
    with podlink.Endpoint() as ep:
        for _ in range(3):
            ep.reg(ep.alloc_host(4096))
        assert daemon.metric("podlink_exports") == before + 3
    deadline = time.monotonic() + 5
    while daemon.metric("podlink_exports") != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.metric("podlink_exports") == before


def test_registered_memory_stays_until_unreg(daemon):
    import gc
    with podlink.Endpoint() as ep:
        before = daemon.metric("podlink_exports")
        buf = ep.alloc_host(1 << 20)
        region = ep.reg(buf)
        assert daemon.metric("podlink_exports") == before + 1
        del buf
        gc.collect()
        assert daemon.metric("podlink_exports") == before + 1  # registered: peers may still write into it
        ep.unreg(region)
        assert daemon.metric("podlink_exports") == before
        del region
        gc.collect()
        assert not ep._allocs and not ep._registered           # unregistered and unused: freed
        tmp = ep.alloc_host(4096)
        del tmp
        gc.collect()
        assert not ep._allocs


def test_errors_are_builtin_exceptions_too():
    assert issubclass(podlink.PermissionDenied, PermissionError)
    assert issubclass(podlink.NotFound, LookupError)
    assert issubclass(podlink.Timeout, TimeoutError)
    assert issubclass(podlink.InvalidArgument, ValueError)
    assert issubclass(podlink.Unavailable, ConnectionError)
    for cls in (podlink.PermissionDenied, podlink.FailedPrecondition, podlink.ResourceExhausted):
        assert issubclass(cls, podlink.Error)


def test_no_daemon_is_a_connection_error(tmp_path):
    with pytest.raises(ConnectionError):
        podlink.Endpoint(socket_dir=str(tmp_path), timeout=2)


# --- pods of their own -------------------------------------------------------------------------------

def test_pods_of_one_group_share_and_other_groups_are_denied(pods):
    pods.plan([("prefill", "job-1"), ("decode", "job-1"), ("stranger", "job-2")])
    decode, prefill, stranger = pods("decode"), pods("prefill"), pods("stranger")
    exp = decode.call(cmd="export", nbytes=1 << 20, name="kv")
    assert "descriptor" in exp, exp
    opened = prefill.call(cmd="open", descriptor=exp["descriptor"])
    assert opened.get("nbytes") == 1 << 20, opened
    assert prefill.call(cmd="write", seed=11, nbytes=1 << 20) == {"written": 1 << 20}
    assert prefill.call(cmd="notify", value=5) == {}
    assert decode.call(cmd="notifications", timeout=5)["values"] == [5]
    assert decode.call(cmd="check", seed=11)["ok"]
    denied = stranger.call(cmd="open", descriptor=exp["descriptor"])
    assert denied.get("error") == "PermissionDenied", denied
    assert "podlink.io/peer-group" in denied["message"]


@pytest.mark.parametrize("force_relay", [False, True])
def test_notifications_with_bytes_between_pods(pods, force_relay):
    pods.plan([("producer", "job-1"), ("consumer", "job-1")])
    producer, consumer = pods("producer"), pods("consumer")
    exp = consumer.call(cmd="export", nbytes=1 << 20)
    transport = producer.call(cmd="open", descriptor=exp["descriptor"], force_relay=force_relay)["transport"]
    assert transport == ("relay" if force_relay else "host")
    # Each notification arrives after its write landed, in order, with its bytes (also at the 4 KiB bound).
    consumer.send(cmd="receive_rounds", count=50, seed=40, nbytes=16 << 10)
    assert producer.call(cmd="write_notify", count=50, seed=40, nbytes=16 << 10) == {"rounds": 50}
    got = consumer.expect(timeout=30)
    assert got == {"rounds": list(range(50)), "bad": []}, got
    at_bound = bytes(range(256)) * 16
    assert len(at_bound) == podlink.Endpoint.MAX_NOTIFY_BYTES
    assert producer.call(cmd="notify", message=at_bound.hex()) == {}
    assert producer.call(cmd="notify", message=b"".hex()) == {}  # empty is a message too
    assert producer.call(cmd="notify", value=7) == {}            # values keep working beside bytes
    assert consumer.call(cmd="notifications", want=3)["values"] == [at_bound.hex(), "", 7]
    over = producer.call(cmd="notify", message=(at_bound + b"!").hex())
    assert over.get("error") in ("InvalidArgument", "ValueError"), over
    assert "4096" in over["message"]


@pytest.mark.parametrize("memory", ["numpy", "bytearray", "slice", "podlink"])
def test_host_memory_as_the_application_has_it_between_pods(pods, memory):
    """reg() of a numpy array, a bytearray, a slice of an array and podlink memory, written and read back by
    a peer in another pod (whose own memory is a numpy array), checked at every size moved."""
    pods.plan([("owner", "job-1"), ("peer", "job-1")])
    owner, peer = pods("owner"), pods("peer")
    size = (4 << 20) + 3
    exp = owner.call(cmd="export", nbytes=size, memory=memory)
    assert "error" not in exp, exp
    opened = peer.call(cmd="open", descriptor=exp["descriptor"])
    # Memory as it is cannot be mapped by the peer: podlinkd's relay copies it; a memfd is mapped.
    assert opened["transport"] == ("host" if memory == "podlink" else "relay"), opened
    for seed, n in enumerate([1, 4096, 65537, size], start=10):
        assert peer.call(cmd="write", seed=seed, nbytes=n, memory="numpy") == {"written": n}
        assert owner.call(cmd="check", seed=seed, offset=0, length=n) == {"ok": True, "first_bad": -1}, n
    assert owner.call(cmd="fill", seed=99) == {}
    for n in [1, 4096, size]:
        assert peer.call(cmd="read", seed=99, nbytes=n, memory="bytearray") == {"ok": True, "first_bad": -1}, n


def test_host_memory_unmapped_mid_transfer_fails_clearly(pods):
    d = pods.plan([("owner", "job-1"), ("reader", "job-1")])
    owner, reader = pods("owner"), pods("reader")
    exp = owner.call(cmd="export", nbytes=16 << 20, memory="mmap")
    reader.call(cmd="open", descriptor=exp["descriptor"])
    assert owner.call(cmd="fill", seed=5) == {}
    assert reader.call(cmd="read", seed=5, nbytes=16 << 20, memory="numpy") == {"ok": True, "first_bad": -1}
    assert owner.call(cmd="unmap") == {}  # an application bug: the memory goes while it is registered
    answer = reader.call(cmd="read", seed=5, nbytes=16 << 20, memory="numpy", timeout=20)
    assert answer.get("error") == "FailedPrecondition", answer
    # The relay's completion carries the code; podlinkd's log the reason.
    assert d.logged("the range was unmapped"), "podlinkd did not log why"
    # podlinkd is unharmed: the owner's other memory still moves.
    exp2 = owner.call(cmd="export", nbytes=4096, memory="numpy")
    reader.call(cmd="open", descriptor=exp2["descriptor"])
    assert reader.call(cmd="write", seed=6, nbytes=4096, memory="numpy") == {"written": 4096}
    assert owner.call(cmd="check", seed=6, offset=0, length=4096) == {"ok": True, "first_bad": -1}
    assert d.alive()


@pytest.mark.parametrize("memory", ["podlink", "numpy"])
def test_a_peer_killed_mid_transfer(pods, memory):
    d = pods.plan([("owner", "job-1"), ("writer", "job-1")])
    owner, writer = pods("owner"), pods("writer")
    fds_before = d.fds()
    exp = owner.call(cmd="export", nbytes=64 << 20, memory=memory)
    # Through podlinkd's relay, so the owner's death is podlinkd's business.
    assert writer.call(cmd="open", descriptor=exp["descriptor"], force_relay=True)["transport"] == "relay"
    writer.send(cmd="write", seed=2, nbytes=64 << 20, count=200, timeout=20)
    time.sleep(0.3)
    assert d.metric("podlink_exports") == 2  # the owner's region and the writer's source
    owner.kill()
    answer = writer.expect(timeout=60)
    # Either every write landed before the owner died, or the writer gets a clear podlink error.
    assert answer.get("written") == 200 * (64 << 20) or answer.get("error"), answer
    if "error" not in answer:
        answer = writer.call(cmd="write", seed=2, nbytes=4096, timeout=20)
    assert answer.get("error") in ("NotFound", "FailedPrecondition", "Unavailable", "Error"), answer
    print("the writer's answer:", answer)
    # The owner's export is gone, then the writer's with its session, and podlinkd holds no more
    # descriptors than before.
    deadline = time.monotonic() + 10
    while d.metric("podlink_exports") != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.metric("podlink_exports") == 1
    writer.close()
    deadline = time.monotonic() + 10
    while d.metric("podlink_exports") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.metric("podlink_exports") == 0
    deadline = time.monotonic() + 10
    while d.fds() > fds_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.fds() <= fds_before


def test_the_kv_handoff_example_between_pods(pods):
    import os
    import sys
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "examples", "kv_handoff.py")
    sizes = ["--name", "kv-req-7", "--layers", "3", "--blocks", "256", "--used", "64", "--block-kib", "16",
             "--timeout", "30"]
    pods.plan([("decode", "serve-1"), ("prefill", "serve-1")])
    decode = pods("decode", [sys.executable, example, "decode", *sizes])
    prefill = pods("prefill", [sys.executable, example, "prefill", *sizes])
    out_p, err_p = prefill.proc.communicate(timeout=60)
    out_d, err_d = decode.proc.communicate(timeout=60)
    assert prefill.proc.returncode == 0, err_p
    assert decode.proc.returncode == 0, out_d + err_d
    assert "192 blocks, 0 wrong" in out_d, out_d
    assert "via host" in out_p, out_p


def test_pip_installs_the_package(daemon, tmp_path):
    """pip install from the repository (reusing this build), then import it with nothing else on the path."""
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = os.path.dirname(os.path.dirname(os.path.abspath(podlink.__file__)))  # <build>/python/podlink
    env = dict(os.environ, PODLINK_BUILD_DIR=os.path.dirname(build))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--quiet",
                        "--target", str(tmp_path / "site"), os.path.join(repo, "client-lib", "python")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import podlink, sys; ep = podlink.Endpoint(); "
            "r = ep.reg(ep.alloc_host(4096)); ep.open(ep.describe(r)); ep.close(); print(podlink.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "site")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(str(tmp_path / "site")), r.stdout
