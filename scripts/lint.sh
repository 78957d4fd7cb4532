#!/usr/bin/env bash
# clang-tidy over the project's own sources (not generated code, not tests), with .clang-tidy's
# checks; any finding fails. CI runs it without the Clang static analyzer, which costs most of
# the time; `scripts/lint.sh --deep` adds it. Needs a configured build/default (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/default/compile_commands.json ] || bash scripts/build.sh default
extra=(--checks=-clang-analyzer-*)
if [ "${1:-}" = "--deep" ]; then
  extra=()
fi
git ls-files --cached --others --exclude-standard '*.cpp' | grep -v -e '^tests/' -e '^fuzz/' |
  xargs -P "$(nproc)" -n 4 clang-tidy -p build/default --quiet \
    --extra-arg=-Wno-unknown-warning-option "${extra[@]}"
