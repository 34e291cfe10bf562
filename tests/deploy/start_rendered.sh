#!/usr/bin/env bash
# Starts the real podlinkd with exactly the arguments a rendered manifest gives
# its podlinkd container, and its config file from the rendered ConfigMap, until
# the manifest's own readiness probe passes. Runs in private mount and network
# namespaces, with tmpfs over /run and /var/lib, so the manifest's paths and
# ports are used as they are. No GPU here: podlinkd serves host memory.
#
# With --pod-source=cri the container runtime is tests/deploy/fake_cri.py,
# listening on the node's side of the hostPath volume the manifest mounts the
# runtime's socket from, and reached through that volume mounted as the
# manifest says (path, type, read-only). The runtime is then restarted (a new
# socket at the same path, as containerd makes when it restarts): its socket
# must still answer at the path podlinkd was given, and podlinkd must be (or
# become again) ready.
#
# With --remote-pods=apiserver, podlinkd finds the API server as in a pod:
# KUBERNETES_SERVICE_HOST/PORT, and the service account's token and CA under
# /var/run/secrets/kubernetes.io/serviceaccount; a fake API server
# ($FAKE_KUBE_API, tests/tools/fake_kube_apiserver.cc) answers there, and
# podlinkd must list its pods.
#
#   start_rendered.sh RENDERED.yaml PODLINKD LABEL
set -euo pipefail
rendered=$1 podlinkd=$(realpath "$2") label=$3
here=$(dirname "$(realpath "$0")")
fail() { echo "FAIL ($label): $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$rendered" "$work" <<'PY' || fail "cannot read the podlinkd container from $rendered"
import json, shlex, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
out = sys.argv[2]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "podlinkd")
cmd = (c.get("command") or ["podlinkd"]) + c.get("args", [])
assert cmd[0].rsplit("/", 1)[-1] == "podlinkd", cmd
probe = c["readinessProbe"]
if "exec" in probe:
    ready = probe["exec"]["command"]
    assert ready[0].rsplit("/", 1)[-1] == "podlinkd", ready
else:
    port = probe["httpGet"]["port"]
    if isinstance(port, str):  # a named container port
        port = next(p["containerPort"] for p in c.get("ports", []) if p.get("name") == port)
    ready = ["podlinkd", "--probe", probe["httpGet"]["path"], "--metrics-addr", f"127.0.0.1:{port}"]
config = ""
for d in docs:
    if d["kind"] == "ConfigMap" and "config.json" in d.get("data", {}):
        config = d["data"]["config.json"]
open(out + "/args", "w").write(shlex.join(cmd[1:]))
open(out + "/ready", "w").write(shlex.join(ready[1:]))
open(out + "/config.json", "w").write(config)
# The mesh: its certificate directory must hold a node certificate, and the
# network namespace an interface with an address to advertise.
mesh = json.loads(config).get("mesh", {}) if config else {}
open(out + "/mesh_cert_dir", "w").write(mesh.get("cert_dir", "") if mesh.get("enabled") else "")
open(out + "/mesh_if", "w").write((mesh.get("interfaces") or ["mesh-test0"])[0])

# The runtime's socket: which volume of the container holds it.
flags = dict(a[2:].split("=", 1) for a in cmd[1:] if a.startswith("--") and "=" in a)
cri = {"sock": "", "mount": "", "host": "", "type": "", "ro": ""}
if flags.get("pod-source") == "cri":
    sock = flags.get("cri-socket", "")
    assert sock, "--pod-source=cri without --cri-socket: podlinkd would guess the runtime"
    holding = [m for m in c.get("volumeMounts", [])
               if sock == m["mountPath"] or sock.startswith(m["mountPath"].rstrip("/") + "/")]
    assert holding, f"no volume of the podlinkd container holds --cri-socket={sock}"
    m = max(holding, key=lambda m: len(m["mountPath"]))
    vol = next(v for v in pod["volumes"] if v["name"] == m["name"])
    assert "hostPath" in vol, f"volume {m['name']} holding the runtime's socket is not a hostPath"
    cri = {"sock": sock, "mount": m["mountPath"], "host": vol["hostPath"]["path"],
           "type": vol["hostPath"].get("type", ""), "ro": "1" if m.get("readOnly") else ""}
for k, v in cri.items():
    open(f"{out}/cri_{k}", "w").write(v)
PY
echo "$label: podlinkd $(cat "$work/args")"
config_path=$(python3 -c 'import shlex,sys; a=shlex.split(open(sys.argv[1]).read()); print(next((x.split("=",1)[1] for x in a if x.startswith("--config=")), ""))' "$work/args")
if [ -s "$work/cri_sock" ]; then
  echo "$label: runtime socket $(cat "$work/cri_sock") from hostPath $(cat "$work/cri_host")" \
       "(type $(cat "$work/cri_type"))$([ -s "$work/cri_ro" ] && echo ", read-only")"
fi
set +e
PODLINKD=$podlinkd WORK=$work CONFIG_PATH=$config_path FAKE_CRI=$here/fake_cri.py timeout 90 \
  unshare --mount --net --fork bash -c '
  set -eu
  mount --make-rprivate /
  ip link set lo up
  mount -t tmpfs podlink-test /run
  mount -t tmpfs podlink-test /var/lib
  mkdir -p /var/lib/kubelet/device-plugins  # the kubelet makes it; podlinkd expects it
  if [ -n "$CONFIG_PATH" ]; then
    # An overlay on the config directory'"'"'s parent (/etc), so it can be made here and not on the host.
    parent=$(dirname "$(dirname "$CONFIG_PATH")")
    mkdir -p "$WORK/upper" "$WORK/overlay-work"
    mount -t overlay podlink-test -o "lowerdir=$parent,upperdir=$WORK/upper,workdir=$WORK/overlay-work" "$parent"
    mkdir -p "$(dirname "$CONFIG_PATH")"
    cp "$WORK/config.json" "$CONFIG_PATH"
  fi
  # A CA and a certificate it signs (EC P-256, a day): ca_and_cert CA_KEY CA_CRT SUBJECT SAN EKU KEY CRT SCRATCH
  ca_and_cert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "/CN=$3-ca" \
      -keyout "$1" -out "$2" 2> /dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$3" \
      -keyout "$6" -out "$8.csr" 2> /dev/null
    printf "subjectAltName=%s\nextendedKeyUsage=%s\n" "$4" "$5" > "$8.cnf"
    openssl x509 -req -in "$8.csr" -CA "$2" -CAkey "$1" -CAcreateserial -days 1 -extfile "$8.cnf" -out "$7" 2> /dev/null
  }
  mesh_cert_dir=$(cat "$WORK/mesh_cert_dir")
  if [ -n "$mesh_cert_dir" ]; then
    # A cable with an address (the node'"'"'s NIC) and a node certificate from a CA made here.
    mesh_if=$(cat "$WORK/mesh_if")  # named as the manifest'"'"'s mesh.interfaces say
    ip link add "$mesh_if" type veth peer name mesh-peer0
    ip addr add 10.99.0.1/30 dev "$mesh_if"
    ip link set "$mesh_if" up
    ip link set mesh-peer0 up
    mkdir -p "$mesh_cert_dir"
    ca_and_cert "$WORK/ca.key" "$mesh_cert_dir/ca.crt" test-node DNS:test-node serverAuth,clientAuth \
      "$mesh_cert_dir/tls.key" "$mesh_cert_dir/tls.crt" "$WORK/mesh"
    export NODE_NAME=test-node
  fi
  eval "args=($(cat "$WORK/args"))"
  kube_api=""
  if printf "%s\n" "${args[@]}" | grep -qx -- "--remote-pods=apiserver" && [ -s "$WORK/mesh_cert_dir" ]; then
    # In the pod: the service account'"'"'s files (under the tmpfs /run) and the service'"'"'s address.
    sa=/var/run/secrets/kubernetes.io/serviceaccount
    mkdir -p "$sa" "$WORK/kube"
    ca_and_cert "$WORK/kube/ca.key" "$sa/ca.crt" kube-apiserver IP:127.0.0.1 serverAuth \
      "$WORK/kube/tls.key" "$WORK/kube/tls.crt" "$WORK/kube/tls"
    echo "service-account-token" > "$sa/token"
    echo "[{\"uid\": \"u-1\", \"namespace\": \"ml\", \"name\": \"p-1\", \"node\": \"test-node\"}]" \
      > "$WORK/kube/pods.json"
    "$FAKE_KUBE_API" "$WORK/kube/tls.crt" "$WORK/kube/tls.key" 127.0.0.1 service-account-token \
      "$WORK/kube/pods.json" "$WORK/kube/port" 2> "$WORK/kube/log" &
    kube_api=$!
    for _ in $(seq 50); do [ -s "$WORK/kube/port" ] && break; sleep 0.1; done
    [ -s "$WORK/kube/port" ] || { echo "the fake API server did not start: $(cat "$WORK/kube/log")"; exit 1; }
    export KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=$(cat "$WORK/kube/port")
  fi
  eval "ready=($(cat "$WORK/ready"))"
  cri_sock=$(cat "$WORK/cri_sock") cri_mount=$(cat "$WORK/cri_mount") cri_host=$(cat "$WORK/cri_host")
  cri_type=$(cat "$WORK/cri_type") cri_ro=$(cat "$WORK/cri_ro")
  runtime=""
  # Starts the fake runtime, named $1, on the node side of the volume; waits until it answers there.
  start_runtime() {
    /usr/bin/python3 "$FAKE_CRI" serve "$node_sock" "$1" "$WORK/cri_calls" > "$WORK/cri_$1.log" 2>&1 &
    runtime=$!
    for _ in $(seq 50); do
      /usr/bin/python3 "$FAKE_CRI" call "$node_sock" 2> /dev/null && return 0
      kill -0 "$runtime" 2> /dev/null || break
      sleep 0.2
    done
    echo "the fake runtime did not start: $(cat "$WORK/cri_$1.log")"; exit 1
  }
  if [ -n "$cri_sock" ]; then
    node=$WORK/node  # stands in for the node'"'"'s root
    node_sock=$node$cri_host${cri_sock#"$cri_mount"}
    mkdir -p "$(dirname "$node_sock")"
    start_runtime first  # the node'"'"'s runtime runs before any pod
    case $cri_type in
      Socket) mkdir -p "$(dirname "$cri_mount")"; touch "$cri_mount" ;;
      Directory | DirectoryOrCreate | "") mkdir -p "$cri_mount" ;;
      *) echo "hostPath type $cri_type for the runtime'"'"'s socket"; exit 1 ;;
    esac
    mount --bind "$node$cri_host" "$cri_mount"
    [ -z "$cri_ro" ] || mount -o remount,bind,ro "$cri_mount"
  fi
  stop() {
    kill -TERM "$pid" 2> /dev/null; wait "$pid" || true
    if [ -n "$runtime" ]; then kill "$runtime"; wait "$runtime" 2> /dev/null || true; fi
    if [ -n "$kube_api" ]; then kill "$kube_api"; wait "$kube_api" 2> /dev/null || true; fi
  }
  await_ready() {  # $1: what is awaited
    for _ in $(seq 150); do
      if "$PODLINKD" "${ready[@]}" 2> "$WORK/probe"; then
        echo "readiness probe passed$1: podlinkd ${ready[*]}"
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || { echo "podlinkd exited:"; tail -20 "$WORK/log"; stop; exit 1; }
      sleep 0.2
    done
    echo "readiness probe never passed$1: $(cat "$WORK/probe")"; tail -20 "$WORK/log"; stop; exit 1
  }
  "$PODLINKD" "${args[@]}" 2> "$WORK/log" &
  pid=$!
  await_ready ""
  if [ -n "$mesh_cert_dir" ]; then
    grep -q "event=mesh_ready node=test-node" "$WORK/log" \
      || { echo "podlinkd did not start its mesh:"; tail -20 "$WORK/log"; stop; exit 1; }
    echo "the mesh serves: $(grep -o "event=mesh_ready.*" "$WORK/log")"
  fi
  if [ -n "$kube_api" ]; then
    for _ in $(seq 100); do grep -q "event=kube_pods_listed pods=1" "$WORK/log" && break; sleep 0.1; done
    grep -q "event=kube_pods_listed pods=1" "$WORK/log" \
      || { echo "podlinkd did not list pods from the API server:"; tail -20 "$WORK/log"; stop; exit 1; }
    echo "pods from the API server: $(grep -o "event=kube_pods_listed.*" "$WORK/log")"
  fi
  if [ -n "$cri_sock" ]; then
    grep -qF "event=pod_source source=cri socket=$cri_sock" "$WORK/log" \
      || { echo "podlinkd does not use the runtime socket $cri_sock:"; tail -20 "$WORK/log"; stop; exit 1; }
    # The runtime restarts: a new socket at the same path on the node.
    kill "$runtime"; wait "$runtime" 2> /dev/null || true
    runtime=""
    start_runtime second
    if ! /usr/bin/python3 "$FAKE_CRI" call "$cri_sock" 2> "$WORK/call"; then
      echo "after the runtime restarted, $cri_sock in the container no longer reaches it" \
           "($(cat "$WORK/call")): mount the socket'"'"'s directory, not the socket"
      stop; exit 1
    fi
    echo "the restarted runtime answers at $cri_sock in the container"
    await_ready " after the runtime restarted"
  fi
  stop
  exit 0
'
rc=$?
set -e
[ $rc = 0 ] || fail "podlinkd as the manifest starts it did not stay reachable and ready (above)"
