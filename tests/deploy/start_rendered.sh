#!/usr/bin/env bash
# Starts the real podlinkd with exactly the arguments a rendered manifest gives
# its podlinkd container, and its config file from the rendered ConfigMap, until
# the manifest's own readiness probe passes. Runs in private mount and network
# namespaces, with tmpfs over /run and /var/lib, so the manifest's paths and
# ports are used as they are. No GPU here: podlinkd serves host memory.
#
#   start_rendered.sh RENDERED.yaml PODLINKD LABEL
set -euo pipefail
rendered=$1 podlinkd=$(realpath "$2") label=$3
fail() { echo "FAIL ($label): $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$rendered" "$work" <<'PY' || fail "cannot read the podlinkd container from $rendered"
import json, shlex, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
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
open(sys.argv[2] + "/args", "w").write(shlex.join(cmd[1:]))
open(sys.argv[2] + "/ready", "w").write(shlex.join(ready[1:]))
open(sys.argv[2] + "/config.json", "w").write(config)
PY
echo "$label: podlinkd $(cat "$work/args")"
config_path=$(python3 -c 'import shlex,sys; a=shlex.split(open(sys.argv[1]).read()); print(next((x.split("=",1)[1] for x in a if x.startswith("--config=")), ""))' "$work/args")
set +e
PODLINKD=$podlinkd WORK=$work CONFIG_PATH=$config_path timeout 60 unshare --mount --net --fork bash -c '
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
  eval "args=($(cat "$WORK/args"))"
  eval "ready=($(cat "$WORK/ready"))"
  "$PODLINKD" "${args[@]}" 2> "$WORK/log" &
  pid=$!
  for _ in $(seq 150); do
    if "$PODLINKD" "${ready[@]}" 2> "$WORK/probe"; then
      echo "readiness probe passed: podlinkd ${ready[*]}"
      kill -TERM "$pid"; wait "$pid" || true
      exit 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "podlinkd exited:"; tail -20 "$WORK/log"; exit 1; }
    sleep 0.2
  done
  echo "readiness probe never passed: $(cat "$WORK/probe")"; tail -20 "$WORK/log"; kill -KILL "$pid"; exit 1
'
rc=$?
set -e
[ $rc = 0 ] || fail "podlinkd with the manifest's arguments did not become ready"
