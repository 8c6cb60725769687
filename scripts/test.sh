#!/usr/bin/env bash
# Installs what the tests need (system packages, Redis), then runs every check: formatting,
# clippy, and the whole test suite (unit tests and end-to-end tests over real sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export TOOLRELAY_TEST_PYTHON=${TOOLRELAY_TEST_VENV:-$HOME/.cache/toolrelay/test-venv}/bin/python

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo build (the binaries the end-to-end tests start)"
cargo build --workspace --bins --locked
step "cargo test"
cargo test --workspace --locked
step "browser tests (the CODAP plugin in chromium)"
npm --prefix tests/browser test
