#!/usr/bin/env bash
# Wall time of bench/sweep_scaling.cpp's 1,000-point sweep run by `kvtier sweep` in one process
# at --jobs 2, as an MPI job of 1 process at --jobs 2 (unbound: mpiexec would bind it to one
# core) and as an MPI job of 2 processes at --jobs 1 (`--mpi`), in turn, from empty folders;
# checks that all write the same results.csv and results.h5. Prints one JSON line: every run's
# wall time and the medians.
#
#   bench/sweep_mpi.sh [repeats] [build folder]      # default: 3, build/default
set -euo pipefail
cd "$(dirname "$0")/.."
repeats="${1:-3}"
build="${2:-build/default}"
kvtier="$build/bin/kvtier"
bench="$build/bin/kvtier_bench_sweep"
mpiexec="$(command -v mpiexec)" || { echo "sweep_mpi: no mpiexec" >&2; exit 1; }
if [ ! -x "$kvtier" ] || [ ! -x "$bench" ]; then
  echo "sweep_mpi: build $build first" >&2
  exit 1
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$bench" --spec >"$scratch/spec.textproto"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

seconds() { # command...: its wall time in seconds
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { m = int((NR + 1) / 2);
  print (NR % 2) ? v[m] : (v[m] + v[m + 1]) / 2 }'; }

one=()
mpi1=()
mpi=()
for r in $(seq 1 "$repeats"); do
  one+=("$(seconds "$kvtier" sweep "$scratch/spec.textproto" --jobs 2 --out "$scratch/one-$r")")
  mpi1+=("$(seconds "$mpiexec" -n 1 --bind-to none "$kvtier" sweep "$scratch/spec.textproto" \
    --mpi --jobs 2 --out "$scratch/mpi1-$r")")
  mpi+=("$(seconds "$mpiexec" -n 2 "$kvtier" sweep "$scratch/spec.textproto" --mpi --jobs 1 \
    --out "$scratch/mpi-$r")")
  for job in mpi1 mpi; do
    for file in results.csv results.h5; do
      cmp -s "$scratch/one-$r/$file" "$scratch/$job-$r/$file" ||
        { echo "sweep_mpi: run $r: $job's $file differs" >&2; exit 1; }
    done
  done
done
join() { local IFS=,; echo "$*"; }
printf '{"points": 1000, "repeats": %s, "median_wall_s_one_process_jobs2": %s, ' \
  "$repeats" "$(median "${one[@]}")"
printf '"median_wall_s_mpi1_jobs2": %s, "median_wall_s_mpi2_jobs1": %s, ' \
  "$(median "${mpi1[@]}")" "$(median "${mpi[@]}")"
printf '"wall_s_one_process_jobs2": [%s], "wall_s_mpi1_jobs2": [%s], "wall_s_mpi2_jobs1": [%s]}\n' \
  "$(join "${one[@]}")" "$(join "${mpi1[@]}")" "$(join "${mpi[@]}")"
