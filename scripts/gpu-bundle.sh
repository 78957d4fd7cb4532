#!/usr/bin/env bash
# Builds the GPU checks' programs on this machine into a self-contained folder, for a GPU machine
# that has an NVIDIA driver and the CUDA toolkit (cuBLAS) but not the project's build
# dependencies (Protobuf, HDF5, Boost, ...), as on many cloud GPU images:
#
#   scripts/gpu-bundle.sh [DIR]                  # here (default DIR: gpu-bundle)
#   scripts/gpu-validate.sh --prebuilt DIR       # there, from the repository root
#
# DIR gets bin/ (kvtier, the gpu-labelled test programs, the CUDA decode and copy benchmarks;
# stripped, with an RPATH of $ORIGIN/../lib), lib/ (every shared library they load except the C library's, the
# NVIDIA driver's and cuBLAS, which the GPU machine's CUDA toolkit provides), fixtures/ (the
# stories260K test model) and BUNDLE.txt (what was built, from which commit, for which GPUs).
# The GPU machine needs an x86-64 Linux with glibc at least as new as BUNDLE.txt says and a CUDA
# toolkit of the same major version as this machine's nvcc. Environment: KVTIER_CUDA_ARCH (the
# CUDA architectures, default 90: H100/H200; e.g. "80;90" for A100 as well), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."

bundle="${1:-gpu-bundle}"
build=build/gpu-bundle
arch="${KVTIER_CUDA_ARCH:-90}"
jobs="${JOBS:-$(nproc)}"
fixture="${KVTIER_FIXTURES:-../shared/fixtures}/stories260K"
targets=(kvtier kvtier_cuda_engine_tests kvtier_cuda_live_tests kvtier_bench_cuda_decode
  kvtier_bench_cuda_gemv kvtier_bench_cuda_copy kvtier_bench_kv_quantise)

die() {
  echo "gpu-bundle: $*" >&2
  exit 1
}

nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$nvcc" ] || die "nvcc not found"
[ -f "$fixture/stories260K.bin" ] || die "the stories260K fixture is not at $fixture"
# Only an earlier bundle is replaced, never another folder given by mistake.
if [ -e "$bundle" ] && [ ! -f "$bundle/BUNDLE.txt" ]; then
  die "$bundle exists and is not a bundle (no BUNDLE.txt): choose another folder"
fi

# The install RPATH in the build tree too, as DT_RPATH (not RUNPATH), so that it also serves the
# bundled libraries' own dependencies; then the usual homes of a CUDA toolkit's cuBLAS.
# shellcheck disable=SC2016  # $ORIGIN is for the loader, not the shell
rpath='$ORIGIN/../lib;/usr/local/cuda/lib64;/usr/local/cuda/targets/x86_64-linux/lib'
# Without MPI: a GPU machine need not have its libraries, and the GPU checks run no MPI sweeps.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=ON -DKVTIER_WERROR=OFF \
  -DKVTIER_MPI=OFF \
  "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=$rpath" \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/fixtures"
programs=()
for target in "${targets[@]}"; do
  found="$(find "$build/bin" "$build/tests" -maxdepth 1 -type f -name "$target" | head -n 1)"
  [ -n "$found" ] || die "built $target, but found no program of that name"
  cp "$found" "$bundle/bin/$target"
  strip --strip-unneeded "$bundle/bin/$target"
  programs+=("$bundle/bin/$target")
done

# Libraries every Linux has (the C library and its loader), and those of the GPU machine's
# driver and CUDA toolkit, stay behind; everything else travels.
stays='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libcuda|libcublas|libcublasLt)\.so'
missing=""
while read -r name path; do
  if [[ "$name" =~ $stays ]]; then
    continue
  fi
  if [ "$path" = "not" ] || [ ! -f "$path" ]; then
    missing="$missing $name"
    continue
  fi
  cp -L "$path" "$bundle/lib/$name"
done < <(for program in "${programs[@]}"; do ldd "$program"; done |
  awk '$2 == "=>" { print $1, $3 }' | sort -u)
[ -z "$missing" ] || die "libraries not found here:$missing"
chmod u+w "$bundle"/lib/*
strip --strip-unneeded "$bundle"/lib/* 2>/dev/null || true

cp -r "$fixture" "$bundle/fixtures/stories260K"

glibc="$(for program in "${programs[@]}"; do objdump -T "$program"; done |
  grep -o 'GLIBC_[0-9.]*' | sort -V | tail -n 1)"
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ]; then
  commit="$commit+uncommitted"
fi
{
  echo "kvtier GPU bundle"
  echo "commit: $commit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(grep -h '^PRETTY_NAME=' /etc/os-release | cut -d= -f2 | tr -d '"')"
  echo "nvcc: $("$nvcc" --version | tail -n 1)"
  echo "CUDA architectures: $arch"
  echo "needs: glibc ${glibc#GLIBC_} or newer; libcublas and libcublasLt of the same CUDA major version; an NVIDIA driver"
  echo "programs: ${targets[*]}"
} >"$bundle/BUNDLE.txt"
du -sh "$bundle"
echo "gpu-bundle: wrote $bundle (run there: scripts/gpu-validate.sh --prebuilt $bundle)"
