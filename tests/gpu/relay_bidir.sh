#!/usr/bin/env bash
# The relay in both directions at once, as a two-rank collective uses it:
# podlink-bench's baseline-bidir (one process, each GPU's copy engine writes
# into the other GPU) and relay-bidir (two sessions write into each other's
# GPU through podlinkd), for each podlinkd setting in RELAY_SETUPS.
# Run from the repository root on the device tool's nvidia-h200-x2 with the
# bundle from scripts/device-bundle.sh:
#
#   RELAY_SETUPS="--relay-workers=1 --relay-workers=2" bash tests/gpu/relay_bidir.sh [OUT_DIR]
#
# (each setup: podlinkd arguments with "=" for spaces and "+" between flags,
# e.g. --relay-workers=2+--relay-streams=8). Measures only.
set -uo pipefail
OUT=${1:-/tmp/podlink-relay-out}
mkdir -p "$OUT"
ROOT=$(pwd)
BIN=$ROOT/.devcarry/bin
export LD_LIBRARY_PATH=$ROOT/.devcarry/lib
SETUPS=${RELAY_SETUPS:-"--relay-workers=1 --relay-workers=2"}
SIZES=${RELAY_BIDIR_SIZES:-524288,1048576,2097152,4194304,8388608,16777216}
WINDOW=${RELAY_WINDOW:-16}
WORK=$(mktemp -d /tmp/podlink-relay.XXXXXX)
modes=baseline-bidir,relay-bidir
for setup in $SETUPS; do
  args=${setup//[=+]/ }
  label=$(echo "$setup" | tr -c 'a-zA-Z0-9\n' '_' | sed 's/^_*//')
  "$BIN/podlinkd" --socket-dir "$WORK/sock" --metrics-addr "" $args 2> "$OUT/podlinkd-$label.log" &
  dpid=$!
  for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd-$label.log" && break; sleep 0.1; done
  echo "== podlinkd $args: $(grep -o 'relay_workers=[0-9]*' "$OUT/podlinkd-$label.log")"
  PODLINK_SOCKET_DIR=$WORK/sock timeout 300 "$BIN/podlink-bench" --modes "$modes" --bidir-sizes "$SIZES" \
    --window "$WINDOW" --passes 3 --json "$OUT/bidir-$label.json" > "$OUT/bidir-$label.md" 2> "$OUT/bidir-$label.log"
  echo "exit $?"; cat "$OUT/bidir-$label.md"
  grep -h "relay_sync_fallback" "$OUT/podlinkd-$label.log"
  modes=relay-bidir  # the baseline does not depend on podlinkd's settings
  kill $dpid; wait $dpid 2>/dev/null
done
rm -rf "$WORK"
