#!/usr/bin/env bash
# Renders charts/podlink with tests/deploy/chartrender (Go text/template +
# sprig + include/toYaml/fail, as `helm template` does; Helm itself is not a
# Debian package) and checks what comes out: the defaults render the cluster
# set-up (CRI pod source through the runtime's socket directory, device plugin,
# metrics for Prometheus, OnDelete updates, standard labels),
# values-standalone.yaml renders podlinkd's own defaults, every node-agent
# value (image pull secrets, affinity, pod annotations and labels, update
# strategy, priority class, security context) appears when set, NOTES.txt
# says what it should, every bad combination the validation template knows
# fails the render with its message, and the rendered YAML lints. Then podlinkd
# is started with each render's arguments until its readiness probe passes
# (start_rendered.sh, with a test container runtime for CRI renders), and the
# default render's init container installs the client library without
# disturbing a process that has the old one mapped (check_library_install.sh).
#
# With the mesh on, podlinkd confirms other nodes' pods with the API server:
# the render grants it get/list/watch on pods and nothing more, and its
# podlinkd lists pods from a fake API server (FAKE_KUBE_API) as in a pod.
#
#   check_chart.sh REPO BUILD_DIR PODLINKD FAKE_KUBE_APISERVER
set -euo pipefail
repo=$(realpath "$1") build=$(realpath -m "$2") podlinkd=$(realpath "$3")
export FAKE_KUBE_API=$(realpath "$4")
cd "$repo"
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$build"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
render=$build/chartrender
(cd tests/deploy/chartrender && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$build/.gocache" \
  CGO_ENABLED=0 go build -o "$render" .) \
  || fail "building chartrender (needs golang-go, golang-github-masterminds-sprig-dev, golang-gopkg-yaml.v3-dev)"

lint() {
  yamllint -s -c tests/deploy/rendered.yamllint "$1" || fail "yamllint of $2"
}

# Helpers for the renders' checks, read by each python3 check below.
cat > "$tmp/render.py" <<'PY'
import sys, yaml
chart = yaml.safe_load(open("charts/podlink/Chart.yaml"))
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
meta = ds["spec"]["template"]["metadata"]
pod = ds["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "podlinkd")
args = c["args"]
mounts = {m["name"]: m for m in c["volumeMounts"]}
vols = {v["name"]: v for v in pod["volumes"]}

def standard_labels(release):
    want = {"app.kubernetes.io/name": "podlink", "app.kubernetes.io/instance": release,
            "app.kubernetes.io/version": str(chart["appVersion"]), "app.kubernetes.io/managed-by": "Helm",
            "helm.sh/chart": f"podlink-{chart['version']}"}
    for d in docs + [ds["spec"]["template"]]:
        got = d["metadata"]["labels"]
        assert want.items() <= got.items(), (d["metadata"].get("name", "pod template"), got)
    selector = {"app.kubernetes.io/name": "podlink", "app.kubernetes.io/component": "podlinkd"}
    assert ds["spec"]["selector"] == {"matchLabels": selector}, ds["spec"]["selector"]
    assert selector.items() <= meta["labels"].items(), meta["labels"]
PY
export RENDER_PY=$tmp/render.py

# Defaults: a GPU cluster.
"$render" -namespace podlink-system charts/podlink > "$tmp/default.yaml" || fail "default values do not render"
lint "$tmp/default.yaml" "the default render"
python3 - "$tmp/default.yaml" <<'PY' || fail "default render"
exec(open(__import__("os").environ["RENDER_PY"]).read())
import json
assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet", "ServiceAccount"]
assert all(d["metadata"].get("namespace") == "podlink-system" for d in docs)
for w in ["--socket-dir=/run/podlink", "--pod-source=cri", "--cri-socket=/run/containerd/containerd.sock",
          "--device-plugin-dir=/var/lib/kubelet/device-plugins", "--device-plugin-devices=64",
          "--host-lib-dir=/var/lib/podlink/lib", "--metrics-addr=0.0.0.0:9477", "--relay-workers=0",
          "--relay-streams=4", "--log-level=info"]:
    assert w in args, (w, args)
assert "--no-gpu" not in args
# The runtime's socket through its directory (a new socket appears there after a runtime restart), read-only.
assert mounts["cri-socket-dir"] == {"name": "cri-socket-dir", "mountPath": "/run/containerd", "readOnly": True}
assert vols["cri-socket-dir"]["hostPath"] == {"path": "/run/containerd", "type": "Directory"}
assert not any(v.get("hostPath", {}).get("type") == "Socket" for v in pod["volumes"]), "a socket mounted as a file"
assert {"/var/lib/kubelet/device-plugins", "/var/lib/podlink/lib"} <= {m["mountPath"] for m in mounts.values()}
assert pod["initContainers"][0]["name"] == "install-client-library"
assert meta["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9477"}, meta["annotations"]
# Node-agent defaults.
standard_labels("release")
assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
assert pod["priorityClassName"] == "system-node-critical"
assert pod["hostPID"] is True and c["securityContext"] == {"privileged": True}
assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
for absent in ["imagePullSecrets", "affinity"]:
    assert absent not in pod, absent
assert c["image"] == f"podlink/podlinkd:{chart['appVersion']}"
assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
assert c["readinessProbe"]["exec"]["command"] == ["podlinkd", "--probe", "/readyz", "--metrics-addr", "0.0.0.0:9477"]
assert c["livenessProbe"]["exec"]["command"][:3] == ["podlinkd", "--probe", "/healthz"]
cm = next(d for d in docs if d["kind"] == "ConfigMap")
assert json.loads(cm["data"]["config.json"])["limits"]["max_sessions"] == 1024
print("default render:", " ".join(args))
PY

# A laptop or single machine: podlinkd's own defaults.
"$render" -namespace podlink-system -f charts/podlink/values-standalone.yaml charts/podlink > "$tmp/standalone.yaml" \
  || fail "values-standalone.yaml does not render"
lint "$tmp/standalone.yaml" "the standalone render"
python3 - "$tmp/standalone.yaml" <<'PY' || fail "standalone render"
exec(open(__import__("os").environ["RENDER_PY"]).read())
for w in ["--socket-dir=/run/podlink", "--pod-source=standalone", "--metrics-addr=127.0.0.1:9477",
          "--relay-workers=0", "--relay-streams=4", "--log-level=info"]:
    assert w in args, (w, args)
assert not any(a.startswith(("--device-plugin-dir", "--host-lib-dir", "--cri-socket", "--no-gpu")) for a in args), args
assert "cri-socket-dir" not in vols and "host-lib" not in vols and "initContainers" not in pod
assert "annotations" not in meta, "no scrape annotations on loopback metrics"
assert c["readinessProbe"]["exec"]["command"] == ["podlinkd", "--probe", "/readyz", "--metrics-addr", "127.0.0.1:9477"]
standard_labels("release")
print("standalone render:", " ".join(args))
PY

# Every node-agent value, set.
cat > "$tmp/custom.yaml" <<'EOF'
image: {repository: registry.example/podlinkd, tag: "9.9.9", pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
criSocket: /var/run/crio/crio.sock
updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 2}}
securityContext: {privileged: false, capabilities: {add: [SYS_PTRACE]}}
priorityClassName: ""
podAnnotations: {example.com/team: ml, prometheus.io/scrape: "false"}
podLabels: {team: ml}
nodeSelector: null  # (a map merges with the default; null drops it, as in Helm)
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions: [{key: example.com/gpu, operator: In, values: [h100]}]
tolerations: []
EOF
"$render" -namespace gpu-system -name edge -f "$tmp/custom.yaml" charts/podlink > "$tmp/custom-render.yaml" \
  || fail "the chart with every node-agent value set does not render"
lint "$tmp/custom-render.yaml" "the render with every node-agent value set"
python3 - "$tmp/custom-render.yaml" <<'PY' || fail "render with every node-agent value set"
exec(open(__import__("os").environ["RENDER_PY"]).read())
assert all(d["metadata"].get("namespace") == "gpu-system" for d in docs)
standard_labels("edge")
assert pod["imagePullSecrets"] == [{"name": "regcred"}]
assert c["image"] == "registry.example/podlinkd:9.9.9" and c["imagePullPolicy"] == "Always"
assert pod["initContainers"][0]["image"] == c["image"]
assert "--cri-socket=/var/run/crio/crio.sock" in args
assert mounts["cri-socket-dir"]["mountPath"] == "/var/run/crio"
assert vols["cri-socket-dir"]["hostPath"] == {"path": "/var/run/crio", "type": "Directory"}
assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
assert c["securityContext"] == {"privileged": False, "capabilities": {"add": ["SYS_PTRACE"]}}
assert "priorityClassName" not in pod
# The pod's own annotations win over the scrape annotations they name; the others stay.
assert meta["annotations"] == {"example.com/team": "ml", "prometheus.io/scrape": "false",
                               "prometheus.io/port": "9477"}, meta["annotations"]
assert meta["labels"]["team"] == "ml" and meta["labels"]["app.kubernetes.io/component"] == "podlinkd"
assert "team" not in ds["spec"]["selector"]["matchLabels"]
terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
assert terms == [{"matchExpressions": [{"key": "example.com/gpu", "operator": "In", "values": ["h100"]}]}]
assert "nodeSelector" not in pod and "tolerations" not in pod
print("every node-agent value appears where it belongs")
PY

# The mesh on: host network, its two ports, the node's certificate directory, its config.
cat > "$tmp/mesh.yaml" <<'VALUES'
podSource: standalone
criSocket: ""
devicePlugin: {enabled: false}
mesh: {enabled: true, port: 7456, dataPort: 7457, certHostPath: /var/lib/podlink-mesh, interfaces: [ens1f0],
       connectionsPerPath: 2, transport: verbs, verbsTcpFallback: false, verbsStagedOnly: true, tcpZeroCopy: false, twoHopStripe: true, relayStagingMib: 32, sealedWindowMib: 128, grantIdleSeconds: 300, keepaliveSeconds: 20,
       certRefreshSeconds: 30, advertSeconds: 15,
       peers: [{node: node-c, addresses: [10.0.3.2/30, 10.0.4.1/30], port: 7446}]}
VALUES
"$render" -f "$tmp/mesh.yaml" charts/podlink > "$tmp/mesh-render.yaml" || fail "the chart with the mesh on does not render"
lint "$tmp/mesh-render.yaml" "the render with the mesh on"
python3 - "$tmp/mesh-render.yaml" <<'PY' || fail "render with the mesh on"
import json
exec(open(__import__("os").environ["RENDER_PY"]).read())
assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
assert ports == {"metrics": 9477, "mesh": 7456, "mesh-data": 7457}, ports
assert mounts["mesh-certs"] == {"name": "mesh-certs", "mountPath": "/etc/podlink-mesh", "readOnly": True}
assert vols["mesh-certs"]["hostPath"] == {"path": "/var/lib/podlink-mesh", "type": "Directory"}
cm = next(d for d in docs if d["kind"] == "ConfigMap")
mesh = json.loads(cm["data"]["config.json"])["mesh"]
assert mesh == {"enabled": True, "listen": "0.0.0.0:7456", "data_port": 7457, "cert_dir": "/etc/podlink-mesh",
                "interfaces": ["ens1f0"], "fallback": False, "connections_per_path": 2,
                "transport": "verbs", "verbs_tcp_fallback": False, "verbs_staged_only": True, "tcp_zero_copy": False, "two_hop_stripe": True, "relay_staging_mib": 32, "sealed_window_mib": 128, "grant_idle_seconds": 300, "keepalive_seconds": 20,
                "cert_refresh_seconds": 30, "advert_seconds": 15,
                "peers": [{"node": "node-c", "addresses": ["10.0.3.2/30", "10.0.4.1/30"], "port": 7446}]}, mesh
assert "--remote-pods=apiserver" in args, args
assert pod["automountServiceAccountToken"] is True
role = next(d for d in docs if d["kind"] == "ClusterRole")
assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}], role
binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": role["metadata"]["name"]}, binding
assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                "namespace": ds["metadata"]["namespace"]}], binding
print("mesh render: host network, ports", ports, "config", mesh, "pods read by", role["metadata"]["name"])
PY
# The mesh on with remotePods forwarded: no API-server access at all.
printf 'mesh: {enabled: true, remotePods: forwarded}\n' > "$tmp/mesh-forwarded.yaml"
"$render" -f "$tmp/mesh-forwarded.yaml" charts/podlink > "$tmp/mesh-forwarded-render.yaml" \
  || fail "the chart with remotePods forwarded does not render"
python3 - "$tmp/mesh-forwarded-render.yaml" <<'PY' || fail "render with remotePods forwarded"
exec(open(__import__("os").environ["RENDER_PY"]).read())
assert "--remote-pods=forwarded" in args, args
assert "automountServiceAccountToken" not in pod
assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
PY
python3 - "$tmp/default.yaml" <<'PY' || fail "the default render has parts of the mesh"
import json
exec(open(__import__("os").environ["RENDER_PY"]).read())
assert "hostNetwork" not in pod and "mesh-certs" not in vols
assert "automountServiceAccountToken" not in pod and not any(a.startswith("--remote-pods") for a in args), args
assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
cm = next(d for d in docs if d["kind"] == "ConfigMap")
assert "mesh" not in json.loads(cm["data"]["config.json"])
assert json.loads(cm["data"]["config.json"])["nccl_native"] == {"enabled": True, "shm_size_mib": 1024}
PY

# NOTES.txt, what `helm install` prints.
notes() {  # notes VALUES WANT... [-- UNWANTED...]: with VALUES ("": none) each WANT is in the notes, no UNWANTED is
  local values=$1 f=()
  shift
  [ -z "$values" ] || f=(-f "$values")
  "$render" -namespace podlink-system "${f[@]}" -notes charts/podlink > "$tmp/notes" || fail "NOTES.txt does not render"
  local want=1
  for s in "$@"; do
    if [ "$s" = -- ]; then want=0; continue; fi
    if grep -qF -- "$s" "$tmp/notes"; then
      [ $want = 1 ] || fail "NOTES.txt ($values) says '$s': $(cat "$tmp/notes")"
    else
      [ $want = 0 ] || fail "NOTES.txt ($values) lacks '$s': $(cat "$tmp/notes")"
    fi
  done
}
notes "" "kubectl -n podlink-system get pods -l app.kubernetes.io/component=podlinkd" \
  "pod-security.kubernetes.io/enforce=privileged" "container runtime at /run/containerd/containerd.sock" \
  "podlink.io/peer" "updateStrategy is OnDelete" \
  "delete pod -l app.kubernetes.io/component=podlinkd --field-selector spec.nodeName=NODE" \
  "closes every podlink session on its node" -- "Pod source standalone" "No device plugin"
notes charts/podlink/values-standalone.yaml "Pod source standalone" "No device plugin: mount /run/podlink" \
  -- "container runtime at" "Metrics:"
notes "$tmp/custom.yaml" "updateStrategy is RollingUpdate" "replaces podlinkd on every node" \
  "/var/run/crio/crio.sock" -- "updateStrategy is OnDelete"

# The renders' podlinkd, started with exactly their arguments and config, pass their readiness probes.
for r in default standalone custom-render mesh-render; do
  bash tests/deploy/start_rendered.sh "$tmp/$r.yaml" "$podlinkd" "chart, $r" || fail "the $r render's podlinkd"
done
# The default render's init container replaces the client library without breaking a process using it.
bash tests/deploy/check_library_install.sh "$tmp/default.yaml" "chart, default" \
  || fail "the default render's install-client-library"

# Bad combinations fail the render and say why.
bad() {  # bad "values yaml" "expected message"
  printf '%s\n' "$1" > "$tmp/bad.yaml"
  if "$render" -f "$tmp/bad.yaml" charts/podlink > /dev/null 2> "$tmp/err"; then fail "rendered despite: $1"; fi
  grep -qF "$2" "$tmp/err" || fail "render of '$1' failed without '$2': $(cat "$tmp/err")"
}
nbad=0
while IFS='|' read -r values message; do
  bad "$values" "$message"
  nbad=$((nbad + 1))
done <<'EOF'
podSource: kubelet|podSource must be standalone or cri
criSocket: ""|podSource=cri needs criSocket
criSocket: run/containerd/containerd.sock|criSocket must be an absolute path in a directory other than /
criSocket: /containerd.sock|criSocket must be an absolute path in a directory other than /
podSource: standalone|devicePlugin.enabled with podSource=standalone
devicePlugin: {devices: 0}|devicePlugin.devices must be in 1..100000
metrics: {port: 70000}|metrics.port must be in 1..65535
relay: {workers: 65}|relay.workers must be in 0..64
relay: {streams: 0}|relay.streams must be in 1..64
logLevel: loud|logLevel must be trace, debug, info, warn or error
limits: {maxSessions: 0}|limits.maxSessions must be a positive integer
updateStrategy: {type: Recreate}|updateStrategy.type must be OnDelete or RollingUpdate
podLabels: {app.kubernetes.io/name: mine}|podLabels must not set app.kubernetes.io/name
podLabels: {helm.sh/chart: mine}|podLabels must not set helm.sh/chart
mesh: {enabled: true, port: 0}|mesh.port and mesh.dataPort must be in 1..65535
mesh: {enabled: true, dataPort: 9477}|mesh.port, mesh.dataPort and metrics.port must differ
mesh: {enabled: true, dataPort: 7446}|mesh.port, mesh.dataPort and metrics.port must differ
mesh: {enabled: true, certHostPath: certs}|mesh.certHostPath must be an absolute path
mesh: {enabled: true, connectionsPerPath: 17}|mesh.connectionsPerPath must be in 1..16
mesh: {enabled: true, transport: udp}|mesh.transport must be tcp or verbs
mesh: {enabled: true, remotePods: trust}|mesh.remotePods must be apiserver, forwarded or auto
mesh: {enabled: true, verbsTcpFallback: "no"}|mesh.verbsTcpFallback must be true or false
mesh: {enabled: true, verbsStagedOnly: "yes"}|mesh.verbsStagedOnly must be true or false
mesh: {enabled: true, tcpZeroCopy: 0}|mesh.tcpZeroCopy must be true or false
mesh: {enabled: true, twoHopStripe: "on"}|mesh.twoHopStripe must be true or false
mesh: {enabled: true, fallback: 1}|mesh.fallback must be true or false
mesh: {enabled: true, relayStagingMib: 8}|mesh.relayStagingMib must be in 16..65536
mesh: {enabled: true, sealedWindowMib: 8}|mesh.sealedWindowMib must be in 16..65536
mesh: {enabled: true, keepaliveSeconds: 0}|mesh.grantIdleSeconds must be in 1..604800
mesh: {enabled: true, grantIdleSeconds: 60, keepaliveSeconds: 60}|at least twice mesh.keepaliveSeconds
mesh: {enabled: true, advertSeconds: 0}|mesh.advertSeconds must be in 1..3600
ncclNative: {enabled: "yes"}|ncclNative.enabled must be true or false
ncclNative: {shmSizeMib: 8}|ncclNative.shmSizeMib must be in 16..1048576
EOF
echo "chart renders its cluster defaults, values-standalone.yaml and every node-agent value, lints, and refuses" \
  "$nbad bad combinations"
