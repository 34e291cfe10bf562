"""Fixtures for the `import podlink` tests: a podlinkd of the test's own (temporary socket directory, host
memory only), and "pods" made with scripts/lib/pod.sh (own PID, UTS, IPC, network and mount namespaces and a
kubepods-style cgroup that the daemon's config names), each running tests/python/pod_peer.py.

Environment: PODLINKD (default build/daemon/podlinkd), PYTHONPATH must reach the built package
(build/python). Needs root for the pods (their tests skip otherwise).
"""
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PODLINKD = os.environ.get("PODLINKD", os.path.join(REPO, "build", "daemon", "podlinkd"))
POD_SH = os.path.join(REPO, "scripts", "lib", "pod.sh")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pod_peer.py")


def _sh(script, *args):
    out = subprocess.run(["bash", "-c", f"source {POD_SH}; {script}", "sh", *args], capture_output=True,
                         text=True, timeout=30)
    return out.returncode, out.stdout.strip(), out.stderr.strip()


class Daemon:
    def __init__(self, root, pods):
        self.dir = tempfile.mkdtemp(prefix="podlink-py-")
        self.sock = os.path.join(self.dir, "sock")
        os.mkdir(self.sock)
        rules = [{"match": {"pod_uid": uid}, "namespace": ns, "name": name,
                  "annotations": {"podlink.io/peer-group": group}} for uid, ns, name, group in pods]
        cfg = {"identity": {"kubelet_cgroup_roots": [f"/{root}"]}, "pods": rules}
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        self.log = open(os.path.join(self.dir, "podlinkd.log"), "w+")
        self.proc = subprocess.Popen([PODLINKD, "--socket-dir", self.sock, "--config",
                                      os.path.join(self.dir, "config.json"), "--no-gpu",
                                      "--metrics-addr", "127.0.0.1:0"], stderr=self.log)
        deadline = time.monotonic() + 20
        self.metrics_port = None
        while time.monotonic() < deadline and self.metrics_port is None:
            time.sleep(0.05)
            self.log.seek(0)
            m = re.search(r"event=ready .*metrics=127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.metrics_port = int(m.group(1))
        if self.metrics_port is None:
            self.stop()
            raise RuntimeError("podlinkd did not become ready")

    def metric(self, name):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def logged(self, text, timeout=5):
        """True once podlinkd's log holds `text`."""
        deadline = time.monotonic() + timeout
        while True:
            self.log.seek(0)
            if text in self.log.read():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def alive(self):
        """podlinkd still runs and answers (its metrics page)."""
        return self.proc.poll() is None and self.metric("podlink_exports") is not None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Pod:
    """tests/python/pod_peer.py in a pod: send() a JSON command, expect() its JSON answer."""

    def __init__(self, cgroup, sock, argv=None):
        env = dict(os.environ, PODLINK_SOCKET_DIR=sock)
        argv = argv or [sys.executable, PEER]
        self.proc = subprocess.Popen(
            ["bash", "-c", f"source {POD_SH}; pod_exec \"$0\" -- \"$@\"", cgroup, *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, bufsize=1)

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, timeout=30):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise AssertionError(f"no answer from the pod within {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("the pod exited: " + self.proc.stderr.read()[-2000:])
        return json.loads(line)

    def call(self, timeout=30, **cmd):
        self.send(**cmd)
        return self.expect(timeout)

    def kill(self):
        # pod_exec execs unshare --fork --kill-child: killing it takes the pod's process with it.
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon():
    """A podlinkd for processes of this test (no pods): same identity, so its sessions share everything."""
    d = Daemon("podlink-py-none", [])
    os.environ["PODLINK_SOCKET_DIR"] = d.sock
    yield d
    os.environ.pop("PODLINK_SOCKET_DIR", None)
    d.stop()


@pytest.fixture
def pods():
    """make(name, group) -> Pod; the daemon starts at the first make() with every pod named in `plan`."""
    if os.geteuid() != 0:
        pytest.skip("pods need root (namespaces, cgroups)")
    rc, cg_root, _ = _sh("pod_cgroup_root")
    if rc != 0 or not cg_root:
        pytest.skip("no writable cgroup2 mount")
    root = f"podlink-py-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    state = {"daemon": None, "pods": [], "cgroups": {}}

    def plan(specs):
        """specs: [(name, group)]; makes their cgroups and starts podlinkd knowing them."""
        rules = []
        for name, group in specs:
            uid = str(uuid.uuid4())
            rc, cg, err = _sh(f'pod_make_cgroup "$1" "$2" burstable', root, uid)
            assert rc == 0, err
            state["cgroups"][name] = cg
            rules.append((uid, "ml", name, group))
        state["daemon"] = Daemon(root, rules)
        return state["daemon"]

    def make(name, argv=None):
        p = Pod(state["cgroups"][name], state["daemon"].sock, argv)
        state["pods"].append(p)
        return p

    make.plan = plan
    yield make
    for p in state["pods"]:
        p.close()
    if state["daemon"] is not None:
        state["daemon"].stop()
    _sh('pod_cleanup_cgroups "$1"', root)
