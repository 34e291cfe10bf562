#!/usr/bin/env bash
# deploy/ renders with kustomize, every YAML lints, and the DaemonSet and the
# chart only pass flags podlinkd knows. Usage: check_deploy.sh REPO PODLINKD
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
grep -q 'privileged: true' "$out" || fail "DaemonSet must be privileged"
grep -q 'path: /readyz' "$out" || fail "no readiness probe on /readyz"
grep -q 'path: /healthz' "$out" || fail "no liveness probe on /healthz"
grep -q 'mountPath: /var/lib/kubelet/device-plugins' "$out" || fail "device-plugins dir not mounted"
yamllint -s deploy/ charts/podlink/Chart.yaml charts/podlink/values.yaml .yamllint || fail "yamllint (sources)"
yamllint -s -d '{extends: default, rules: {indentation: {indent-sequences: whatever}, document-start: disable,
  line-length: {max: 200}}}' "$out" || fail "yamllint (rendered)"
# Every --flag the manifests pass must be one podlinkd documents.
help=$("$podlinkd" --help)
flags=$( (grep -ho -- '--[a-z-]*=' deploy/daemonset.yaml; grep -ho -- '--[a-z-]*=' charts/podlink/templates/daemonset.yaml) \
  | sort -u | tr -d '=')
[ -n "$flags" ] || fail "no flags found in the manifests"
for f in $flags; do
  grep -q -- "$f " <<<"$help" || grep -q -- "$f\$" <<<"$help" || fail "podlinkd does not know $f"
done
echo "deploy/ renders ($(grep -c '^kind:' "$out") objects), lints, and uses only known flags: $flags" | tr '\n' ' '
echo
