#!/usr/bin/env bash
# Builds toolrelay's container image from the Dockerfile with podman, without any image
# registry: the release binaries (cargo, with the caller's CARGO_TARGET_DIR), the MIP
# sandbox's PuLP virtualenv (made with Debian's /usr/bin/python3), and the Dockerfile's base
# image made from Debian's packages with debootstrap and tagged under the FROM name. Slow steps
# are cached under ~/.cache/toolrelay/image (the base as a tarball, the virtualenv), and
# podman's layer cache keeps the rest, so a second run takes seconds.
#
#   scripts/image.sh                 builds localhost/toolrelay:latest (and :VERSION); prints it
#   scripts/image.sh --context-only  prepares the build context only and prints its path:
#                                    docker build -f Dockerfile -t toolrelay "$(scripts/image.sh --context-only)"
#   TOOLRELAY_IMAGE_BINARIES=DIR scripts/image.sh   takes the release binaries from DIR
#                                    instead of building them
#
# Needs podman, runc and debootstrap (scripts/setup.sh --test installs them) and root (or
# sudo) for debootstrap and rootful podman. IMAGE sets the name; CONTAINERS_CONF defaults to
# scripts/podman/containers.conf (the settings these VMs need, see there).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mode=${1:-build}

say() { printf '\033[1mimage:\033[0m %s\n' "$*" >&2; }

cache=${TOOLRELAY_CACHE:-$HOME/.cache/toolrelay}/image
context=$cache/context
image=${IMAGE:-localhost/toolrelay:latest}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$repo/scripts/podman/containers.conf}
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
# Rootful podman (debootstrap needs root anyway), with our settings through sudo too.
podman() { $sudo env CONTAINERS_CONF="$CONTAINERS_CONF" podman "$@"; }
mkdir -p "$cache" "$context/bin"

# --- the binaries ---------------------------------------------------------------------------
# The same command as a whole-workspace release build, so an existing release build is reused
# as it is (building fewer packages would unify features differently and rebuild).
if [[ -n ${TOOLRELAY_IMAGE_BINARIES:-} ]]; then
  # Release binaries built already (e.g. in another checkout of the same commit).
  release=$TOOLRELAY_IMAGE_BINARIES
else
  say "cargo build --release"
  cargo build --release --locked --workspace --bins
  release=$(cargo metadata --format-version 1 --no-deps --locked |
    /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release
fi
# Without their symbol tables (19 MB of 80): a panic's backtrace then names no functions;
# symbolicate it with the unstripped binary of the same build.
for binary in toolrelay toolrelay-relay toolrelay-gateway; do
  strip -o "$context/bin/$binary" "$release/$binary"
done

# --- the MIP sandbox's virtualenv -----------------------------------------------------------
# Made with Debian's Python, which the image has too, and trimmed to what the sandbox runs:
# no pip or setuptools (nothing is installed at run time), and of the CBC binaries PuLP
# bundles for every platform only this one's (the relay solves with HiGHS; a model's own
# prob.solve() finds CBC as it would on the host).
venv=$context/mip-venv
requirements=scripts/requirements-mip.txt
wanted=$({ cat "$requirements"; /usr/bin/python3 --version; uname -m; sed -n '/^# --- the MIP/,/^# ---.*base/p' "$0"; } |
  sha256sum | cut -d' ' -f1)
if [[ $(cat "$venv/.prepared" 2>/dev/null) != "$wanted" ]]; then
  say "preparing the MIP virtualenv in $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-compile -r "$requirements"
  "$venv/bin/python" -m pip uninstall --quiet --yes pip setuptools
  rm -f "$venv"/bin/activate* "$venv"/bin/pip* "$venv"/bin/Activate.ps1
  solverdir=$("$venv/bin/python" -I -c 'import os, pulp; print(os.path.join(os.path.dirname(pulp.__file__), "solverdir", "cbc"))')
  case $(uname -m) in
    x86_64) keep=linux/i64 ;;
    aarch64) keep=linux/arm64 ;;
    *) keep=none ;;
  esac
  find "$solverdir" -mindepth 2 -maxdepth 2 -type d | while read -r dir; do
    [[ ${dir#"$solverdir"/} == "$keep" ]] || rm -rf "$dir"
  done
  # Compiled once here: the sandbox mounts the virtualenv read-only, so Python could not
  # cache its bytecode there, and every run would compile PuLP again.
  "$venv/bin/python" -I -m compileall -q "$venv/lib" >/dev/null
  chmod -R a+rX,go-w "$venv"
  echo "$wanted" >"$venv/.prepared"
fi

if [[ $mode == --context-only ]]; then
  echo "$context"
  exit 0
fi

# --- the base image, from Debian's packages --------------------------------------------------
# No registry is reachable here: make the Dockerfile's FROM image with debootstrap (~1 min,
# once; the tarball is kept), trimmed the way Debian's official -slim images are (no
# documentation, manual pages or translations, now or in packages installed later).
from=$(awk '$1 == "FROM" { print $2; exit }' Dockerfile)
case $from in
  */*) base=$from ;;
  *) base=docker.io/library/$from ;;
esac
suite=${from#*:}
suite=${suite%-slim}
# The recipe below, hashed: when it changes, the base is made again.
recipe=$(sed -n '/^# --- the base image/,/^# --- the image/p' "$0" | sha256sum | cut -c1-12)
tarball=$cache/debian-$suite-slim-$recipe.tar
made_by=$(podman image inspect --format '{{index .Labels "dev.toolrelay.base-recipe"}}' "$base" 2>/dev/null || true)
if [[ -z $made_by ]] && podman image exists "$base"; then
  say "using $base as it is (not made here: pulled or loaded)"
elif [[ $made_by != "$recipe" ]]; then
  if [[ ! -s $tarball ]]; then
    # This machine's Debian mirror (deb822 .sources or a sources.list line), else Debian's own.
    mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
      sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/* *$/\1/p; s/^deb \(\[[^]]*\] *\)\{0,1\}\(http[^ ]*\/debian\)\/* .*/\2/p' |
      sed -n 1p) || true
    mirror=${mirror:-http://deb.debian.org/debian}
    say "making $from with debootstrap from $mirror (once; kept in $tarball)"
    root=$(mktemp -d "$cache/debootstrap.XXXXXX")
    trap '$sudo rm -rf "$root"' EXIT
    $sudo debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
      tail -n 20 "$cache/debootstrap.log" >&2
      exit 1
    }
    $sudo tee "$root/etc/dpkg/dpkg.cfg.d/docker-slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
    # apt as in Debian's official images: no package caches or downloaded packages kept,
    # no translations fetched.
    $sudo tee "$root/etc/apt/apt.conf.d/docker-clean" >/dev/null <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' | $sudo tee "$root/etc/apt/apt.conf.d/docker-no-languages" >/dev/null
    $sudo find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    $sudo rm -rf "$root"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/* \
      "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
      "$root"/var/log/*.log "$root/etc/apt/sources.list"
    $sudo tee "$root/etc/apt/sources.list.d/debian.sources" >/dev/null <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    $sudo tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    rm -f "$cache/debian-$suite-slim-"*.tar
    mv "$tarball.tmp" "$tarball"
    $sudo rm -rf "$root"
    trap - EXIT
  fi
  say "importing $tarball as $base"
  podman import --quiet \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "LABEL dev.toolrelay.base-recipe=$recipe" \
    --change 'CMD ["bash"]' "$tarball" "$base" >/dev/null
fi

# --- the image --------------------------------------------------------------------------------
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
say "podman build $image"
podman build --quiet --pull=never --runtime runc -f Dockerfile \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$(git describe --always --dirty 2>/dev/null || echo unknown)" \
  -t "$image" -t "${image%:*}:$version" "$context" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$image")
say "$image: $((size / 1000 / 1000)) MB"
echo "$image"
