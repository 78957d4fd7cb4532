#!/usr/bin/env bash
# Fails when a C++ source differs from what .clang-format asks for (clang-format 14).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
git ls-files -z --cached --others --exclude-standard '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run --Werror
