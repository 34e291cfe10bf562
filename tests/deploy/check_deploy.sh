#!/usr/bin/env bash
# deploy/ renders with kustomize, every YAML lints, the rendered DaemonSet's
# podlinkd starts with exactly its arguments and config (and a test container
# runtime behind its runtime-socket volume) until its readiness probe passes,
# and its init container installs the client library without disturbing a
# process that has the old one mapped. The chart's values equal podlinkd's own
# defaults with values-standalone.yaml, and differ from them only where a
# cluster needs it without. Usage: check_deploy.sh REPO PODLINKD
set -euo pipefail
repo=$1 podlinkd=$2
cd "$repo"
fail() { echo "FAIL: $*"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
kubectl kustomize deploy/ > "$out" || fail "kubectl kustomize deploy/ did not render"
for kind in Namespace ServiceAccount ConfigMap DaemonSet; do
  grep -q "^kind: $kind$" "$out" || fail "rendered deploy/ lacks a $kind"
done
[ "$(grep -c '^  namespace: podlink-system$' "$out")" -ge 3 ] || fail "objects not placed in podlink-system"
grep -q 'hostPID: true' "$out" || fail "DaemonSet must run in the host PID namespace"
grep -q 'pod-security.kubernetes.io/enforce: privileged' "$out" \
  || fail "the Namespace must allow privileged pods (Pod Security Admission)"
grep -q 'privileged: true' "$out" || fail "DaemonSet must be privileged"
grep -q 'path: /readyz' "$out" || fail "no readiness probe on /readyz"
grep -q 'path: /healthz' "$out" || fail "no liveness probe on /healthz"
grep -q 'mountPath: /var/lib/kubelet/device-plugins' "$out" || fail "device-plugins dir not mounted"
python3 - "$out" <<'PY' || fail "the rendered DaemonSet's update strategy or runtime socket mount"
import sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "podlinkd")
assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}, ds["spec"]["updateStrategy"]
assert "--cri-socket=/run/containerd/containerd.sock" in c["args"], c["args"]
vols = {v["name"]: v for v in pod["volumes"]}
assert vols["cri-socket-dir"]["hostPath"] == {"path": "/run/containerd", "type": "Directory"}, vols
assert {"name": "cri-socket-dir", "mountPath": "/run/containerd", "readOnly": True} in c["volumeMounts"]
assert not any(v.get("hostPath", {}).get("type") == "Socket" for v in pod["volumes"]), "a socket mounted as a file"
# Other nodes' pods are confirmed with the API server: pods read, nothing else.
assert "--remote-pods=apiserver" in c["args"], c["args"]
assert pod["automountServiceAccountToken"] is True
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
assert [r["rules"] for r in roles] == [[{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]], roles
binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"], binding
assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                "namespace": ds["metadata"]["namespace"]}], binding
PY
yamllint -s deploy/ charts/podlink/Chart.yaml charts/podlink/values.yaml charts/podlink/values-standalone.yaml \
  .yamllint tests/deploy/rendered.yamllint \
  || fail "yamllint (sources)"
yamllint -s -c tests/deploy/rendered.yamllint "$out" || fail "yamllint (rendered)"
# The DaemonSet's podlinkd, started with exactly the rendered arguments and config, passes its readiness probe.
bash tests/deploy/start_rendered.sh "$out" "$podlinkd" "deploy/ (kustomize)" || fail "the rendered DaemonSet's podlinkd"
bash tests/deploy/check_library_install.sh "$out" "deploy/ (kustomize)" || fail "the rendered install-client-library"
# The chart's values with values-standalone.yaml are podlinkd's own defaults;
# without it they differ only in what a cluster needs.
"$podlinkd" --print-defaults > "$out.defaults" || fail "podlinkd --print-defaults"
python3 - charts/podlink/values.yaml charts/podlink/values-standalone.yaml "$out.defaults" <<'PY' \
  || fail "chart values differ from podlinkd's defaults"
import copy, json, sys, yaml

def merged(base, over):  # what -f does to the chart's values
    out = copy.deepcopy(base)
    for k, x in over.items():
        out[k] = merged(out[k], x) if isinstance(x, dict) and isinstance(out.get(k), dict) else x
    return out

cluster = yaml.safe_load(open(sys.argv[1]))
standalone = merged(cluster, yaml.safe_load(open(sys.argv[2])))
d = json.load(open(sys.argv[3]))
host, port = d["metrics_addr"].rsplit(":", 1)
def pairs(v):  # (chart key, chart value, podlinkd default)
    return [
        ("socketDir", v["socketDir"], d["socket_dir"]),
        ("podSource", v["podSource"], d["pod_source"]),
        ("criSocket", v["criSocket"], d["cri_socket"]),
        ("devicePlugin.enabled", v["devicePlugin"]["enabled"], d["device_plugin_dir"] != ""),
        ("devicePlugin.devices", v["devicePlugin"]["devices"], d["device_plugin_devices"]),
        ("devicePlugin.hostLibDir", v["devicePlugin"]["hostLibDir"], d["host_lib_dir"]),
        ("metrics.address", v["metrics"]["address"], host),
        ("metrics.port", v["metrics"]["port"], int(port)),
        ("relay.workers", v["relay"]["workers"], d["relay_workers"]),
        ("relay.streams", v["relay"]["streams"], d["relay_streams"]),
        ("logLevel", v["logLevel"], d["log_level"]),
        ("gpu", v["gpu"], not d["no_gpu"]),
        ("limits.maxSessions", v["limits"]["maxSessions"], d["limits"]["max_sessions"]),
        ("limits.maxExportsPerSession", v["limits"]["maxExportsPerSession"], d["limits"]["max_exports_per_session"]),
        ("limits.maxExportsTotal", v["limits"]["maxExportsTotal"], d["limits"]["max_exports_total"]),
        ("limits.maxPendingOffers", v["limits"]["maxPendingOffers"], d["limits"]["max_pending_offers"]),
        ("mesh.enabled", v["mesh"]["enabled"], d["mesh"]["enabled"]),
        ("mesh.port", v["mesh"]["port"], int(d["mesh"]["listen"].rsplit(":", 1)[1])),
        ("mesh.dataPort", v["mesh"]["dataPort"], d["mesh"]["data_port"]),
        ("mesh.fallback", v["mesh"]["fallback"], d["mesh"]["fallback"]),
        ("mesh.connectionsPerPath", v["mesh"]["connectionsPerPath"], d["mesh"]["connections_per_path"]),
        ("mesh.transport", v["mesh"]["transport"], d["mesh"]["transport"]),
        ("mesh.remotePods", v["mesh"]["remotePods"], d["remote_pods"]),
    ]
bad = [f"with values-standalone.yaml, {k}: chart {a!r}, podlinkd {b!r}" for k, a, b in pairs(standalone) if a != b]
# The cluster defaults: exactly these differ from podlinkd's, and are what a cluster needs.
cluster_only = {"podSource": "cri", "criSocket": "/run/containerd/containerd.sock", "devicePlugin.enabled": True,
                "metrics.address": "0.0.0.0", "mesh.remotePods": "apiserver"}
differ = {k: a for k, a, b in pairs(cluster) if a != b}
if differ != cluster_only:
    bad.append(f"values.yaml differs from podlinkd's defaults in {differ}, expected {cluster_only}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
rm -f "$out.defaults"
# Flags in both forms, and errors with the reason.
"$podlinkd" --help | grep -q -- "--socket-dir" || fail "--help does not list --socket-dir"
"$podlinkd" --version | grep -q "^podlinkd " || fail "--version"
for bad in "--bogus" "--log-level=loud" "--relay-workers=many" "--socket-dir"; do
  if "$podlinkd" $bad > /dev/null 2> "$out.err"; then fail "podlinkd accepted $bad"; fi
  [ -s "$out.err" ] || fail "podlinkd $bad failed without saying why"
done
# The exec probes: podlinkd --probe against a live daemon on loopback.
sock=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$podlinkd" --no-gpu --socket-dir "$sock" --metrics-addr="127.0.0.1:$port" 2> "$sock/log" &
dpid=$!
for _ in $(seq 100); do grep -q event=ready "$sock/log" && break; sleep 0.1; done
grep -q event=ready "$sock/log" || { kill "$dpid"; fail "podlinkd did not start: $(cat "$sock/log")"; }
"$podlinkd" --probe /readyz --metrics-addr "127.0.0.1:$port" || { kill "$dpid"; fail "--probe /readyz failed"; }
"$podlinkd" --probe /healthz --metrics-addr "127.0.0.1:$port" || { kill "$dpid"; fail "--probe /healthz failed"; }
if "$podlinkd" --probe /nonexistent --metrics-addr "127.0.0.1:$port" 2> "$sock/probe"; then
  kill "$dpid"; fail "--probe of an unknown path succeeded"
fi
grep -q "404" "$sock/probe" || { kill "$dpid"; fail "--probe did not report the status: $(cat "$sock/probe")"; }
kill "$dpid"; wait "$dpid" 2>/dev/null || true
if "$podlinkd" --probe /healthz --metrics-addr "127.0.0.1:$port" 2> "$sock/probe"; then fail "--probe without a daemon succeeded"; fi
grep -q "no answer" "$sock/probe" || fail "--probe without a daemon: $(cat "$sock/probe")"
for addr in garbage 127.0.0.1:0 127.0.0.1:99999 not-an-ip:9477; do
  if "$podlinkd" --probe /healthz --metrics-addr "$addr" 2> "$sock/probe"; then fail "--probe accepted $addr"; fi
  grep -qE "is not IPv4-host:port|cannot be probed" "$sock/probe" || fail "--probe $addr: $(cat "$sock/probe")"
done
rm -rf "$sock"
echo "deploy/ renders ($(grep -c '^kind:' "$out") objects), lints, and its podlinkd starts and becomes ready"
