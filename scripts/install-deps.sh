#!/usr/bin/env bash
# Installs the Debian 12 packages kvtier builds and tests with. Idempotent: installs only what
# is missing, and touches nothing when everything is there. Uses sudo when not run as root.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config git ccache
  libboost-graph-dev libboost-program-options-dev
  libeigen3-dev
  libhdf5-dev hdf5-tools libxxhash-dev
  protobuf-compiler libprotobuf-dev
  catch2
  libopenmpi-dev openmpi-bin
  clang-format clang-tidy
  nlohmann-json3-dev libpcre2-dev libsentencepiece-dev
  python3-numpy python3-h5py
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
  as_root=(sudo)
fi

echo "install-deps: installing ${missing[*]}" >&2
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
