#!/usr/bin/python3
"""podlinkd on a real container runtime: Debian's containerd and runc.

Plays the kubelet: starts containerd (its own root, state and socket, the CRI
plugin with the cgroupfs driver, host-network sandboxes so no CNI is needed),
imports the images scripts/build-image.sh makes from the build, and through CRI
  1. runs podlinkd the way deploy/daemonset.yaml does: the same arguments,
     ConfigMap and init container command, privileged, in the host PID
     namespace, from the image; the init container installs the client files
     and the readiness probe command passes;
  2. creates pods with kubelet-style cgroup parents, labels and annotations and
     runs podlink-demo inside their containers (ExecSync), checking identity,
     an import within the peer group, a denial with its reason, a pod created
     right after another, a re-created sandbox with new annotations, a
     containerd restart, and a stopped containerd (SIGSTOP) during which known
     pods keep working while a new one waits.
Exits non-zero on the first failed check; every wait is bounded.

    containerd_test.py BUILD_DIR
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import grpc
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(REPO, "build")
DEMO = "/usr/local/lib/podlink/podlink-demo"
CHECKS = 0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def check(ok, what, detail=""):
    global CHECKS
    if not ok:
        log(f"FAIL: {what} {detail}")
        raise SystemExit(1)
    CHECKS += 1
    log(f"ok: {what}")


def run(*cmd, **kw):
    r = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout


def sanitized(build):
    """True for a build made with sanitizers (scripts/sanitize.sh): its binaries need /proc and the
    sanitizer runtime in the image, and the image is not what ships."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            return any(l.startswith("PODLINK_SANITIZE:") and l.strip().split("=", 1)[1] for l in f)
    except OSError:
        return False


class Containerd:
    """containerd with a private root, state and socket; its CRI plugin uses our pause image."""

    def __init__(self, work, version):
        self.work = work
        self.sock_dir = os.path.join(work, "run-containerd")  # mounted into podlinkd by directory
        self.sock = os.path.join(self.sock_dir, "containerd.sock")
        os.makedirs(self.sock_dir, exist_ok=True)
        for d in ("cni/bin", "cni/conf"):
            os.makedirs(os.path.join(work, d), exist_ok=True)
        self.config = os.path.join(work, "containerd.toml")
        with open(self.config, "w") as f:
            f.write(f"""version = 2
root = "{work}/root"
state = "{work}/state"
[grpc]
  address = "{self.sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/podlink/pause:{version}"
  # Never below containerd's own oom_score_adj: where the test runs without
  # CAP_SYS_RESOURCE (a container), the kubelet's -998 for sandboxes is refused.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{work}/cni/bin"
    conf_dir = "{work}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
""")
        self.proc = None

    def start(self):
        self.log = open(os.path.join(self.work, "containerd.log"), "a")
        self.proc = subprocess.Popen(["containerd", "--config", self.config], stdout=self.log, stderr=self.log,
                                     start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(self.sock):
                try:
                    run("ctr", "-a", self.sock, "version")
                    return
                except subprocess.CalledProcessError:
                    pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise SystemExit(f"containerd did not start; log: {self.work}/containerd.log")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def ctr(self, *args):
        return run("ctr", "-a", self.sock, "-n", "k8s.io", *args)


class Cri:
    """RuntimeService over the runtime's socket, from proto/cri/runtime/v1/api.proto (the one CRI subset)."""

    def __init__(self, sock, pb):
        self.pb = pb
        self.channel = grpc.insecure_channel("unix:" + sock)

    def __call__(self, method, request, timeout=30):
        resp = getattr(self.pb, method + "Response")
        rpc = self.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=resp.FromString)
        for attempt in range(3):  # a connection broken by a runtime restart fails once; the kubelet retries too
            try:
                return rpc(request, timeout=timeout, wait_for_ready=True)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == 2:
                    raise
                time.sleep(0.5)

    def wait_ready(self, timeout=30):
        """Until the CRI plugin answers. A containerd just started takes calls before its CRI plugin is up and answers
        them UNKNOWN "server is not initialized yet" (seen 2026-12-03 right after the restart below), where
        `ctr version` (Containerd.start) already answers."""
        deadline = time.time() + timeout
        while True:
            try:
                return self("Version", self.pb.VersionRequest(version="v1"), timeout=5)
            except grpc.RpcError:
                if time.time() >= deadline:
                    raise
                time.sleep(0.2)


class Kubelet:
    """What the kubelet would ask of the runtime, for one test node."""

    def __init__(self, cri, pb, cgroup_root, image, socket_dir, log_dir):
        self.cri, self.pb, self.root, self.image, self.socket_dir = cri, pb, cgroup_root, image, socket_dir
        self.log_dir = log_dir

    def sandbox(self, ns, name, uid, annotations=None, attempt=0, qos="besteffort", host_pid=False):
        pb = self.pb
        labels = {"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
                  "io.kubernetes.pod.namespace": ns}
        parent = f"{self.root}/kubepods/{qos}/pod{uid}" if qos != "guaranteed" else f"{self.root}/kubepods/pod{uid}"
        mode = pb.NamespaceOption(network=pb.NODE, pid=pb.NODE if host_pid else pb.POD, ipc=pb.POD)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=ns, attempt=attempt),
            labels=labels, annotations=annotations or {},  # no hostname: host network, as the kubelet does
            log_directory=os.path.join(self.log_dir, f"{ns}_{name}_{uid}"),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=mode, privileged=host_pid)))
        sid = self.cri("RunPodSandbox", pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
        return sid, config

    def container(self, sid, sandbox_config, name, command, args=(), mounts=(), privileged=False, env=None,
                  start=True):
        pb = self.pb
        md = sandbox_config.metadata
        labels = {"io.kubernetes.pod.uid": md.uid, "io.kubernetes.pod.name": md.name,
                  "io.kubernetes.pod.namespace": md.namespace, "io.kubernetes.container.name": name}
        ns = sandbox_config.linux.security_context.namespace_options
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=self.image),
            command=list(command), args=list(args), labels=labels, log_path=f"{name}.log",
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            mounts=[pb.Mount(host_path=h, container_path=c, readonly=ro) for h, c, ro in mounts],
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                privileged=privileged, namespace_options=ns)))
        cid = self.cri("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=sandbox_config)).container_id
        if start:
            self.cri("StartContainer", pb.StartContainerRequest(container_id=cid))
        return cid

    def client_pod(self, ns, name, annotations=None, uid=None, attempt=0):
        """A pod whose container sleeps, with podlinkd's socket directory mounted."""
        uid = uid or str(uuid.uuid4())
        sid, cfg = self.sandbox(ns, name, uid, annotations, attempt)
        cid = self.container(sid, cfg, "main", ["/bin/sleep", "3600"],
                             mounts=[(self.socket_dir, "/run/podlink", False)],
                             env={"PODLINK_SOCKET_DIR": "/run/podlink"})
        return {"uid": uid, "sandbox": sid, "config": cfg, "container": cid, "name": name, "ns": ns}

    def exec(self, cid, cmd, timeout=30):
        r = self.cri("ExecSync", self.pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout),
                     timeout=timeout + 10)
        return r.exit_code, r.stdout.decode(), r.stderr.decode()

    def demo(self, pod, *args, want=None):
        """podlink-demo in the pod's container: its error line, else its `want` line, else its last."""
        code, out, err = self.exec(pod["container"], [DEMO, *args])
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        for event in ("error", want):
            hit = [l for l in lines if l.get("event") == event]
            if hit:
                return hit[0]
        return lines[-1] if lines else {"event": "none", "exit": code, "stderr": err}

    def remove_pod(self, sid):
        self.cri("StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        self.cri("RemovePodSandbox", self.pb.RemovePodSandboxRequest(pod_sandbox_id=sid))


def container_pid(ctd, cid):
    for line in ctd.ctr("tasks", "ls").splitlines()[1:]:
        parts = line.split()
        if parts and parts[0] == cid:
            return int(parts[1])
    raise SystemExit(f"no task for container {cid}")


def container_log(kube, pod, name):
    md = pod["config"].metadata
    try:
        with open(os.path.join(kube.log_dir, f"{md.namespace}_{md.name}_{md.uid}", f"{name}.log")) as f:
            return f.read()[-2000:]
    except OSError as e:
        return str(e)


def cgroup_mounts():
    """Controller set -> mount point, for every cgroup hierarchy ("" is cgroup2's)."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, opts = fields[sep + 1], fields[sep + 3]
            if fstype == "cgroup2":
                mounts[""] = fields[4]
            elif fstype == "cgroup":
                ctrls = sorted(o for o in opts.split(",") if o not in ("rw", "ro") and not o.startswith("relatime"))
                mounts[",".join(ctrls)] = fields[4]
    return mounts


def cgroup_files(pid):
    """The cgroup.procs files of every hierarchy that `pid` is in (cgroup v1 and v2 alike)."""
    mounts, files = cgroup_mounts(), []
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            key = ",".join(sorted(ctrls.split(","))) if ctrls else ""
            if key in mounts:
                files.append(os.path.join(mounts[key] + path, "cgroup.procs"))
    return files


def main():
    if os.geteuid() != 0:
        raise SystemExit("containerd_test: needs root")
    if sanitized(BUILD):
        print("containerd_test: skipped for a sanitizer build (runs on the release build)")
        raise SystemExit(77)
    for tool in ("containerd", "ctr", "runc", "umoci", "protoc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"containerd_test: {tool} missing (scripts/deps.sh installs it)")
    work = tempfile.mkdtemp(prefix="podlink-ctd-")
    cgroup_root = f"/podlink-ctd-{os.getpid()}"
    ctd = None
    kube = None
    pods = []
    try:
        # Images and the CRI messages.
        out = run("bash", os.path.join(REPO, "scripts/build-image.sh"), BUILD, os.path.join(work, "image"))
        log(out.strip().replace("\n", "; "))
        version = run("sed", "-n", r"s/^project(podlink VERSION \([0-9.]*\).*/\1/p",
                      os.path.join(REPO, "CMakeLists.txt")).strip()
        gen = os.path.join(work, "gen")
        os.makedirs(gen)
        run("protoc", "-I", os.path.join(REPO, "proto/cri/runtime/v1"), "--python_out", gen,
            os.path.join(REPO, "proto/cri/runtime/v1/api.proto"))
        sys.path.insert(0, gen)
        import api_pb2 as pb

        ctd = Containerd(work, version)
        ctd.start()
        for tar in (f"podlinkd-{version}.oci.tar", "pause.oci.tar"):
            ctd.ctr("images", "import", os.path.join(work, "image", tar))
        cri = Cri(ctd.sock, pb)
        v = cri.wait_ready()
        log(f"runtime: {v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version})")

        # The node's directories, as hostPath volumes.
        host = {k: os.path.join(work, "host", k) for k in ("run-podlink", "host-lib", "device-plugins", "etc-podlink")}
        for d in host.values():
            os.makedirs(d)
        kube = Kubelet(cri, pb, cgroup_root, f"docker.io/podlink/podlinkd:{version}", host["run-podlink"],
                       os.path.join(work, "logs"))

        # --- 1. podlinkd as deploy/daemonset.yaml runs it ----------------------
        rendered = run("kubectl", "kustomize", os.path.join(REPO, "deploy"))
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        ds = next(d for d in docs if d["kind"] == "DaemonSet")
        spec = ds["spec"]["template"]["spec"]
        check(spec.get("hostPID") is True, "the DaemonSet runs in the host PID namespace")
        main_c = next(c for c in spec["containers"] if c["name"] == "podlinkd")
        init_c = spec["initContainers"][0]
        config = json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.json"])
        config.setdefault("identity", {})["kubelet_cgroup_roots"] = [cgroup_root]  # this test's kubepods
        with open(os.path.join(host["etc-podlink"], "config.json"), "w") as f:
            json.dump(config, f)
        # Volumes by mount path: the node's stand-ins for the manifest's hostPaths.
        volume_for = {"/run/podlink": host["run-podlink"], "/host-lib": host["host-lib"],
                      "/var/lib/podlink/lib": host["host-lib"], "/var/lib/kubelet/device-plugins":
                      host["device-plugins"], "/run/containerd": ctd.sock_dir, "/etc/podlink": host["etc-podlink"]}

        def mounts_of(c):
            out = []
            for m in c.get("volumeMounts", []):
                if m["mountPath"] in volume_for:
                    out.append((volume_for[m["mountPath"]], m["mountPath"], bool(m.get("readOnly"))))
            return out

        args = main_c["args"]  # exactly the manifest's
        rp = main_c["readinessProbe"]

        def probe_passes():
            """The manifest's readiness probe, as the kubelet runs it (host network: the node's address)."""
            if "exec" in rp:
                code, out, err = kube.exec(daemon["cid"], rp["exec"]["command"], timeout=5)
                return code == 0, out + err
            port = rp["httpGet"]["port"]
            if isinstance(port, str):
                port = next(p["containerPort"] for p in main_c["ports"] if p["name"] == port)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{rp['httpGet']['path']}", timeout=5) as r:
                    return r.status == 200, r.read().decode()
            except urllib.error.HTTPError as e:
                return False, f"{e.code} {e.read().decode()}"
            except OSError as e:
                return False, str(e)

        daemon = {}

        def start_podlinkd(pod_name):
            """The DaemonSet's pod: a new sandbox, its init container, then podlinkd until the probe passes."""
            sid, cfg = kube.sandbox("podlink-system", pod_name, str(uuid.uuid4()), qos="burstable", host_pid=True)
            pods.append(sid)
            init_id = kube.container(sid, cfg, init_c["name"], init_c["command"], init_c.get("args", []),
                                     mounts_of(init_c))
            for _ in range(100):
                st = cri("ContainerStatus", pb.ContainerStatusRequest(container_id=init_id)).status
                if st.state == pb.CONTAINER_EXITED:
                    break
                time.sleep(0.1)
            check(st.state == pb.CONTAINER_EXITED and st.exit_code == 0,
                  f"{pod_name}: the init container installed the client files", f"state {st.state} exit {st.exit_code}")
            installed = sorted(os.listdir(host["host-lib"]))
            check(installed == ["libnccl-net-podlink.so", "libpodlink.so.0", "podlink-demo"],
                  f"{pod_name}: the host library directory holds exactly the client files", str(installed))
            env = {e["name"]: "node1" for e in main_c.get("env", []) if e["name"] == "NODE_NAME"}
            daemon["cid"] = kube.container(sid, cfg, "podlinkd", [], args, mounts_of(main_c), privileged=True, env=env)
            daemon["sid"] = sid
            for _ in range(150):
                ready, said = probe_passes()
                if ready:
                    break
                time.sleep(0.2)
            check(ready, f"{pod_name}: podlinkd from the image passes the manifest's readiness probe", said)
            pid = container_pid(ctd, daemon["cid"])
            check(os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid"),
                  f"{pod_name}: podlinkd runs in the host PID namespace (the test's own)")

        start_podlinkd("podlinkd-abcde")

        # --- 2. pods through CRI -------------------------------------------------
        group = {"podlink.io/peer-group": "job-1"}
        a = kube.client_pod("ml", "prefill-0", group)
        b = kube.client_pod("ml", "decode-0", group)
        c = kube.client_pod("other", "stranger-0", {})
        pods += [a["sandbox"], b["sandbox"], c["sandbox"]]
        info = kube.demo(a, "info")
        ident = info.get("identity", {})
        check(ident.get("namespace") == "ml" and ident.get("pod") == "prefill-0" and ident.get("pod_uid") == a["uid"]
              and ident.get("annotations", {}).get("podlink.io/peer-group") == "job-1",
              "a client in a pod is identified as that pod, with its annotations", json.dumps(info))

        exp = kube.container(a["sandbox"], a["config"], "exporter",
                             [DEMO, "export", "--size", "1048576", "--name", "kv", "--seed", "7", "--await-import"],
                             mounts=[(host["run-podlink"], "/run/podlink", False)],
                             env={"PODLINK_SOCKET_DIR": "/run/podlink"})
        imp = {}
        for _ in range(50):  # until the exporter has exported
            imp = kube.demo(b, "import", "--name", "kv", "--verify", "7", want="verified")
            if imp.get("code") != "NOT_FOUND":
                break
            time.sleep(0.2)
        check(imp.get("event") == "verified" and imp.get("mismatches") == 0,
              "a pod of the same peer group imports the export and reads it byte for byte",
              json.dumps(imp) + " exporter: " + container_log(kube, a, "exporter"))
        denied = kube.demo(c, "import", "--name", "kv")
        log(f"refusal as the client sees it: {denied.get('code')}: {denied.get('message')}")
        check(denied.get("code") in ("PERMISSION_DENIED", "NOT_FOUND") and denied.get("message"),
              "a pod outside the peer group is refused, with a reason", json.dumps(denied))
        del exp

        d = kube.client_pod("ml", "right-after-0", group)  # created and used at once
        pods.append(d["sandbox"])
        check(kube.demo(d, "info").get("identity", {}).get("pod") == "right-after-0",
              "a pod created right after another is identified at once")

        # A sandbox re-created with new annotations (the kubelet's attempt 1).
        kube.remove_pod(d["sandbox"])
        pods.remove(d["sandbox"])
        d2 = kube.client_pod("ml", "right-after-0", {"podlink.io/peer-group": "job-2"}, uid=d["uid"], attempt=1)
        pods.append(d2["sandbox"])
        info = kube.demo(d2, "info")
        check(info.get("identity", {}).get("annotations", {}).get("podlink.io/peer-group") == "job-2",
              "a re-created sandbox brings its new annotations", json.dumps(info))

        # --- containerd stopped (SIGSTOP): known pods keep working ----------------
        a_pid = container_pid(ctd, a["container"])
        # A client of a pod the runtime must be asked about: a container cgroup of an unknown pod.
        cg2 = cgroup_mounts().get("")
        check(cg2 is not None, "a cgroup2 hierarchy is mounted")
        stranger_cg = (f"{cg2}{cgroup_root}/kubepods/besteffort/pod{uuid.uuid4()}/"
                       f"{uuid.uuid4().hex}{uuid.uuid4().hex}")
        os.makedirs(stranger_cg)
        demo_host = os.path.join(BUILD, "client-lib/tools/podlink-demo")

        def start(procs_files, argv, ns_pid=None):
            """argv in the given cgroups (and, with ns_pid, that process's mount and PID namespaces)."""
            def join():
                for f in procs_files:
                    with open(f, "w") as fh:
                        fh.write("0")
            enter = ["nsenter", "-t", str(ns_pid), "-m", "-p", "--"] if ns_pid else []
            environ = dict(os.environ, PODLINK_SOCKET_DIR="/run/podlink" if ns_pid else host["run-podlink"])
            return subprocess.Popen([*enter, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=environ, preexec_fn=join)

        ctd.proc.send_signal(signal.SIGSTOP)
        try:
            waiting = start([os.path.join(stranger_cg, "cgroup.procs")], [demo_host, "info"])
            time.sleep(0.5)  # connected by now, and waiting in podlinkd for the stopped runtime
            check(waiting.poll() is None, "with containerd stopped, a new pod's client waits for the runtime")
            t0 = time.time()
            known = start(cgroup_files(a_pid), [DEMO, "info"], ns_pid=a_pid)
            out, err = known.communicate(timeout=20)
            took = time.time() - t0
            check('"prefill-0"' in out, f"with containerd stopped, a known pod's client is served ({took:.2f} s)",
                  out + err)
            check(waiting.poll() is None, "and the new pod's client is still waiting")
        finally:
            ctd.proc.send_signal(signal.SIGCONT)
        out, _ = waiting.communicate(timeout=30)
        log(f"unknown pod as the client sees it: {out.strip()}")
        check('"UNAVAILABLE"' in out and "not known to the container runtime" in out,
              "once containerd answers, the unknown pod is refused with the reason", out)
        os.rmdir(stranger_cg)

        # --- containerd restarted ---------------------------------------------------
        ctd.stop()
        ctd.start()
        t0 = time.time()
        cri.wait_ready()
        e = kube.client_pod("ml", "after-restart-0", group)
        pods.append(e["sandbox"])
        got = {}
        for _ in range(50):
            got = kube.demo(e, "info")
            if got.get("event") == "info":
                break
            time.sleep(0.2)
        check(got.get("identity", {}).get("pod") == "after-restart-0",
              f"after a containerd restart a new pod is identified ({time.time() - t0:.1f} s after the restart)",
              json.dumps(got))
        for _ in range(100):
            ready, said = probe_passes()
            if ready:
                break
            time.sleep(0.2)
        check(ready, "podlinkd is ready again after the runtime restart", said)

        # --- podlinkd replaced (docs/kubernetes.md, "Restarts and upgrades") -----------------
        # The OnDelete upgrade: the podlinkd pod is deleted and the DaemonSet makes a new one. Running pods keep
        # their /run/podlink mount and reach the new podlinkd with new sessions.
        old_sid = daemon["sid"]
        kube.remove_pod(old_sid)
        pods.remove(old_sid)
        down = kube.demo(a, "info")
        log(f"podlinkd gone, as a client sees it: {down.get('code')}: {down.get('message')}")
        check(down.get("code") == "UNAVAILABLE", "with podlinkd's pod deleted, clients are told it is unreachable",
              json.dumps(down))
        start_podlinkd("podlinkd-fghij")
        check(kube.demo(a, "info").get("identity", {}).get("pod") == "prefill-0",
              "a running pod reaches the new podlinkd (new session) without a restart of its own")
        exp2 = kube.container(a["sandbox"], a["config"], "exporter-2",
                              [DEMO, "export", "--size", "1048576", "--name", "kv", "--seed", "9", "--await-import"],
                              mounts=[(host["run-podlink"], "/run/podlink", False)],
                              env={"PODLINK_SOCKET_DIR": "/run/podlink"})
        imp = {}
        for _ in range(50):
            imp = kube.demo(b, "import", "--name", "kv", "--verify", "9", want="verified")
            if imp.get("code") != "NOT_FOUND":
                break
            time.sleep(0.2)
        check(imp.get("event") == "verified" and imp.get("mismatches") == 0,
              "after the upgrade, exported again and imported again, byte for byte",
              json.dumps(imp) + " exporter: " + container_log(kube, a, "exporter-2"))
        del exp2
        log(f"PASS: {CHECKS} checks")
    finally:
        if kube is not None and ctd is not None and ctd.proc is not None:
            for sid in pods:
                try:
                    kube.remove_pod(sid)
                except grpc.RpcError as e:
                    log(f"cleanup: {sid}: {e.details()}")
        if ctd is not None:
            ctd.stop()
        subprocess.run(["pkill", "-f", f"containerd-shim-runc-v2 .*-address {work}"], check=False)
        subprocess.run(["sh", "-c", f"grep -o ' {work}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l"],
                       check=False)
        # A container whose sandbox could not be removed (the runtime failed mid-test) outlives its shim: its
        # processes (podlinkd from the image, on the host's port 9477) would fail the next run. Everything still
        # in the test's cgroups is killed before they are removed.
        for mount in set(cgroup_mounts().values()):
            for procs in glob.glob(f"{mount}{cgroup_root}/**/cgroup.procs", recursive=True):
                try:
                    with open(procs) as f:
                        pids = [int(p) for p in f.read().split()]
                except OSError:
                    continue
                for pid in pids:
                    if pid != os.getpid():
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        time.sleep(0.2)  # the killed leave their cgroups before the rmdir below
        for mount in set(cgroup_mounts().values()):  # what runc and the test made under the test's root
            subprocess.run(["sh", "-c", f"find {mount}{cgroup_root} -depth -type d -exec rmdir {{}} + 2>/dev/null"],
                           check=False)
        if os.environ.get("PODLINK_KEEP_WORK"):
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
