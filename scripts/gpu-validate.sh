#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (written for an H200): configures
# and builds the CUDA targets into build/gpu, runs the tests labelled `gpu` (the CUDA engine
# against the CPU engine, the tiered cache's CUDA backend against its CPU backend), live runs of
# the tiered cache on a 7B-shaped model with random weights following a synthetic trace of its
# shape (full cache and tiered at several HBM shares, with each attention kernel, GEMM and way
# of copying) checked by `kvtier validate`, the CUDA GEMV, decode and host-link copy
# benchmarks and the host CPU's T2 recodes, each kernel's time in a short live run where Nsight Compute is installed, an
# Nsight Systems profile of one live run where nsys is installed, a `kvtier trace capture
# --device cuda` of stories260K next to a CPU capture, and scripts/capture_hf.py against
# kvtier's capture where PyTorch and transformers are installed. Everything lands in "$OUT" (default ./gpu-results):
#
#   results.jsonl    one JSON line per step: step, status (ok | failed | timeout | skipped |
#                    info), exit code, seconds, and the provenance (GPU name, driver, memory from
#                    nvidia-smi, UTC date, commit); the benchmark's line carries its figures
#   environment.txt  the machine: OS, glibc, tools found, where cuBLAS is, unresolved libraries
#   live-*.json      the live measurement files (docs/LIVE.md), and the trace they followed;
#                    validate-live-json.log and validate-live-json-all.log, the simulator's
#                    projections for the first of them and for all
#   profile-live_*.csv  the profile's totals per kernel, per copy kind and per CUDA call
#   kernel-times.csv the time of every kernel of a short full-cache live run (Nsight Compute)
#   *.log            each step's output; ctest-gpu.xml (JUnit); the captured traces
#
# Options:
#   --prebuilt DIR   use the programs of a bundle made by scripts/gpu-bundle.sh on another
#                    machine (for GPU machines without the build dependencies): no configure or
#                    build; each gpu test case runs in a process of its own, as ctest would
#   --archive FILE   also pack everything but the traces that can be made again into one
#                    .tar.gz (to carry the results off a remote machine)
#
# Every step has a time limit and a failed step does not stop the others that can still run;
# the whole script stays under about 9 minutes (KVTIER_GPU_DEADLINE_S, default 540, leaving time
# for the archive within a 10-minute limit). Steps run in the order of what is least known, as
# a late step gets only the time that is left: the host's recode benchmark and the gpu tests,
# the live runs whose projections are not yet within 10% (T2, the copy engines) with their
# full-cache twin and a first validate, the copy and decode benchmarks, the other live runs and
# a validate of all, the GEMV benchmark, then what earlier runs measured already (kernel times,
# the profile, the captures, the PyTorch comparison, the sanitizers). With --archive the archive
# is brought up to date after each of these phases, so a run cut off keeps what it finished.
# Exit status: 0 when every step passed, 1 otherwise. Environment: OUT, KVTIER_CUDA_ARCH
# (default native), KVTIER_BENCH_ARGS (default "512 256 3": prompt, steps, repeats),
# KVTIER_FIXTURES (the folder holding stories260K; default ../shared/fixtures, or the bundle's),
# KVTIER_GPU_MIRROR (a folder that gets a copy of results.jsonl after every step), KVTIER_COMMIT
# (the commit to record, over what git says: a copied tree may carry another's .git), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."

prebuilt=""
archive=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt="${2:?--prebuilt needs a folder}"; shift 2 ;;
    --archive) archive="${2:?--archive needs a file name}"; shift 2 ;;
    *) echo "usage: scripts/gpu-validate.sh [--prebuilt DIR] [--archive FILE]" >&2; exit 2 ;;
  esac
done
if [ -n "$prebuilt" ]; then
  prebuilt="$(cd "$prebuilt" && pwd)"
  if [ -z "${KVTIER_FIXTURES:-}" ] && [ -d "$prebuilt/fixtures" ]; then
    export KVTIER_FIXTURES="$prebuilt/fixtures"
  fi
fi
if [ -n "$archive" ]; then
  mkdir -p "$(dirname "$archive")"
  archive="$(cd "$(dirname "$archive")" && pwd)/$(basename "$archive")"
fi
fixtures="${KVTIER_FIXTURES:-../shared/fixtures}"
# Offline machines: transformers must not try the network.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

OUT="${OUT:-./gpu-results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
results="$OUT/results.jsonl"
: >"$results"
deadline=$((SECONDS + ${KVTIER_GPU_DEADLINE_S:-540}))
jobs="${JOBS:-$(nproc)}"
build=build/gpu
bin="$build/bin"
tests="$build/tests"
if [ -n "$prebuilt" ]; then
  bin="$prebuilt/bin"
  tests="$prebuilt/bin"
fi
failures=0

json_escape() {
  local text="$1"
  text="${text//\\/\\\\}"
  text="${text//\"/\\\"}"
  text="${text//$'\n'/ }"
  text="${text//$'\r'/}"
  text="${text//$'\t'/ }"
  # Any other control character would make the line invalid JSON.
  printf '%s' "$text" | tr -d '\000-\010\013\014\016-\037\177'
}

# Provenance, recorded with every line.
gpu_name="unknown"
gpu_driver="unknown"
gpu_memory="unknown"
if command -v nvidia-smi >/dev/null 2>&1; then
  if query="$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>/dev/null | head -n 1)" && [ -n "$query" ]; then
    IFS=',' read -r gpu_name gpu_driver gpu_memory <<<"$query"
    gpu_name="$(echo "$gpu_name" | sed 's/^ *//; s/ *$//')"
    gpu_driver="$(echo "$gpu_driver" | sed 's/^ *//; s/ *$//')"
    gpu_memory="$(echo "$gpu_memory" | sed 's/^ *//; s/ *$//')"
  fi
  timeout 30 nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
fi
date_utc="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
# KVTIER_COMMIT, when given, names the commit: a copy of the tree may carry a .git of another.
commit="unknown"
if [ -n "${KVTIER_COMMIT:-}" ]; then
  commit="$KVTIER_COMMIT"
elif command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
  commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  if [ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ]; then
    commit="$commit+uncommitted"
  fi
fi
provenance="\"gpu\":\"$(json_escape "$gpu_name")\",\"driver\":\"$(json_escape "$gpu_driver")\""
provenance+=",\"gpu_memory\":\"$(json_escape "$gpu_memory")\",\"date\":\"$date_utc\""
provenance+=",\"commit\":\"$(json_escape "$commit")\",\"host\":\"$(json_escape "$(hostname)")\""

record() {  # step status exit_code seconds [extra JSON fields]
  local extra="${5:-}"
  printf '{"step":"%s","status":"%s","exit_code":%s,"seconds":%s,%s%s}\n' "$1" "$2" "$3" "$4" \
    "$provenance" "${extra:+,$extra}" >>"$results"
  echo "gpu-validate: $1: $2 ($4 s)"
  # A copy after every step, for a caller whose run may be cut off before the archive is made.
  if [ -n "${KVTIER_GPU_MIRROR:-}" ]; then
    cp "$results" "$KVTIER_GPU_MIRROR/results.jsonl" 2>/dev/null || true
  fi
  if [ "$2" != "ok" ] && [ "$2" != "info" ]; then
    failures=$((failures + 1))
  fi
}

# run STEP LIMIT_SECONDS COMMAND...: runs with a time limit (capped by the deadline), output to
# $OUT/STEP.log; records the result; returns the command's status (124 when out of time).
run() {
  local step="$1" limit="$2"
  shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 15 ]; then
    record "$step" skipped null 0 '"reason":"out of time"'
    return 124  # as a step that ran out of time: nothing to run again
  fi
  if [ "$limit" -gt "$left" ]; then
    limit="$left"
  fi
  local start=$SECONDS status=0
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$step.log" 2>&1 || status=$?
  local took=$((SECONDS - start))
  if [ "$status" -eq 0 ]; then
    record "$step" ok 0 "$took"
  elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    record "$step" timeout "$status" "$took" "\"limit_s\":$limit"
  else
    record "$step" failed "$status" "$took" "\"log_tail\":\"$(json_escape "$(tail -n 5 "$OUT/$step.log")")\""
  fi
  return "$status"
}

skip() {  # step reason
  record "$1" skipped null 0 "\"reason\":\"$(json_escape "$2")\""
}

# The machine, for reading the results elsewhere.
{
  uname -a
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null || true
  ldd --version 2>&1 | head -n 1 || true
  for tool in cmake ninja nvcc python3 compute-sanitizer nsys nvidia-smi; do
    echo "$tool: $(command -v "$tool" || echo missing)"
  done
  # grep reads all of ldconfig's output (no early exit, so no SIGPIPE under pipefail).
  cached="$(ldconfig -p 2>/dev/null | grep -o '/.*libcublas\.so\.[0-9]*' || true)"
  echo "cuBLAS: ${cached:-not in the linker cache}"
  echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
} >"$OUT/environment.txt" 2>&1

# A prebuilt bundle leaves cuBLAS to this machine's CUDA toolkit: when the loader cannot find
# it, look where toolkits and Python wheels put it.
unresolved() {
  ldd "$bin/kvtier" 2>&1 | grep 'not found' || true
}
if [ -n "$prebuilt" ] && [ -n "$(unresolved)" ]; then
  for found in $(find /usr/local /opt /usr/lib -name 'libcublas.so.[0-9]*' 2>/dev/null | head -n 20); do
    folder="$(dirname "$found")"
    loads="$(LD_LIBRARY_PATH="$folder${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bin/kvtier" 2>&1 || true)"
    if [[ "$loads" == *"not found"* ]]; then
      continue
    fi
    export LD_LIBRARY_PATH="$folder${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS for the bundle: $folder" >>"$OUT/environment.txt"
    break
  done
fi

missing=""
if [ -z "$prebuilt" ]; then
  for tool in cmake ninja; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
  done
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || missing="$missing nvcc"
else
  missing="$(unresolved | awk '{ print $1 }' | tr '\n' ' ')"
  { echo "bundle:"; cat "$prebuilt/BUNDLE.txt"; ldd "$bin/kvtier"; } >>"$OUT/environment.txt" 2>&1 || true
fi
if [ -n "$missing" ]; then
  record tools failed 1 0 "\"missing\":\"$(json_escape "$missing")\""
fi
# The gpu tests fail, rather than skip, when they find no CUDA device.
export KVTIER_REQUIRE_GPU=1

built=0
if [ -n "$prebuilt" ]; then
  # A bundle of another commit would measure other code under this commit's name.
  bundled="$(sed -n 's/^commit: //p' "$prebuilt/BUNDLE.txt" 2>/dev/null || true)"
  # A tree changed since its commit may still hold a bundle of that commit (results written
  # into it); a bundle of uncommitted changes cannot be told apart from others, so none is run.
  if [ "$commit" != "unknown" ] && [ "${commit%+uncommitted}" != "$bundled" ]; then
    record build failed 1 0 "\"reason\":\"the bundle is of commit $(json_escape "$bundled"), this tree of $(json_escape "$commit"): commit, then run scripts/gpu-bundle.sh again\""
  elif [ -x "$bin/kvtier" ] && [ -x "$tests/kvtier_cuda_engine_tests" ] &&
    [ -x "$tests/kvtier_cuda_live_tests" ] && [ -x "$bin/kvtier_bench_cuda_decode" ] &&
    [ -x "$bin/kvtier_bench_cuda_gemv" ] && [ -x "$bin/kvtier_bench_cuda_copy" ] &&
    [ -z "$missing" ]; then
    record build info null 0 "\"prebuilt\":\"$(json_escape "$bundled")\""
    built=1
  else
    record build failed 1 0 "\"reason\":\"the bundle's programs are missing or cannot load\""
  fi
elif run configure 150 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVTIER_CUDA=ON -DKVTIER_WERROR=OFF -DKVTIER_MPI=OFF \
  "-DCMAKE_CUDA_ARCHITECTURES=${KVTIER_CUDA_ARCH:-native}"; then
  if run build 330 cmake --build "$build" -j "$jobs" --target kvtier_cuda_engine_tests \
    kvtier_cuda_live_tests kvtier_bench_cuda_decode kvtier_bench_cuda_gemv \
    kvtier_bench_cuda_copy kvtier_bench_kv_quantise kvtier; then
    built=1
  fi
else
  skip build "configure failed"
fi

# bench STEP LIMIT PATTERN PROGRAM ARGS...: runs a benchmark and copies its result line (the last
# line matching PATTERN) into results.jsonl as STEP-result.
bench() {
  local step="$1" limit="$2" pattern="$3"
  shift 3
  if run "$step" "$limit" "$@"; then
    local line
    line="$(grep -E "$pattern" "$OUT/$step.log" | tail -n 1 || true)"
    if [ -n "$line" ]; then
      printf '{"step":"%s-result",%s,"result":%s}\n' "$step" "$provenance" "$line" >>"$results"
    fi
  fi
}

# Brings the archive up to date (written beside it, then renamed): the traces made from a seed
# (trace synth) or by the captures are left out; the CUDA capture is kept for comparison with a
# CPU capture elsewhere.
checkpoint() {
  [ -n "$archive" ] || return 0
  local partial="$archive.partial"
  local made=0
  tar -czf "$partial" -C "$OUT" --exclude="$(basename "$archive")" \
    --exclude="$(basename "$partial")" --exclude='live-*.h5' --exclude='stories260K-cpu.h5' \
    --exclude='*.nsys-rep' --exclude='*.sqlite' --warning=no-file-changed . || made=$?
  # tar's 1: a file changed as it was read (a log still written); the archive is whole.
  if [ "$made" -le 1 ] && mv -f "$partial" "$archive"; then
    return 0
  fi
  rm -f "$partial"
  echo "gpu-validate: could not write $archive" >&2
}

# The live tiered cache on a 7B shape (docs/LIVE.md, trace-driven mode): timing does not depend
# on weight values, so random weights in Llama-2-7B's shapes follow a synthetic reasoning trace
# of that shape; each run's measurement file is then checked against the simulator (kvtier
# validate: equal PCIe volumes; time per token and copy time). The tiered policy re-tiers only
# generated tokens outside its sinks and recent window (the prompt stays in HBM): 512 decode
# steps re-tiered every 8 with a 32-token window move hundreds of tokens per layer.
live_trace="$OUT/live-llama2-7b-reasoning.h5"
retier="delta=8,recent=32"
live_files=()
# live_runs RUN...: each RUN is name|policy|attention kernel|GEMM|copies|recode threads|lookahead.
live_runs() {
  local live name policy attention gemm copies recode_threads lookahead file
  for live in "$@"; do
    IFS='|' read -r name policy attention gemm copies recode_threads lookahead <<<"$live"
    file="$OUT/live-llama2-7b-$name.json"
    if run "live-$name" 75 "$bin/kvtier" live --model random:Llama-2-7B --device cuda \
      --cuda-attention "$attention" --cuda-gemm "$gemm" --cuda-copies "$copies" \
      --recode-threads "$recode_threads" --cuda-lookahead "$lookahead" \
      --follow-trace "$live_trace" \
      --policy "$policy" --no-reference --measure "$file"; then
      live_files+=("$file")
    fi
  done
}
# validate_live SUFFIX: the simulator's projections for the live files so far, as a table and
# as JSON (validate-live-json*.log, for reading elsewhere).
validate_live() {
  if [ "${#live_files[@]}" -gt 0 ]; then
    run "validate-live$1" 60 "$bin/kvtier" validate "${live_files[@]}" || true
    run "validate-live-json$1" 60 "$bin/kvtier" validate --format json "${live_files[@]}" || true
  fi
}

if [ "$built" -eq 1 ]; then
  # 1. The live cache's T1 <-> T2 recodes on this machine's host CPU (bench/kv_quantise.cpp):
  # they run between decode steps, on the step's path, and their rates (kv_recode_*) are what
  # the simulator needs of this host. (A bundle made before the benchmark lacks it.)
  if [ -x "$bin/kvtier_bench_kv_quantise" ]; then
    bench bench-kv-quantise 30 '^\{"kv_heads"' "$bin/kvtier_bench_kv_quantise"
  else
    skip bench-kv-quantise "the bundle has no kvtier_bench_kv_quantise"
  fi

  # 2. The gpu tests: the CUDA engine against the CPU engine, the tiered cache's CUDA backend
  # against its CPU backend.
  if [ -z "$prebuilt" ]; then
    ctest_ok=1
    run ctest-gpu 180 ctest --test-dir "$build" -L gpu --output-on-failure \
      --output-junit "$OUT/ctest-gpu.xml" || ctest_ok=0
    if [ "$ctest_ok" -eq 0 ]; then
      # Again, each kernel synchronised, so that a device fault names the kernel that caused it.
      KVTIER_CUDA_CHECK_KERNELS=1 run ctest-gpu-rerun-checked 90 ctest --test-dir "$build" \
        --rerun-failed --output-on-failure || true
    fi
    # Counts from ctest's summary line, e.g. "100% tests passed, 0 tests failed out of 6".
    summary="$(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log" | tail -n 1 || true)"
    if [ -n "$summary" ]; then
      record ctest-gpu-summary info null 0 "\"summary\":\"$(json_escape "$summary")\""
    fi
  else
    # ctest's files name the build machine's paths: each test case runs in a process of its own
    # here, as ctest runs them (a device fault cannot poison the cases after it), and a failed
    # one again with every kernel synchronised, so that a fault names the kernel that caused it
    # (not one that ran out of time: it would again).
    passed=0
    failed=0
    for program in kvtier_cuda_engine_tests kvtier_cuda_live_tests; do
      index=0
      while IFS= read -r name; do
        [ -n "$name" ] || continue
        index=$((index + 1))
        step="gpu-${program#kvtier_cuda_}-$index"
        status=0
        # Catch's test specs separate names with commas.
        run "$step" 120 "$tests/$program" "${name//,/\\,}" --durations yes || status=$?
        if [ "$status" -eq 0 ]; then
          passed=$((passed + 1))
        else
          failed=$((failed + 1))
          if [ "$status" -ne 124 ] && [ "$status" -ne 137 ]; then
            KVTIER_CUDA_CHECK_KERNELS=1 run "$step-checked" 60 "$tests/$program" \
              "${name//,/\\,}" || true
          fi
        fi
      done < <("$tests/$program" --list-test-names-only 2>/dev/null || true)
      # A program that lists no test did not load: that is a failure, not nothing to run.
      if [ "$index" -eq 0 ]; then
        record "gpu-${program#kvtier_cuda_}" failed 1 0 '"reason":"lists no test case"'
        failed=$((failed + 1))
      fi
    done
    record gpu-tests-summary info null 0 "\"passed\":$passed,\"failed\":$failed"
  fi
  checkpoint

  # 3. The live runs whose projections are not yet within 10% (docs/VALIDATION.md), with the
  # full-cache twin that calibrates the engine: the T2 run on one recode thread and on eight,
  # and the copy engines (staging 1, 0 and 4 layers ahead). The default kernels: split-key
  # attention, the warp-per-row GEMM, copies by kernels, one recode thread, one layer ahead.
  # Only this run's trace: OUT may hold an earlier run's.
  traced=0
  if run live-trace 90 "$bin/kvtier" trace synth --model Llama-2-7B --prompt-tokens 1024 \
    --steps 512 --pattern reasoning --seed 1 --out "$live_trace"; then
    traced=1
    live_runs "full|full|split-keys|warp-rows|kernels|1|1" \
      "tiered-hbm50-t2|tiered:hbm=0.5,evict=0.1,compress=0.3,$retier|split-keys|warp-rows|kernels|1|1" \
      "tiered-hbm50-t2-recode8|tiered:hbm=0.5,evict=0.1,compress=0.3,$retier|split-keys|warp-rows|kernels|8|1" \
      "tiered-hbm50-copy-engines|tiered:hbm=0.5,evict=0,compress=0,$retier|split-keys|warp-rows|copy-engines|1|1" \
      "tiered-hbm25-copy-engines|tiered:hbm=0.25,evict=0,compress=0,$retier|split-keys|warp-rows|copy-engines|1|1" \
      "tiered-hbm25-copy-engines-lookahead0|tiered:hbm=0.25,evict=0,compress=0,$retier|split-keys|warp-rows|copy-engines|1|0" \
      "tiered-hbm25-copy-engines-lookahead4|tiered:hbm=0.25,evict=0,compress=0,$retier|split-keys|warp-rows|copy-engines|1|4"
    validate_live ""
  fi
  checkpoint

  # 4. The host link on its own: cudaMemcpyAsync, the live cache's slot kernels (T2's too),
  # batched and per-slot copies, 16 KiB to 64 MiB each way, idle, queued and beside a kernel
  # holding every SM (bench/cuda_copy.cpp): the link model's t0 and bandwidth, measured apart
  # from the live runs. Then decode against the HBM roofline and the tracing overhead, with
  # each of the engine's alternatives (bench/cuda_decode.cpp).
  bench bench-cuda-copy 75 '^\{"bench"' "$bin/kvtier_bench_cuda_copy"
  bench_args="${KVTIER_BENCH_ARGS:-512 256 3}"
  # shellcheck disable=SC2086  # the arguments are words
  bench bench-cuda-decode 200 '^\{"bench"' "$bin/kvtier_bench_cuda_decode" $bench_args "$OUT"
  checkpoint

  # 5. The live runs that staged by kernels within 10% last time, again on this commit, and
  # cuBLAS against the warp-per-row GEMM (the per-head attention kernel was the default of the
  # first H200 runs, committed with them); then a validate of every live file.
  if [ "$traced" -eq 1 ]; then
    live_runs "tiered-hbm75|tiered:hbm=0.75,evict=0,compress=0,$retier|split-keys|warp-rows|kernels|1|1" \
      "tiered-hbm50|tiered:hbm=0.5,evict=0,compress=0,$retier|split-keys|warp-rows|kernels|1|1" \
      "tiered-hbm25|tiered:hbm=0.25,evict=0,compress=0,$retier|split-keys|warp-rows|kernels|1|1" \
      "tiered-hbm50-differential|tiered:hbm=0.5,evict=0,compress=0,$retier,prefetch=differential|split-keys|warp-rows|kernels|1|1" \
      "full-cublas|full|split-keys|cublas|kernels|1|1" \
      "tiered-hbm50-cublas|tiered:hbm=0.5,evict=0,compress=0,$retier|split-keys|cublas|kernels|1|1"
    validate_live "-all"
  fi
  # The decode step's GEMMs alone (bench/cuda_gemv.cpp): how much of a step they take, launched
  # and from graphs, and the warp-per-row kernel's variants.
  bench bench-cuda-gemv 60 '^\{"bench"' "$bin/kvtier_bench_cuda_gemv"
  checkpoint

  # 6. What earlier runs measured already, with the time left; first the fused gate/up and
  # SwiGLU kernel (never yet run on a GPU before this run's tests), launched plainly and early,
  # over every shape it takes, under memcheck.
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [ -x "$sanitizer" ]; then
    run memcheck-fused 60 "$sanitizer" --tool memcheck --error-exitcode 9 \
      "$tests/kvtier_cuda_engine_tests" "the fused gate/up and SwiGLU kernel*" || true
  fi
  # Where a decode step's time goes, kernel by kernel: Nsight Compute, where installed, timing
  # every kernel of a short live run on the full cache (a 64-token prompt, 8 steps; the weights'
  # upload kernels come first) at the clocks and caches the run would have (no clock locking,
  # no cache flushing), one CSV row per kernel launch.
  ncu="$(command -v ncu || true)"
  if [ -z "$ncu" ] && [ -x /usr/local/cuda/bin/ncu ]; then
    ncu=/usr/local/cuda/bin/ncu
  fi
  if [ -z "$ncu" ]; then
    record kernel-times info null 0 '"reason":"ncu not found"'
  elif run kernel-times-trace 30 "$bin/kvtier" trace synth --model Llama-2-7B \
    --prompt-tokens 64 --steps 8 --pattern reasoning --seed 1 --out "$OUT/live-short.h5"; then
    run kernel-times 90 "$ncu" --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/kernel-times.csv" \
      "$bin/kvtier" live --model random:Llama-2-7B --device cuda --policy full \
      --follow-trace "$OUT/live-short.h5" --no-reference --measure "$OUT/kernel-times-live.json" ||
      true
  fi

  # Where a step's time goes: an Nsight Systems trace of one tiered run (the engine's kernels
  # and the cache's copies on their streams), reduced to totals per kernel, per copy kind and
  # per CUDA call.
  nsys="$(command -v nsys || true)"
  if [ -z "$nsys" ] && [ -x /usr/local/cuda/bin/nsys ]; then
    nsys=/usr/local/cuda/bin/nsys
  fi
  if [ -z "$nsys" ]; then
    record profile-live info null 0 '"reason":"nsys not found"'
  elif [ "$traced" -eq 1 ]; then
    if run profile-live 120 "$nsys" profile --trace=cuda --sample=none --cpuctxsw=none \
      --force-overwrite=true --output "$OUT/profile-live" "$bin/kvtier" live \
      --model random:Llama-2-7B --device cuda --follow-trace "$live_trace" \
      --policy "tiered:hbm=0.5,evict=0,compress=0,$retier" --no-reference \
      --measure "$OUT/profile-live.json"; then
      # One export to SQLite for the three reports.
      run profile-live-stats 90 "$nsys" stats --force-export=true --report cuda_gpu_kern_sum \
        --report cuda_gpu_mem_time_sum --report cuda_api_sum --format csv \
        --output "$OUT/profile-live" "$OUT/profile-live.nsys-rep" || true
    fi
  fi

  stories="$fixtures/stories260K/stories260K.bin"
  if [ -f "$stories" ]; then
    run capture-cpu 60 "$bin/kvtier" trace capture --model "$stories" \
      --prompt "Once upon a time" --max-new-tokens 200 --no-stop --dtype fp32 \
      --granularity mean,heads --key-norms --device cpu --out "$OUT/stories260K-cpu.h5" || true
    run capture-cuda 60 "$bin/kvtier" trace capture --model "$stories" \
      --prompt "Once upon a time" --max-new-tokens 200 --no-stop --dtype fp32 \
      --granularity mean,heads --key-norms --device cuda --out "$OUT/stories260K-cuda.h5" || true
    if [ -f "$OUT/stories260K-cuda.h5" ]; then
      run validate-cuda-trace 30 "$bin/kvtier" trace validate "$OUT/stories260K-cuda.h5" || true
      run info-cuda-trace 30 "$bin/kvtier" trace info "$OUT/stories260K-cuda.h5" || true
    fi
  else
    skip capture-cuda "stories260K fixture not found at $stories"
  fi
  # scripts/capture_hf.py (PyTorch + transformers) against kvtier's own capture of the same
  # small random Llama and Qwen2 models, where that Python stack is installed.
  if python3 -c "import torch, transformers, numpy, h5py" >/dev/null 2>&1; then
    run capture-hf-torch 150 env KVTIER_TORCH_DEVICE=cuda python3 \
      tests/python/test_capture_hf_torch.py --kvtier "$bin/kvtier" \
      --script scripts/capture_hf.py --fixture "$fixtures/stories260K" || true
  else
    skip capture-hf-torch "python3 lacks torch, transformers, numpy or h5py"
  fi
  # Out-of-bounds and race checks of the kernels on the small random models, if time is left.
  if [ -x "$sanitizer" ]; then
    run memcheck 120 "$sanitizer" --tool memcheck --error-exitcode 9 \
      "$tests/kvtier_cuda_engine_tests" "random Qwen2*,the warp-rows GEMM computes*" || true
    # Decode graphs apart: KVTIER_CUDA_CHECK_KERNELS (the checked reruns) launches without them.
    run memcheck-graphs 90 "$sanitizer" --tool memcheck --error-exitcode 9 \
      "$tests/kvtier_cuda_engine_tests" "decode graphs*" || true
    # The split-key kernels share memory between warps: the path racecheck has most to find in.
    # The random models' case: stories260K's (200 steps and observed runs) outlasted 90 s.
    run racecheck 120 "$sanitizer" --tool racecheck --error-exitcode 9 \
      "$tests/kvtier_cuda_engine_tests" "the split-key attention path on random models*" || true
  else
    record memcheck info null 0 '"reason":"compute-sanitizer not found"'
  fi
else
  skip ctest-gpu "build failed"
  skip bench-cuda-decode "build failed"
  skip bench-cuda-copy "build failed"
  skip bench-kv-quantise "build failed"
  skip capture-cuda "build failed"
fi

echo "gpu-validate: $failures step(s) not ok; results in $results"
checkpoint
[ "$failures" -eq 0 ]
