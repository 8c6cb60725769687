#!/usr/bin/env bash
# Where an idle tab's memory goes: runs `toolrelay` (one process, memory store) under
# heaptrack, attaches idle tabs with `toolrelay-bench tabs`, and prints the allocation sites
# that hold the heap while the tabs are idle, with their bytes per tab.
#
#   bench/heap-profile.sh [ws|sse|grpc] [TABS]      (default: ws 2000)
#
# Needs heaptrack (Debian: apt-get install heaptrack). toolrelay is built with glibc's malloc
# for the run (feature `system-allocator`: heaptrack cannot see jemalloc's allocations), so
# the bytes are glibc's requests, not jemalloc's size classes: they say where memory goes, the
# bench's `idle` scenario says how much. By hand only, like the rest of the bench.
set -euo pipefail
transport=${1:-ws}
tabs=${2:-2000}
cd "$(dirname "$0")/.."
# shellcheck source=bench/heaptrack-build.sh
. bench/heaptrack-build.sh

# The bench's own limits (bench/src/system.rs): no rate limit gets in the way.
RATE_LIMIT_REQUEST_PER_CODE=100000000 RATE_LIMIT_SESSION_PER_IP=100000000 \
  MAX_CONNECTIONS_PER_IP=1000000 LISTEN_ADDR=127.0.0.1:0 GRPC_LISTEN_ADDR=127.0.0.1:0 LOG_FORMAT=json \
  RUST_LOG=warn,toolrelay=info heaptrack -o "$work/heap" "$work/toolrelay" >"$work/log" 2>&1 &
relay=$!
for _ in $(seq 200); do grep -q '"toolrelay listening"' "$work/log" 2>/dev/null && break; sleep 0.1; done
line=$(grep '"toolrelay listening"' "$work/log") || { cat "$work/log" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$line" "$1"; }
base="http://$(field listen)"
grpc="http://$(field grpc)"

# The tabs stay attached until their stdin closes.
mkfifo "$work/hold"
"$target/release/toolrelay-bench" tabs --base "$base" --grpc "$grpc" --transport "$transport" \
  --sessions "$tabs" <"$work/hold" >"$work/tabs" &
exec 3>"$work/hold"
for _ in $(seq 1200); do grep -q '"ready"' "$work/tabs" 2>/dev/null && break; sleep 0.1; done
grep -q '"ready"' "$work/tabs" || { echo "the tabs did not attach" >&2; exit 1; }
echo "$tabs idle $transport tabs attached" >&2
sleep 2
# Killed while the tabs are idle: what is still allocated then ("leaked", to heaptrack) is the
# idle tabs' memory and the process's own.
pkill -KILL -f "^$work/toolrelay" || true
wait "$relay" || true
exec 3>&-
wait 2>/dev/null || true

data=$(ls "$work"/heap.*)
heaptrack_print --file "$data" --print-peaks 0 --print-allocators 0 --print-temporary 0 \
  --print-leaks 1 --peak-limit 30 --sub-peak-limit 3 --disable-builtin-suppressions \
  | python3 -c '
import re, sys
tabs = int(sys.argv[1])
units = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}
for line in sys.stdin:
    line = line.rstrip("\n")
    # Each allocation site starts with its size: add the bytes per tab.
    match = re.match(r"^(\d+(?:\.\d+)?)([KMG]?)B? leaked over (\d+) calls", line)
    if match:
        size = float(match.group(1)) * units[match.group(2)]
        line += f"   [{size / tabs:,.0f} B per tab]"
    print(line)
' "$tabs"
