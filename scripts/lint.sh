#!/usr/bin/env bash
# clang-tidy over the project's own sources (not generated code, not tests), with .clang-tidy's
# checks; any finding fails. CI runs it without the Clang static analyzer, which costs most of
# the time; `scripts/lint.sh --deep` adds it. Needs a configured build/default (scripts/build.sh).
#
# Clean results are cached (scripts/lint.py): a file is linted again only when its preprocessed
# text (comments included, so every included header and NOLINT counts), its compile flags,
# .clang-tidy, the clang-tidy version or these arguments changed. The cache lives in
# $KVTIER_LINT_CACHE (default ~/.cache/kvtier-lint); KVTIER_LINT_CACHE=off lints every file.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/default/compile_commands.json ] || bash scripts/build.sh default
extra=(--checks=-clang-analyzer-*)
if [ "${1:-}" = "--deep" ]; then
  extra=()
fi
exec python3 scripts/lint.py --build build/default --jobs "$(nproc)" -- \
  --extra-arg=-Wno-unknown-warning-option "${extra[@]}"
