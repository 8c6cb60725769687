#!/bin/sh
# The Redis fleet's set (issue 25), for one build of the relay binaries, with the floor and the
# memory mode beside it in the same run: two one-process replicas on one Redis (AOF on,
# fsync every second), the tabs on the second and the callers on the first —
#   * sequential latency, one tab and one caller (p50 against the memory mode);
#   * calls/s at 50 and 200 callers (50 sessions with a tab each);
#   * on Redis, per call: commands Redis runs, round trips (the relays' store operations),
#     Redis CPU µs and Redis CPU as a share of a core, the top commands, Redis's errors;
#   * 3,000 idle WebSocket tabs registering the CODAP plugin's manifest: the relays' RSS per
#     tab, and on Redis its commands and CPU per second over a 65 s quiet window and
#     `used_memory` per session.
#
# Usage: bench/redis-fleet.sh [BIN_DIR] [more toolrelay-bench flags]
#   BIN_DIR: where `toolrelay` is (default: next to the bench). The bench itself is
#   $BENCH, else $CARGO_TARGET_DIR/release/toolrelay-bench, else target/release/toolrelay-bench.
# Build first: cargo build --release -p toolrelay-bench -p toolrelay-server --bins
# Before and after in one window: run it twice with the same bench, once per BIN_DIR.
set -eu
BENCH=${BENCH:-${CARGO_TARGET_DIR:-target}/release/toolrelay-bench}
if [ ! -x "$BENCH" ]; then
  echo "no bench at $BENCH: build it (cargo build --release -p toolrelay-bench --bins) or set BENCH" >&2
  exit 1
fi
BIN_DIR=${1:-$(dirname "$BENCH")}
if [ $# -gt 0 ]; then shift; fi
exec "$BENCH" --bin-dir "$BIN_DIR" \
  --scenario latency,throughput,idle --mode one --store both --replicas 2 \
  --transport ws --caller http --sessions 50 --callers 50,200 \
  --tabs 3000 --idle-window 65 --idle-manifest codap "$@"
