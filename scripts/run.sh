#!/usr/bin/env bash
# Installs what is missing, then starts toolrelay (relay and gateway in one process, in-memory
# store) on 127.0.0.1:8080, gRPC on 127.0.0.1:50051. Extra arguments go to the server, e.g.
#   scripts/run.sh --listen 0.0.0.0:8080
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run --release -- "$@"
