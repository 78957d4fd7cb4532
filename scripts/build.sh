#!/usr/bin/env bash
# Installs missing dependencies, then configures and builds one CMake preset
# (default | debug | asan). The build folder is build/<preset>.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
bash scripts/install-deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
