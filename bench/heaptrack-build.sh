# Sourced by bench/alloc-profile.sh and bench/heap-profile.sh (from the repository's root):
# checks for heaptrack, makes the work directory `$work` (gone at exit, with whatever ran
# from it), and puts there `toolrelay` built with glibc's malloc (feature `system-allocator`:
# heaptrack cannot see jemalloc's allocations) and `toolrelay-floor`; builds the bench, and
# leaves the ordinary (jemalloc) `toolrelay` in place for it. Sets `$target`.
target=${CARGO_TARGET_DIR:-target}
command -v heaptrack >/dev/null || { echo "heaptrack is missing: apt-get install heaptrack" >&2; exit 1; }

work=$(mktemp -d)
trap 'pkill -KILL -f "^$work/toolrelay" 2>/dev/null || true; kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release -p toolrelay-bench --bin toolrelay-bench --bin toolrelay-floor
cargo build --release -p toolrelay-server --bin toolrelay --features system-allocator
cp "$target/release/toolrelay" "$work/toolrelay"
cp "$target/release/toolrelay-floor" "$work/toolrelay-floor"
cargo build --release -p toolrelay-server --bin toolrelay
