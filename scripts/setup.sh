#!/usr/bin/env bash
# Installs what toolrelay needs and is missing, then returns. Safe to run again: it only
# installs what is not there yet.
#
#   scripts/setup.sh          what the server needs
#   scripts/setup.sh --test   what the test suite needs as well
set -euo pipefail

mode=${1:-run}
cd "$(dirname "$0")/.."

say() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

# --- system packages (Debian/Ubuntu) -----------------------------------------------------
# bubblewrap, util-linux (prlimit): the MIP sandbox; cmake, g++, libclang-dev: the HiGHS solver
# (built by cargo); make: jemalloc and HiGHS are built with it (cmake only recommends it);
# python3-venv: the sandbox's PuLP virtualenv.
apt_packages=(ca-certificates gcc make pkg-config bubblewrap util-linux cmake g++ libclang-dev
  python3 python3-venv)
if [[ $mode == --test ]]; then
  # openssl: the test certificates of the Redis TLS tests.
  apt_packages+=(redis-server chromium openssl)
  # The container image and the Kubernetes manifests (scripts/image.sh; tests/tests/container.rs,
  # kube_play.rs, manifests.rs): podman builds and runs images with no daemon (runc: the
  # runtime that works in this kind of VM; catatonit: the init of the pause image `podman kube
  # play` builds), debootstrap makes the debian:bookworm-slim base without a registry, and
  # promtool (Debian's prometheus package) checks the alert rules.
  apt_packages+=(podman runc catatonit debootstrap prometheus)
  # Node.js for the browser tests, unless one is installed already (e.g. from nodesource).
  command -v node >/dev/null && command -v npm >/dev/null || apt_packages+=(nodejs npm)
fi

missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  say "installing ${missing[*]} with apt-get"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Rust ---------------------------------------------------------------------------------
if ! command -v cargo >/dev/null; then
  say "cargo is missing: install Rust 1.91 or newer (https://rustup.rs) and run this again"
  exit 1
fi

# --- the MIP sandbox's Python: a world-readable venv outside any home directory ----------
# (the sandbox runs as an unprivileged uid and mounts only /usr and this venv)
mip_venv=${MIP_VENV:-/opt/toolrelay/mip-venv}
mip_requirements=scripts/requirements-mip.txt
mip_stamp="$mip_venv/.requirements.sha256"
mip_wanted=$(sha256sum "$mip_requirements" | cut -d' ' -f1)
if [[ ! -x $mip_venv/bin/python || $(cat "$mip_stamp" 2>/dev/null) != "$mip_wanted" ]]; then
  say "creating the MIP sandbox's Python in $mip_venv"
  sudo=""
  [[ $(id -u) -eq 0 || -w $(dirname "$mip_venv") ]] || sudo="sudo"
  $sudo rm -rf "$mip_venv"
  $sudo mkdir -p "$mip_venv"
  $sudo /usr/bin/python3 -m venv "$mip_venv"
  $sudo "$mip_venv/bin/pip" install --quiet --disable-pip-version-check -r "$mip_requirements"
  echo "$mip_wanted" | $sudo tee "$mip_stamp" >/dev/null
  $sudo chmod -R a+rX "$mip_venv"
fi

# --- Python packages the tests use, in a venv of their own ---------------------------------
test_venv=${TOOLRELAY_TEST_VENV:-$HOME/.cache/toolrelay/test-venv}
if [[ $mode == --test ]]; then
  requirements=scripts/requirements-test.txt
  stamp="$test_venv/.requirements.sha256"
  wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [[ ! -x $test_venv/bin/python || $(cat "$stamp" 2>/dev/null) != "$wanted" ]]; then
    say "creating the test venv in $test_venv"
    rm -rf "$test_venv"
    /usr/bin/python3 -m venv "$test_venv"
    "$test_venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    echo "$wanted" >"$stamp"
  fi
fi

# --- npm packages of the browser tests (playwright-core drives Debian's chromium) -----------
if [[ $mode == --test ]]; then
  browser_tests=tests/browser
  lock_stamp="$browser_tests/node_modules/.package-lock.sha256"
  wanted=$(sha256sum "$browser_tests/package-lock.json" | cut -d' ' -f1)
  if [[ ! -d $browser_tests/node_modules || $(cat "$lock_stamp" 2>/dev/null) != "$wanted" ]]; then
    say "installing the browser tests' npm packages"
    (cd "$browser_tests" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$wanted" >"$lock_stamp"
  fi
fi

# --- the MCP conformance suite's CLI on Node 20 ----------------------------------------------
# @modelcontextprotocol/conformance 0.2.0-alpha.12 imports `globSync` from `fs`, which Node 22
# has and Node 20 lacks: that one import is taken from the `glob` package instead (tests/browser
# has it). The file is patched only if it is exactly the one of 0.2.0-alpha.12: another version
# fails here, to be looked at (and these hashes updated) rather than patched blindly.
if [[ $mode == --test ]]; then
  conformance=tests/browser/node_modules/@modelcontextprotocol/conformance/dist/index.js
  as_published=b56fb575e61edaac83c2008af40a6a78b47815c4038a02a9b04cd336d38832a0
  as_patched=cbe9ec2ba70f0d22adc5ca7fbf877129c10891c988390f86bfb2acb82d01f705
  fs_import='import{existsSync as i,globSync as a,mkdtempSync as o,promises as s,readFileSync as c,readdirSync as l,writeFileSync as u}from"fs";'
  glob_import='import{existsSync as i,mkdtempSync as o,promises as s,readFileSync as c,readdirSync as l,writeFileSync as u}from"fs";import{globSync as a}from"glob";'
  found=$(sha256sum "$conformance" | cut -d' ' -f1)
  if [[ $found == "$as_published" ]]; then
    say "patching the conformance suite's import of fs.globSync (Node 20 has none)"
    sed -i "s|$fs_import|$glob_import|" "$conformance"
    found=$(sha256sum "$conformance" | cut -d' ' -f1)
  fi
  if [[ $found != "$as_patched" ]]; then
    say "$conformance is not the file of @modelcontextprotocol/conformance 0.2.0-alpha.12 (sha256 $found):"
    say "check its fs.globSync import by hand, then update the hashes in scripts/setup.sh"
    exit 1
  fi
fi
