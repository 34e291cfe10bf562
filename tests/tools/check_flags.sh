#!/usr/bin/env bash
# The tools' command lines as users type them: --flag=value and --flag value,
# --help (stdout, exit 0, every option), --version, and errors (unknown
# option, malformed or out-of-range value, unknown command) exiting 2 with the
# reason on stderr. No daemon: accepted command lines fail later, to connect
# (exit 1), which shows the parse let them through.
#
#   check_flags.sh PODLINK_DEMO PODLINK_BENCH KUBECTL_PODLINK VERSION
set -u
if [ $# -ne 4 ]; then
  echo "usage: $0 PODLINK_DEMO PODLINK_BENCH KUBECTL_PODLINK VERSION" >&2
  exit 2
fi
DEMO=$1 BENCH=$2 KUBECTL=$3 VERSION=$4
FIXTURES=$(cd "$(dirname "$0")/../fixtures" && pwd)
TMP=$(mktemp -d /tmp/podlink-check-flags.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# No podlinkd here: the directory does not exist (nor does its parent).
export PODLINK_SOCKET_DIR=$TMP/no-daemon/sock
failures=0

# expect RC STREAM TEXT CMD...: CMD exits RC and its STREAM (out or err) contains TEXT.
expect() {
  local want=$1 stream=$2 text=$3
  shift 3
  local out err rc
  out=$(timeout 30 "$@" 2>"$TMP/stderr" </dev/null)
  rc=$?
  err=$(cat "$TMP/stderr")
  local got=$out
  [ "$stream" = err ] && got=$err
  if [ "$rc" -ne "$want" ] || [[ "$got" != *"$text"* ]]; then
    echo "FAIL: $(basename "$1") ${*:2}"
    echo "      exit $rc (want $want); std$stream should contain: $text"
    echo "      stdout: ${out:0:400}"
    echo "      stderr: ${err:0:400}"
    failures=$((failures + 1))
  else
    echo "ok:   $(basename "$1") ${*:2}"
  fi
}

# help_lists BIN FLAG...: BIN --help exits 0 and lists every FLAG on stdout.
help_lists() {
  local bin=$1
  shift
  local out rc
  out=$(timeout 30 "$bin" --help 2>"$TMP/stderr")
  rc=$?
  local missing=()
  for f in "$@" --help --version; do
    grep -q -- "^  $f\b" <<<"$out" || missing+=("$f")
  done
  if [ "$rc" -ne 0 ] || [ ${#missing[@]} -ne 0 ] || [ -s "$TMP/stderr" ]; then
    echo "FAIL: $(basename "$bin") --help: exit $rc (want 0), missing: ${missing[*]:-none}, stderr: $(cat "$TMP/stderr")"
    failures=$((failures + 1))
  else
    echo "ok:   $(basename "$bin") --help lists $# options"
  fi
}

# Checks every tool shares: --version, unknown options, help.
common() {
  local bin=$1 name=$2
  expect 0 out "$name $VERSION" "$bin" --version
  expect 2 err "unknown option --no-such-flag" "$bin" --no-such-flag
  expect 2 err "unknown option --no-such-flag" "$bin" --no-such-flag=1
  expect 0 out "usage:" "$bin" -h
}

echo "== podlink-demo"
common "$DEMO" podlink-demo
help_lists "$DEMO" --allow --await-import --commands --count --desc --expect-writeback --gpu --hold --id --name \
  --relay --seed --size --verify --watch --writeback
# Accepted in both forms (and dashes or underscores in names, bare booleans):
# the command gets as far as connecting to the (absent) daemon.
expect 1 out '"what":"connect"' "$DEMO" info --size=4096 --gpu 0 --name=kv --allow ml/a,ml/b --seed=1 \
  --await-import --expect-writeback 3 --hold --watch=false --commands --relay
expect 1 out '"what":"connect"' "$DEMO" export --size 65536 --name kv --seed 7 --await_import --expect_writeback=42
expect 1 out '"what":"connect"' "$DEMO" import --id=3 --verify 7 --writeback=42 --hold
expect 1 out '"what":"connect"' "$DEMO" kv-put --desc=x --seed 1 --relay
expect 1 out '"what":"connect"' "$DEMO" cycle --count=1 --size 4096
# Malformed or out-of-range values, in both forms.
expect 2 err "--size must be a positive integer (got '0')" "$DEMO" export --size=0
expect 2 err "--size must be a positive integer (got '0')" "$DEMO" export --size 0
expect 2 err "bad value 'x' for --size" "$DEMO" export --size=x
expect 2 err "bad value 'x' for --size" "$DEMO" export --size x
expect 2 err "--size needs a value" "$DEMO" export --size
expect 2 err "bad value 'maybe' for --hold" "$DEMO" import --id 1 --hold=maybe
expect 2 err "--gpu must be a GPU index" "$DEMO" export --gpu=-2
expect 2 err "--seed must be a non-negative integer (got '-5')" "$DEMO" export --seed -5
expect 2 err "--allow takes namespace/name" "$DEMO" export --allow ml/a,nobody
expect 2 err "--count must be a positive integer" "$DEMO" cycle --count 0
# Commands and what they need.
expect 2 err "usage: podlink-demo" "$DEMO"
expect 2 err "unknown command 'frobnicate'" "$DEMO" frobnicate
expect 2 err "unexpected argument 'extra'" "$DEMO" info extra
expect 2 err "import needs --id N or --name X" "$DEMO" import
expect 2 err "kv-serve needs --verify" "$DEMO" kv-serve --size 4096
expect 2 err "kv-put needs --desc" "$DEMO" kv-put --seed 1
expect 2 err "kv-put needs --seed" "$DEMO" kv-put --desc x

echo "== podlink-bench"
common "$BENCH" podlink-bench
help_lists "$BENCH" --bidir-sizes --csv --dst-gpu --json --lat-iters --modes --passes --src-gpu --total --window \
  --kv-open --kv-blocks --kv-iters --kv-wait --kv-relay
# Accepted: stops at CUDA (no driver) or at connecting (no daemon), exit 1.
expect 1 err "podlink-bench: " "$BENCH" --total=4096 --passes 1 --lat-iters=1 --modes relay,direct --src-gpu=0 \
  --dst-gpu 0 --bidir-sizes 4096,8192 --window=2 --csv "$TMP/b.csv" --json="$TMP/b.json"
expect 2 err "--total must be at least 4096 bytes (got '100')" "$BENCH" --total=100
expect 2 err "--total must be at least 4096 bytes (got '100')" "$BENCH" --total 100
expect 2 err "bad value 'x' for --passes" "$BENCH" --passes x
expect 2 err "--passes must be a positive integer (got '0')" "$BENCH" --passes=0
expect 2 err "--lat-iters must be a positive integer" "$BENCH" --lat-iters 0
expect 2 err "--window must be a positive integer (got '-1')" "$BENCH" --window -1
expect 2 err "--src-gpu must be a GPU index" "$BENCH" --src-gpu=-1
expect 1 err "podlink-bench: " "$BENCH" --kv-open cache --kv-blocks 16K:8,4M:2 --kv-iters=1 --kv-wait 0 --kv-relay
expect 2 err "--kv-blocks entries are SIZE:COUNT, e.g. 64K:2048 (got '16K:0')" "$BENCH" --kv-open c --kv-blocks 16K:0
expect 2 err "--kv-blocks entries are SIZE:COUNT, e.g. 64K:2048 (got '16Q:4')" "$BENCH" --kv-blocks=16Q:4
expect 2 err "--kv-blocks entries are SIZE:COUNT, e.g. 64K:2048 (got '4096')" "$BENCH" --kv-blocks 4096
expect 2 err "--kv-iters must be a positive integer (got '0')" "$BENCH" --kv-iters 0
expect 2 err "unknown mode 'warp'" "$BENCH" --modes relay,warp
expect 2 err "--bidir-sizes must be positive integers, comma-separated (got 'x')" "$BENCH" --bidir-sizes 4096,x
expect 2 err "unexpected argument 'relay'" "$BENCH" relay

echo "== kubectl-podlink"
common "$KUBECTL" kubectl-podlink
help_lists "$KUBECTL" --context --daemon-namespace --demo --for-pod --kubeconfig --namespace --node --output --pod-json \
  --size --socket
expect 0 out "doctor POD" "$KUBECTL" --help
# doctor reads the pod from a file and needs no daemon: short, long, = and space forms.
expect 0 out '"pod": "ml/decode-0"' "$KUBECTL" doctor decode-0 -n ml -o json --socket /nonexistent \
  --pod-json "$FIXTURES/pod-good.json"
expect 0 out '"pod": "ml/decode-0"' "$KUBECTL" doctor decode-0 --namespace=ml --output=json --socket=/nonexistent \
  --pod-json="$FIXTURES/pod-good.json"
expect 0 out '"pod": "ml/decode-0"' "$KUBECTL" doctor decode-0 -n=ml -o=json --pod-json="$FIXTURES/pod-good.json"
expect 0 out "nothing to fix" "$KUBECTL" doctor decode-0 --pod_json "$FIXTURES/pod-good.json"
expect 1 err "cannot read /nonexistent.json" "$KUBECTL" doctor x --pod-json /nonexistent.json
expect 1 err "kubectl-podlink: connect" "$KUBECTL" status --socket="$TMP/no-daemon"
expect 1 err "kubectl-podlink: connect" "$KUBECTL" status -o yaml --socket="$TMP/no-daemon"
expect 2 err "-o/--output must be json or yaml (got 'wide')" "$KUBECTL" status -o wide
expect 2 err "-o/--output must be json or yaml (got 'JSON')" "$KUBECTL" status --output=JSON
expect 2 err "--size must be a positive integer (got '0')" "$KUBECTL" bench a b --size 0
expect 2 err "bad value 'x' for --size" "$KUBECTL" bench a b --size=x
expect 2 err "--socket needs a value" "$KUBECTL" status --socket
expect 2 err "no command given" "$KUBECTL"
expect 2 err "unknown command 'frobnicate'" "$KUBECTL" frobnicate
expect 2 err "unexpected argument 'extra'" "$KUBECTL" version extra
expect 2 err "doctor needs a pod name" "$KUBECTL" doctor
expect 2 err "bench needs two pods" "$KUBECTL" bench only-one
expect 2 err "unexpected argument 'extra'" "$KUBECTL" status extra

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
