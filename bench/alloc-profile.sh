#!/usr/bin/env bash
# Allocations per call, and where they are made: runs `toolrelay` (one process, memory store)
# under heaptrack twice — WebSocket tabs, HTTP callers in a closed loop, SMALL calls and then
# SMALL + CALLS — and prints the difference over CALLS: heap allocations per call, in all and
# by layer (bench/layers.py). Start-up, the tabs attaching and the warm-up are in both runs and
# cancel out. Then the floor (bench/src/bin/toolrelay-floor.rs, glibc's malloc) the same way,
# for the figure beside it.
#
#   bench/alloc-profile.sh [CALLS] [CALLERS] [CALLER]   (default: 20000 50 http; CALLER: http, mcp, grpc)
#
# Needs heaptrack (Debian: apt-get install heaptrack). toolrelay is built with glibc's malloc
# for the run (feature `system-allocator`: heaptrack cannot see jemalloc's allocations); the
# count of allocations is the program's, whatever allocator serves them. By hand only, like
# the rest of the bench. FOLDED=DIR keeps each run's folded stacks (allocations per stack).
set -euo pipefail
calls=${1:-20000}
callers=${2:-50}
caller=${3:-http}
small=2000
cd "$(dirname "$0")/.."
# shellcheck source=bench/heaptrack-build.sh
. bench/heaptrack-build.sh

# One run: `$1` (toolrelay or toolrelay-floor) under heaptrack, the tabs, `$2` calls; leaves
# the folded stacks in $work/$3.folded and the count of allocations in $work/$3.count.
run() {
  local binary=$1 count=$2 name=$3
  rm -f "$work"/heap.* "$work/log" "$work/tabs" "$work/callers" "$work/hold"
  # The bench's own limits (bench/src/system.rs): no rate limit gets in the way.
  RATE_LIMIT_REQUEST_PER_CODE=100000000 RATE_LIMIT_SESSION_PER_IP=100000000 \
    MAX_CONNECTIONS_PER_IP=1000000 LISTEN_ADDR=127.0.0.1:0 GRPC_LISTEN_ADDR=127.0.0.1:0 LOG_FORMAT=json \
    RUST_LOG=warn,toolrelay=info heaptrack -o "$work/heap" "$work/$binary" >"$work/log" 2>&1 &
  local relay=$!
  for _ in $(seq 200); do grep -q "\"$binary listening\"" "$work/log" 2>/dev/null && break; sleep 0.1; done
  local line
  line=$(grep "\"$binary listening\"" "$work/log") || { cat "$work/log" >&2; exit 1; }
  field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], ""))' "$line" "$1"; }
  local base grpc=()
  base="http://$(field listen)"
  [ -n "$(field grpc)" ] && grpc=(--grpc "http://$(field grpc)")
  mkfifo "$work/hold"
  "$target/release/toolrelay-bench" tabs --base "$base" "${grpc[@]}" --transport ws \
    --sessions 50 <"$work/hold" >"$work/tabs" &
  exec 3>"$work/hold"
  for _ in $(seq 600); do grep -q '"ready"' "$work/tabs" 2>/dev/null && break; sleep 0.1; done
  grep -q '"ready"' "$work/tabs" || { echo "the tabs did not attach" >&2; exit 1; }
  local sessions
  sessions=$(python3 -c 'import json,sys; print(",".join(json.loads(open(sys.argv[1]).readline())["sessions"]))' "$work/tabs")
  echo "go $count" | "$target/release/toolrelay-bench" callers --base "$base" "${grpc[@]}" \
    --caller "$caller" --sessions "$sessions" --callers "$callers" --warmup 500 >"$work/callers"
  grep -q '"calls"' "$work/callers" || { cat "$work/callers" >&2; echo "the callers did not finish" >&2; exit 1; }
  exec 3>&-
  # A graceful stop: heaptrack writes its data as the process ends.
  pkill -TERM -f "^$work/$binary\$" || true
  wait "$relay" || true
  wait 2>/dev/null || true
  local data
  data=$(ls "$work"/heap.*)
  heaptrack_print --file "$data" --print-peaks 0 --print-allocators 0 --print-temporary 0 \
    --print-leaks 0 --flamegraph-cost-type allocations -F "$work/$name.folded" >"$work/$name.summary"
  sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p' "$work/$name.summary" >"$work/$name.count"
}

per_call() {
  python3 -c 'import sys; print(f"{(int(sys.argv[1]) - int(sys.argv[2])) / int(sys.argv[3]):.1f}")' \
    "$(cat "$work/$1-large.count")" "$(cat "$work/$1-small.count")" "$calls"
}

run toolrelay "$small" toolrelay-small
run toolrelay "$((small + calls))" toolrelay-large
if [ "$caller" = http ]; then
  run toolrelay-floor "$small" floor-small
  run toolrelay-floor "$((small + calls))" floor-large
fi
if [ -n "${FOLDED:-}" ]; then mkdir -p "$FOLDED" && cp "$work"/*.folded "$FOLDED"/; fi
echo "Heap allocations per call, $callers $caller callers on 50 WebSocket tabs ($calls calls):"
echo
python3 bench/layers.py --per "$calls" --minus "$work/toolrelay-small.folded" "$work/toolrelay-large.folded"
echo
if [ "$caller" = http ]; then
  echo "toolrelay: $(per_call toolrelay) allocations per call; the floor: $(per_call floor)"
else
  echo "toolrelay: $(per_call toolrelay) allocations per call (the floor has HTTP callers only)"
fi
