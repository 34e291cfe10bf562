#!/usr/bin/env bash
# kubectl-podlink as users run it (`kubectl podlink ...`, through the real
# kubectl's plugin lookup), with tests/fixtures/fake-kubectl first on PATH for
# the calls the plugin makes (it logs each one):
#   --kubeconfig and --context reach every kubectl call, in each command that
#   makes one; without -n the namespace is the context's (empty: default), -n
#   wins, and an unreadable kubeconfig is explained; -o yaml reads back
#   (PyYAML) as exactly the -o json document; other -o values exit 2 with the
#   reason; `version` prints the plugin's version, says podlinkd is not
#   reachable (there is none here), and makes no kubectl call.
#
#   check_kubectl_podlink.sh KUBECTL_PODLINK VERSION
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 KUBECTL_PODLINK VERSION" >&2
  exit 2
fi
PLUGIN=$(realpath "$1") VERSION=$2
FIXTURES=$(cd "$(dirname "$0")/../fixtures" && pwd)
KUBECTL=$(command -v kubectl) || { echo "FAIL: kubectl is not installed (scripts/deps.sh installs it)"; exit 1; }
python3 -c 'import yaml' || { echo "FAIL: python3 with PyYAML is needed (scripts/deps.sh installs it)"; exit 1; }
TMP=$(mktemp -d /tmp/podlink-check-kubectl.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/bin" "$TMP/home"
cp "$FIXTURES/fake-kubectl" "$TMP/bin/kubectl"
ln -s "$PLUGIN" "$TMP/bin/kubectl-podlink"
export PATH="$TMP/bin:$PATH" HOME="$TMP/home"
# No podlinkd here: the directory does not exist.
export PODLINK_SOCKET_DIR=$TMP/no-daemon/sock
unset KUBECONFIG FAKE_KUBECTL_NAMESPACE FAKE_KUBECTL_CONFIG_ERROR FAKE_NO_DAEMON
export FAKE_KUBECTL_POD_JSON=$FIXTURES/pod-good.json
KC=(--kubeconfig "$TMP/my kubeconfig" --context ctx-a)  # a space in the path: quoted through the shell
PREFIX="--kubeconfig $TMP/my kubeconfig --context ctx-a "
failures=0
n=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# podlink NAME ARGS...: `kubectl podlink ARGS` with the fake kubectl's calls
# logged to $TMP/NAME.log; sets rc, out (stdout), err (stderr), log.
podlink() {
  local name=$1
  shift
  : > "$TMP/$name.log"
  out=$(FAKE_KUBECTL_LOG=$TMP/$name.log timeout 60 "$KUBECTL" podlink "$@" 2> "$TMP/$name.err" < /dev/null)
  rc=$?
  err=$(cat "$TMP/$name.err")
  log=$(cat "$TMP/$name.log")
  n=$((n + 1))
}

# want_rc RC WHAT: the last command exited RC.
want_rc() {
  [ "$rc" -eq "$1" ] || fail "$2: exit $rc (want $1); stdout: ${out:0:300}; stderr: ${err:0:300}"
}

# logged TEXT WHAT: the last command's kubectl calls include the line TEXT.
logged() {
  grep -qxF -- "$1" <<< "$log" || fail "$2: no kubectl call '$1' in: $log"
}

# all_prefixed WHAT: every kubectl call of the last command carries --kubeconfig and --context.
all_prefixed() {
  [ -n "$log" ] || fail "$1: no kubectl call at all"
  while IFS= read -r line; do
    [[ "$line" == "$PREFIX"* ]] || fail "$1: kubectl call without --kubeconfig/--context: $line"
  done <<< "$log"
}

# same_document JSON_FILE YAML_FILE WHAT: both parse, to equal values of equal types.
same_document() {
  python3 - "$1" "$2" <<'PY' || fail "$3: -o yaml is not the -o json document"
import json, sys, yaml
j = json.load(open(sys.argv[1]))
y = yaml.safe_load(open(sys.argv[2]))
def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, z) for x, z in zip(a, b))
    return a == b
if not same(j, y):
    print("json:", j, "\nyaml:", y)
    sys.exit(1)
PY
}

# --- the namespace and the kubeconfig --------------------------------------
# Without -n: the context's namespace, asked with the same --kubeconfig/--context.
FAKE_KUBECTL_NAMESPACE=team-a podlink ns-context doctor decode-0 "${KC[@]}" -o json
want_rc 0 "doctor with the context's namespace"
logged "${PREFIX}config view --minify -o jsonpath={..namespace}" "namespace from the context"
logged "${PREFIX}get pod decode-0 -n team-a -o json" "pod looked up in the context's namespace"
all_prefixed "doctor"
[[ "$out" == *'"pod": "ml/decode-0"'* ]] || fail "doctor's report: $out"
# -n wins: the context is not asked.
FAKE_KUBECTL_NAMESPACE=team-a podlink ns-given doctor decode-0 "${KC[@]}" -n other -o json
want_rc 0 "doctor -n other"
logged "${PREFIX}get pod decode-0 -n other -o json" "-n wins over the context"
grep -q "config view" <<< "$log" && fail "-n given, yet the context was asked: $log"
all_prefixed "doctor -n"
podlink ns-long doctor decode-0 --namespace=other2
want_rc 0 "doctor --namespace=other2"
logged "get pod decode-0 -n other2 -o json" "--namespace=other2"
# A context without a namespace: default. No --kubeconfig/--context: none passed.
FAKE_KUBECTL_NAMESPACE= podlink ns-default doctor decode-0
want_rc 0 "doctor, context without a namespace"
logged "config view --minify -o jsonpath={..namespace}" "namespace from the current context"
logged "get pod decode-0 -n default -o json" "empty context namespace means default"
# kubectl cannot read the kubeconfig: the reason, and what to do.
FAKE_KUBECTL_CONFIG_ERROR="current-context must exist in order to minify" podlink ns-error doctor decode-0 "${KC[@]}"
want_rc 1 "doctor with an unreadable kubeconfig"
[[ "$err" == *"current-context must exist in order to minify"*"pass -n NAMESPACE"* ]] \
  || fail "unreadable kubeconfig not explained: $err"
grep -q "get pod" <<< "$log" && fail "the pod was looked up without a namespace: $log"
# --pod-json needs no cluster: no kubectl call.
podlink pod-json doctor decode-0 "${KC[@]}" --pod-json "$FIXTURES/pod-good.json"
want_rc 0 "doctor --pod-json"
[ -z "$log" ] || fail "doctor --pod-json called kubectl: $log"

# --- every command that calls kubectl carries --kubeconfig/--context -------
# Cluster mode: the pod's node, the podlinkd pod there, exec (which runs the
# plugin here, where no podlinkd is: exit 1 after the three calls).
FAKE_KUBECTL_NAMESPACE=team-a podlink cluster status --for-pod decode-0 "${KC[@]}" -o yaml
want_rc 1 "status --for-pod without podlinkd"
logged "${PREFIX}config view --minify -o jsonpath={..namespace}" "status --for-pod: namespace"
logged "${PREFIX}get pod decode-0 -n team-a -o jsonpath={.spec.nodeName}" "status --for-pod: the pod's node"
logged "${PREFIX}get pods -n podlink-system -l app.kubernetes.io/component=podlinkd --field-selector spec.nodeName=gpu-node-1 -o jsonpath={.items[0].metadata.name}" \
  "status --for-pod: the podlinkd pod"
logged "${PREFIX}exec -n podlink-system podlinkd-abcde -- kubectl-podlink status -o json" \
  "status --for-pod: -o yaml asks the pod for JSON"
all_prefixed "status --for-pod"
# --node: no pod to look up, so no namespace either.
podlink node exports --node gpu-node-7 "${KC[@]}"
logged "${PREFIX}exec -n podlink-system podlinkd-abcde -- kubectl-podlink exports" "exports --node"
grep -q "config view" <<< "$log" && fail "--node needs no namespace, yet the context was asked: $log"
all_prefixed "exports --node"
# bench: both execs (podlink-demo is not in the "pods": it fails after them).
FAKE_KUBECTL_NAMESPACE=team-a podlink bench bench prefill-0 decode-0 "${KC[@]}" --demo /nonexistent/podlink-demo
want_rc 1 "bench without podlink-demo"
logged "${PREFIX}exec -n team-a prefill-0 -- /nonexistent/podlink-demo kv-serve --size 1073741824 --verify 7" \
  "bench: kv-serve in the receiver"
all_prefixed "bench"
# version through the podlinkd pod: its answer (no daemon there either) comes back.
podlink version-node version --node gpu-node-1 "${KC[@]}" -o json
want_rc 0 "version --node"
logged "${PREFIX}exec -n podlink-system podlinkd-abcde -- kubectl-podlink version -o json" "version --node"
all_prefixed "version --node"
[[ "$out" == *'"daemon_error": "cannot reach podlinkd'* ]] || fail "version --node: the pod's answer: $out"

# --- -o yaml is the -o json document -----------------------------------------
for fixture in pod-good pod-bad pod-direct-missing pod-native-missing pod-native-good; do
  for format in json yaml; do
    podlink "doctor-$fixture-$format" doctor x --pod-json "$FIXTURES/$fixture.json" -o "$format"
    printf '%s\n' "$out" > "$TMP/$fixture.$format"
  done
  same_document "$TMP/$fixture.json" "$TMP/$fixture.yaml" "doctor $fixture"
done
grep -qx 'pod: ml/decode-1' "$TMP/pod-bad.yaml" || fail "doctor -o yaml: plain scalars unquoted: $(cat "$TMP/pod-bad.yaml")"
podlink version-json version -o json
printf '%s\n' "$out" > "$TMP/version.json"
podlink version-yaml version --output=yaml
printf '%s\n' "$out" > "$TMP/version.yaml"
same_document "$TMP/version.json" "$TMP/version.yaml" "version"

# --- bad -o ----------------------------------------------------------------
for bad in wide table JSON yml; do
  podlink "bad-$bad" doctor decode-0 --pod-json "$FIXTURES/pod-good.json" -o "$bad"
  want_rc 2 "-o $bad"
  [[ "$err" == *"-o/--output must be json or yaml (got '$bad')"* ]] || fail "-o $bad: reason: $err"
  [ -z "$out" ] || fail "-o $bad printed: $out"
done

# --- version ---------------------------------------------------------------
podlink version version
want_rc 0 "version"
[[ "$out" == "kubectl-podlink $VERSION"$'\n'"podlinkd: not reachable: "* ]] || fail "version: $out"
[ -z "$log" ] || fail "version called kubectl: $log"
podlink version-json2 version -o json
python3 -c '
import json, sys
j = json.loads(sys.argv[2])
assert j["plugin_version"] == sys.argv[1], j
assert "cannot reach podlinkd" in j["daemon_error"], j
assert "daemon_version" not in j, j
' "$VERSION" "$out" || fail "version -o json: $out"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed in $n runs"
  exit 1
fi
echo "all checks passed ($n runs)"
