#!/usr/bin/env bash
# Renders charts/podlink with tests/deploy/chartrender (Go text/template +
# sprig + include/toYaml/fail, as `helm template` does; Helm itself is not a
# Debian package) and checks what comes out (podlinkd started with each
# render's arguments until its readiness probe passes): the defaults render podlinkd's own
# defaults, values-cluster.yaml renders the cluster set-up, every bad
# combination the validation template knows fails the render with its message,
# and the rendered YAML lints. Usage: check_chart.sh REPO BUILD_DIR PODLINKD
set -euo pipefail
repo=$(realpath "$1") build=$(realpath -m "$2") podlinkd=$(realpath "$3")
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

# Defaults: podlinkd's own, probes through podlinkd --probe, no device plugin.
"$render" -namespace podlink-system charts/podlink > "$tmp/default.yaml" || fail "default values do not render"
lint "$tmp/default.yaml" "the default render"
python3 - "$tmp/default.yaml" default <<'PY' || fail "default render"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = sorted(d["kind"] for d in docs)
assert kinds == ["ConfigMap", "DaemonSet", "ServiceAccount"], kinds
ds = next(d for d in docs if d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]["spec"]
c = pod["containers"][0]
args = c["args"]
want = ["--socket-dir=/run/podlink", "--pod-source=standalone", "--metrics-addr=127.0.0.1:9477",
        "--relay-workers=0", "--relay-streams=4", "--log-level=info"]
for w in want:
    assert w in args, (w, args)
assert not any(a.startswith(("--device-plugin-dir", "--cri-socket", "--no-gpu")) for a in args), args
assert pod["hostPID"] is True and c["securityContext"]["privileged"] is True
assert c["readinessProbe"]["exec"]["command"] == ["podlinkd", "--probe", "/readyz", "--metrics-addr", "127.0.0.1:9477"]
assert c["livenessProbe"]["exec"]["command"][:3] == ["podlinkd", "--probe", "/healthz"]
assert "annotations" not in ds["spec"]["template"]["metadata"], "no scrape annotations on loopback metrics"
assert "initContainers" not in pod
assert all(d["metadata"].get("namespace") == "podlink-system" for d in docs)
cm = next(d for d in docs if d["kind"] == "ConfigMap")
import json
assert json.loads(cm["data"]["config.json"])["limits"]["max_sessions"] == 1024
print("default render:", " ".join(args))
PY

# The cluster set-up.
"$render" -namespace podlink-system -f charts/podlink/values-cluster.yaml charts/podlink > "$tmp/cluster.yaml" \
  || fail "values-cluster.yaml does not render"
lint "$tmp/cluster.yaml" "the cluster render"
python3 - "$tmp/cluster.yaml" <<'PY' || fail "cluster render"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]["spec"]
args = pod["containers"][0]["args"]
for w in ["--pod-source=cri", "--cri-socket=/run/containerd/containerd.sock",
          "--device-plugin-dir=/var/lib/kubelet/device-plugins", "--device-plugin-devices=64",
          "--host-lib-dir=/var/lib/podlink/lib", "--metrics-addr=0.0.0.0:9477"]:
    assert w in args, (w, args)
mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
assert {"/run/containerd/containerd.sock", "/var/lib/kubelet/device-plugins", "/var/lib/podlink/lib"} <= mounts, mounts
vols = {v["name"]: v for v in pod["volumes"]}
assert vols["cri-socket"]["hostPath"] == {"path": "/run/containerd/containerd.sock", "type": "Socket"}
assert pod["initContainers"][0]["name"] == "install-client-library"
assert ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9477"
print("cluster render:", " ".join(args))
PY
# Both renders' podlinkd, started with exactly their arguments and config, pass their readiness probes.
for r in default cluster; do
  bash tests/deploy/start_rendered.sh "$tmp/$r.yaml" "$podlinkd" "chart, $r values" || fail "the $r render's podlinkd"
done

# Bad combinations fail the render and say why.
bad() {  # bad "values yaml" "expected message"
  printf '%s\n' "$1" > "$tmp/bad.yaml"
  if "$render" -f "$tmp/bad.yaml" charts/podlink > /dev/null 2> "$tmp/err"; then fail "rendered despite: $1"; fi
  grep -qF "$2" "$tmp/err" || fail "render of '$1' failed without '$2': $(cat "$tmp/err")"
}
bad 'podSource: kubelet' 'podSource must be standalone or cri'
bad 'podSource: cri' 'podSource=cri needs criSocket'
bad 'devicePlugin: {enabled: true}' 'devicePlugin.enabled with podSource=standalone'
bad '{podSource: cri, criSocket: /run/containerd/containerd.sock, devicePlugin: {enabled: true, devices: 0}}' \
  'devicePlugin.devices must be in 1..100000'
bad 'metrics: {port: 70000}' 'metrics.port must be in 1..65535'
bad 'relay: {workers: 65}' 'relay.workers must be in 0..64'
bad 'relay: {streams: 0}' 'relay.streams must be in 1..64'
bad 'logLevel: loud' 'logLevel must be trace, debug, info, warn or error'
bad 'limits: {maxSessions: 0}' 'limits.maxSessions must be a positive integer'
echo "chart renders with its defaults and values-cluster.yaml, lints, and refuses 9 bad combinations"
