#!/usr/bin/env bash
# Installs what the tests need (system packages, Redis), then runs every check: formatting,
# clippy, the whole test suite (unit tests and end-to-end tests over real sockets), and the
# container image and Kubernetes manifests built and run with podman.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export TOOLRELAY_TEST_PYTHON=${TOOLRELAY_TEST_VENV:-$HOME/.cache/toolrelay/test-venv}/bin/python

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

step "the browser SDK's pure functions under node (tests/node/sdk-unit.test.mjs: milliseconds, no browser)"
node --test tests/node/sdk-unit.test.mjs
step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo build (the binaries the end-to-end tests start)"
cargo build --workspace --bins --locked
step "cargo test (in-memory store; the store conformance suite runs on Redis as well)"
cargo test --workspace --locked
step "cargo test: the relay, gateway, cancellation, claim, operability, shared-address, ceiling and approval suites again, on Redis (TOOLRELAY_TEST_STORE=redis; calls routed, each handed to its tab in the process)"
TOOLRELAY_TEST_STORE=redis cargo test --locked -p toolrelay-tests --test relay --test relay_refusals --test relay_connections --test gateway --test gateway_limits --test gateway_web --test cancel --test claims --test operability --test shared_address --test ceilings --test approval --test own_calls
step "cargo test: the fleet suites again with calls by Redis pub/sub alone (TOOLRELAY_TEST_ROUTE=pubsub; above, relays route them: REPLICA_URL)"
TOOLRELAY_TEST_ROUTE=pubsub cargo test --locked -p toolrelay-tests --test replicas --test replicas_redis_outages --test replicas_mcp --test drain --test redis_operated --test idle
step "browser tests (the CODAP plugin in chromium)"
npm --prefix tests/browser test
step "container image (scripts/image.sh: release build, base and venv cached under ~/.cache/toolrelay/image)"
scripts/image.sh
step "the image and the Kubernetes manifests run in podman (container, kube_play)"
cargo test --locked -p toolrelay-tests --test container --test kube_play -- --ignored
step "floods against the release binaries scripts/image.sh built (10,000 MCP sessions; 2,000 slow and idle connections)"
release=${TOOLRELAY_IMAGE_BINARIES:-$(cargo metadata --format-version 1 --no-deps --locked |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release}
TOOLRELAY_BINARIES=$release cargo test --locked -p toolrelay-tests --test mcp_sessions --test connection_flood -- --ignored --nocapture
