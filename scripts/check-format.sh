#!/usr/bin/env bash
# Fails when a C++ source differs from what .clang-format asks for (clang-format 14).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  bash scripts/install-deps.sh
  if [ "$(id -u)" -eq 0 ]; then apt-get install -y -qq clang-format >/dev/null; else sudo apt-get install -y -qq clang-format >/dev/null; fi
fi
git ls-files -z '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run --Werror
