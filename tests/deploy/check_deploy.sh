#!/usr/bin/env bash
# deploy/ renders with kustomize, every YAML lints, and the rendered DaemonSet's
# podlinkd starts with exactly its arguments and config until its readiness
# probe passes. Usage: check_deploy.sh REPO PODLINKD
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
yamllint -s deploy/ charts/podlink/Chart.yaml charts/podlink/values.yaml charts/podlink/values-cluster.yaml .yamllint \
  tests/deploy/rendered.yamllint \
  || fail "yamllint (sources)"
yamllint -s -c tests/deploy/rendered.yamllint "$out" || fail "yamllint (rendered)"
# The DaemonSet's podlinkd, started with exactly the rendered arguments and config, passes its readiness probe.
bash tests/deploy/start_rendered.sh "$out" "$podlinkd" "deploy/ (kustomize)" || fail "the rendered DaemonSet's podlinkd"
# The chart's values default to podlinkd's own defaults.
"$podlinkd" --print-defaults > "$out.defaults" || fail "podlinkd --print-defaults"
python3 - charts/podlink/values.yaml "$out.defaults" <<'PY' || fail "chart values differ from podlinkd's defaults"
import json, sys, yaml
v = yaml.safe_load(open(sys.argv[1]))
d = json.load(open(sys.argv[2]))
host, port = d["metrics_addr"].rsplit(":", 1)
pairs = [
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
]
bad = [f"{k}: chart {a!r}, podlinkd {b!r}" for k, a, b in pairs if a != b]
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
