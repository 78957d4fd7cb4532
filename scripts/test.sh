#!/usr/bin/env bash
# Builds and runs the whole test suite (tests labelled `gpu` or `torch` excluded: they need a GPU
# or PyTorch; scripts/gpu-validate.sh runs them) for one CMake preset:
# default (Release), debug or asan (AddressSanitizer + UndefinedBehaviorSanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
bash scripts/build.sh "$preset"
# CUDA's runtime needs the low shadow gap when a GPU is present; harmless without one.
export ASAN_OPTIONS="${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --preset "$preset" --parallel "$(nproc)"
