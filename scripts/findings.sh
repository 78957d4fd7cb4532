#!/usr/bin/env bash
# Reproduces every number in docs/FINDINGS.md: the findings of kvtier's policy library on
# attention traces captured from the real stories260K model and on synthetic reasoning traces
# of a Qwen2.5-7B shape, plus one serving simulation.
#
#   scripts/findings.sh [OUT]        # OUT defaults to ./findings-out
#
# Needs: the built binary (build/default/bin/kvtier, or $KVTIER), jq and h5dump (Debian:
# jq, hdf5-tools), the stories260K fixture (../shared/fixtures/stories260K, or $FIXTURE).
# Deterministic: greedy capture, seeded synthesis, SOURCE_DATE_EPOCH fixed, no cache reuse
# between runs (every replay is recomputed). A few minutes on 2 cores; about 0.5 GB of disk.
#
# Outputs (OUT/): traces/*.h5, demand/*.h5 (demand files of the replays that need per-step
# figures), f1_cliff.csv, f2_hbm_ratio.csv, f3_monarch.csv, f3_monarch_summary.csv,
# f4_mosaic_{syn,cap}.json + front CSVs, f5_dms.csv, f6_oracle.csv, f7_sim/ (report.json,
# metrics.csv), f7_sim.txt, f8_live_vs_replay.csv, f8_rank_correlation.csv,
# f9_preemption.csv (from f9_on_demand*/, f9_whole_request/ and f9_swap_*/), traces.csv (what each trace
# is), env.txt (machine, date, version).
set -euo pipefail

OUT=${1:-./findings-out}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KV=${KVTIER:-$ROOT/build/default/bin/kvtier}
FIX=${FIXTURE:-$ROOT/../shared/fixtures/stories260K}
export SOURCE_DATE_EPOCH=0
export LC_ALL=C

for tool in jq h5dump awk; do
  command -v "$tool" >/dev/null || { echo "findings.sh: needs $tool" >&2; exit 2; }
done
[[ -x $KV ]] || { echo "findings.sh: no kvtier binary at $KV (build it, or set KVTIER)" >&2; exit 2; }
[[ -f $FIX/stories260K.bin ]] || { echo "findings.sh: no fixture at $FIX (set FIXTURE)" >&2; exit 2; }

mkdir -p "$OUT/traces" "$OUT/demand"
T=$OUT/traces
# run a private copy of the binary, so a rebuild during the run cannot change or break it
cp "$KV" "$OUT/kvtier.bin"
KV=$OUT/kvtier.bin
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

{
  echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kvtier=$("$KV" --version)"
  echo "host=$(uname -srm)"
  echo "cpu=$(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
  echo "cores=$(nproc)"
  echo "mem_gib=$(awk '/MemTotal/{printf "%.1f", $2/1048576}' /proc/meminfo)"
} >"$OUT/env.txt"

# ---------------------------------------------------------------------------------------------
# Helpers

# replay TRACE POLICY [DEMAND_OUT] -> one compact JSON object (the policy's replay summary)
replay() {
  local trace=$1 policy=$2 demand=${3:-}
  if [[ -n $demand ]]; then
    "$KV" replay run --trace "$trace" --policy "$policy" --out "$demand" --format json
  else
    "$KV" replay run --trace "$trace" --policy "$policy" --format json
  fi | jq -c '.policies[0]'
}

# field JSON NAME -> value
field() { jq -r ".$2" <<<"$1"; }

# dump_numbers DEMAND DATASET -> every element of the dataset, one per line, in C order
dump_numbers() {
  h5dump -y -w 0 -d "$2" "$1" | awk '
    /DATA \{/ { on = 1; next }
    on && /^ *\}/ { on = 0 }
    on { gsub(/,/, " "); for (i = 1; i <= NF; i++) print $i }'
}

# demand_means DEMAND -> "mean_retained_fraction mean_hbm_fraction" over steps and layers
# (retained = T0+T1+T2 tokens / all visible tokens; HBM = T0 / all)
demand_means() {
  dump_numbers "$1" /tier_tokens | awk '
    { v[NR % 4] = $1 }
    NR % 4 == 0 { tot = v[1] + v[2] + v[3] + v[0]; r += (tot - v[0]) / tot; h += v[1] / tot; n++ }
    END { printf "%.6f %.6f\n", r / n, h / n }'
}

# demand_by_context DEMAND PROMPT LAYERS BIN_EDGES -> CSV rows
#   lo,hi,steps,mean_kept_mass,mean_hbm_fraction,mean_t2_fraction
# context of step t = PROMPT + t + 1; a step falls in the bin lo < context <= hi.
demand_by_context() {
  local demand=$1 prompt=$2 layers=$3 edges=$4
  paste -d' ' <(dump_numbers "$demand" /tier_tokens) <(dump_numbers "$demand" /tier_mass) |
    awk -v P="$prompt" -v L="$layers" -v edges="$edges" '
      BEGIN { nb = split(edges, e, " ") }
      {
        i = NR - 1; tier = i % 4; step = int(i / (4 * L))
        tok[tier] = $1; mass[tier] = $2
        if (tier == 3) {
          tot = tok[0] + tok[1] + tok[2] + tok[3]
          S[step] += 1; K[step] += 1 - mass[3]; H[step] += tok[0] / tot; C[step] += tok[2] / tot
        }
      }
      END {
        for (b = 1; b < nb; b++) {
          n = 0; k = 0; h = 0; c = 0
          for (s in S) {
            ctx = P + s + 1
            if (ctx > e[b] && ctx <= e[b + 1]) { n++; k += K[s] / S[s]; h += H[s] / S[s]; c += C[s] / S[s] }
          }
          if (n > 0) printf "%d,%d,%d,%.6f,%.6f,%.6f\n", e[b], e[b + 1], n, k / n, h / n, c / n
        }
      }'
}

# ---------------------------------------------------------------------------------------------
# Traces
#   cap       stories260K, greedy, story prompt A, 400 decode steps (real model, every dataset)
#   cap2      stories260K, greedy, story prompt B, 400 decode steps (held-out for MOSAIC)
#   syn       Qwen2.5-7B shape, reasoning, seed 1, prompt 512 + 1536 steps (mean, prefill 64, norms)
#   syn_ho    the same, seed 2 (held-out)
#   synh      Qwen2.5-7B shape, reasoning, seed 1, prompt 512 + 512 steps, with per-head rows
#   mon       Qwen2.5-7B shape, reasoning, seed 1, prompt 64 + 2496 steps (context 65..2560)

PROMPT_A="Once upon a time, there was a little girl named Lily. She loved to play in the park with her friends. One day, she saw a big red ball under a tree."
PROMPT_B="Tom had a small dog called Max. Every morning they walked to the river and looked at the fish. One day Max found a shiny box in the grass."

log "capturing stories260K traces"
"$KV" trace capture --model "$FIX/stories260K.bin" --prompt "$PROMPT_A" --max-new-tokens 400 \
  --no-stop --granularity mean,heads --window 32 --key-norms --out "$T/cap.h5" >&2
"$KV" trace capture --model "$FIX/stories260K.bin" --prompt "$PROMPT_B" --max-new-tokens 400 \
  --no-stop --granularity mean,heads --window 32 --key-norms --out "$T/cap2.h5" >&2

log "synthesising Qwen2.5-7B-shaped reasoning traces"
synth() { "$KV" trace synth --model Qwen2.5-7B --pattern reasoning "$@" >&2; }
synth --prompt-tokens 512 --steps 1536 --seed 1 --prefill-window 64 --key-norms --out "$T/syn.h5"
synth --prompt-tokens 512 --steps 1536 --seed 2 --prefill-window 64 --key-norms --out "$T/syn_ho.h5"
synth --prompt-tokens 512 --steps 512 --seed 1 --prefill-window 64 --key-norms --heads --out "$T/synh.h5"
synth --prompt-tokens 64 --steps 2496 --seed 1 --out "$T/mon.h5"

echo "trace,model,layers,prompt_tokens,steps,granularities,source" >"$OUT/traces.csv"
for name in cap cap2 syn syn_ho synh mon; do
  "$KV" trace info "$T/$name.h5" --sample-steps 256 --format json >"$T/$name.info.json"
  jq -r --arg n "$name" '[$n, .meta.model.name, .num_layers, .prompt_tokens, .steps,
      .granularities, .meta.source.kind] | @csv' "$T/$name.info.json" >>"$OUT/traces.csv"
done

# prompt and steps of each trace, for the per-step analysis
P_CAP=$(jq -r '.prompt_tokens' "$T/cap.info.json")

# ---------------------------------------------------------------------------------------------
# 1. The eviction cliff: h2o and snapkv budget sweeps vs tiered eviction-ratio sweep (hbm 0.5)
log "finding 1: eviction cliff"
F1=$OUT/f1_cliff.csv
echo "trace,family,knob,value,policy,mean_kept_mass,min_kept_mass,mean_retained_fraction,final_retained_fraction,mean_hbm_fraction" >"$F1"
f1_row() { # trace-name family knob value policy
  local tr=$1 fam=$2 knob=$3 val=$4 pol=$5 d="$OUT/demand/f1.h5" j rm
  j=$(replay "$T/$tr.h5" "$pol" "$d")
  rm=$(demand_means "$d")
  echo "$tr,$fam,$knob,$val,\"$(field "$j" policy)\",$(field "$j" mean_kept_mass),$(field "$j" min_kept_mass),${rm%% *},$(jq -r '1 - .final_evicted_fraction' <<<"$j"),$(field "$j" mean_hbm_fraction)" >>"$F1"
  rm -f "$d"
}
for b in 64 128 256 384 512 768 1024 1536; do f1_row syn h2o budget "$b" "h2o:budget=$b"; done
for b in 64 128 256 384 512; do f1_row syn snapkv budget "$b" "snapkv:budget=$b"; done
for r in 0 0.02 0.05 0.1 0.15 0.2 0.3; do f1_row syn tiered evict "$r" "tiered:hbm=0.5,evict=$r"; done
for b in 16 32 64 96 128 192 256; do f1_row cap h2o budget "$b" "h2o:budget=$b"; done
for b in 32 40 48; do f1_row cap snapkv budget "$b" "snapkv:budget=$b"; done
for r in 0 0.02 0.05 0.1 0.15 0.2 0.3; do f1_row cap tiered evict "$r" "tiered:hbm=0.5,evict=$r"; done
# tiered with a smaller protected window, so eviction reaches more of the captured trace
for r in 0.1 0.2 0.3 0.5; do f1_row cap tiered-recent32 evict "$r" "tiered:hbm=0.5,evict=$r,recent=32"; done

# ---------------------------------------------------------------------------------------------
# 2. Kept mass does not depend on the HBM ratio (Proposition 1); the PCIe volume does
log "finding 2: HBM ratio"
F2=$OUT/f2_hbm_ratio.csv
echo "trace,hbm,policy,mean_kept_mass,min_kept_mass,mean_hbm_fraction,final_hbm_fraction,final_evicted_fraction,promoted,demoted,evicted,t1_token_steps_full,t1_tokens_differential" >"$F2"
for tr in syn cap; do
  for h in 0.3 0.5 0.7 1.0; do
    j=$(replay "$T/$tr.h5" "tiered:hbm=$h,evict=0.1")
    jq -r --arg tr "$tr" --arg h "$h" '[$tr, $h, .policy, .mean_kept_mass, .min_kept_mass, .mean_hbm_fraction,
        .final_hbm_fraction, .final_evicted_fraction, .promoted, .demoted, .evicted, .host_token_steps,
        .newly_host] | @csv' <<<"$j" >>"$F2"
  done
done

# ---------------------------------------------------------------------------------------------
# 3. Where Monarch's paging starts to act: kept mass and HBM fraction by context length
log "finding 3: monarch vs context length"
F3=$OUT/f3_monarch.csv
F3S=$OUT/f3_monarch_summary.csv
echo "trace,preset,attend,ctx_lo,ctx_hi,steps,mean_kept_mass,mean_hbm_fraction,mean_t2_fraction" >"$F3"
echo "trace,preset,attend,policy,mean_kept_mass,min_kept_mass,mean_hbm_fraction,final_hbm_fraction,promoted,compressed_bits" >"$F3S"
EDGES_MON="0 256 384 512 768 1024 1536 2048 2560"
EDGES_CAP="0 100 200 256 300 384 450"
f3() { # trace prompt layers edges preset attend
  local tr=$1 p=$2 l=$3 edges=$4 preset=$5 attend=$6 d="$OUT/demand/f3-$1-$5-$6.h5" j
  j=$(replay "$T/$tr.h5" "monarch:preset=$preset,attend=$attend" "$d")
  jq -r --arg tr "$tr" --arg p "$preset" --arg a "$attend" '[$tr, $p, $a, .policy, .mean_kept_mass, .min_kept_mass,
      .mean_hbm_fraction, .final_hbm_fraction, .promoted, .compressed_bits] | @csv' <<<"$j" >>"$F3S"
  demand_by_context "$d" "$p" "$l" "$edges" | sed "s/^/$tr,$preset,$attend,/" >>"$F3"
  rm -f "$d"
}
for preset in fast default accurate; do f3 mon 64 28 "$EDGES_MON" "$preset" hot; done
f3 mon 64 28 "$EDGES_MON" default all
# the real model's context never passes 450 tokens: only the fast preset (window 256) can page
for preset in fast default; do f3 cap "$P_CAP" 5 "$EDGES_CAP" "$preset" hot; done

# ---------------------------------------------------------------------------------------------
# 4. MOSAIC per-layer budgets vs uniform at the same mean, on held-out traces
log "finding 4: MOSAIC budget search (synthetic; h2o base, 180 evaluations, knee winner)"
"$KV" replay search-budgets --traces "$T/syn.h5" --held-out "$T/syn_ho.h5" --base-policy h2o \
  --evaluations 180 --seed 1 --floor 64 --cap 2048 --target-mean 128 --target-mean 256 \
  --target-mean 512 --format json --out "$OUT/f4_mosaic_syn_front.csv" >"$OUT/f4_mosaic_syn.json"
log "finding 4: MOSAIC budget search (synthetic; winner = best recall at mean <= 256)"
"$KV" replay search-budgets --traces "$T/syn.h5" --held-out "$T/syn_ho.h5" --base-policy h2o \
  --evaluations 180 --seed 1 --floor 64 --cap 2048 --winner-max-mean 256 --target-mean 256 \
  --format json --out "$OUT/f4_mosaic_syn256_front.csv" >"$OUT/f4_mosaic_syn256.json"
log "finding 4: MOSAIC budget search (stories260K; h2o base, 180 evaluations)"
"$KV" replay search-budgets --traces "$T/cap.h5" --held-out "$T/cap2.h5" --base-policy h2o \
  --evaluations 180 --seed 1 --floor 8 --cap 448 --target-mean 32 --target-mean 64 \
  --target-mean 128 --format json --out "$OUT/f4_mosaic_cap_front.csv" >"$OUT/f4_mosaic_cap.json"

# ---------------------------------------------------------------------------------------------
# 5. DMS: delayed vs immediate eviction at equal average memory
log "finding 5: DMS delayed vs immediate eviction"
F5=$OUT/f5_dms.csv
echo "trace,case,policy,mean_kept_mass,min_kept_mass,mean_hbm_fraction,final_hbm_fraction" >"$F5"
f5_row() { # trace case policy -> row; prints mean_hbm_fraction
  local j
  j=$(replay "$T/$1.h5" "$3")
  jq -r --arg tr "$1" --arg c "$2" '[$tr, $c, .policy, .mean_kept_mass, .min_kept_mass, .mean_hbm_fraction,
      .final_hbm_fraction] | @csv' <<<"$j" >>"$F5"
  field "$j" mean_hbm_fraction
}
# match TRACE TEMPLATE LO HI TARGET -> the integer budget b in [LO, HI] whose policy
# (TEMPLATE with @ replaced by b) has the mean HBM fraction closest to TARGET (bisection;
# the fraction grows with the budget)
match() {
  local tr=$1 tmpl=$2 lo=$3 hi=$4 target=$5 mid f c d best bestd=""
  mhf() { "$KV" replay run --trace "$T/$tr.h5" --policy "${tmpl//@/$1}" --format json |
    jq -r '.policies[0].mean_hbm_fraction'; }
  while ((hi - lo > 1)); do
    mid=$(((lo + hi) / 2))
    f=$(mhf "$mid")
    if awk -v a="$f" -v t="$target" 'BEGIN { exit !(a < t) }'; then lo=$mid; else hi=$mid; fi
  done
  best=$hi
  for c in $lo $hi; do
    f=$(mhf "$c")
    d=$(awk -v a="$f" -v t="$target" 'BEGIN { x = a - t; print (x < 0 ? -x : x) }')
    if [[ -z $bestd ]] || awk -v a="$d" -v b="$bestd" 'BEGIN { exit !(a < b) }'; then best=$c; bestd=$d; fi
  done
  echo "$best"
}
f5() { # trace budget delay
  local tr=$1 b=$2 w=$3 target m
  target=$(f5_row "$tr" "delayed (budget B, delay w)" "dms:budget=$b,delay=$w")
  f5_row "$tr" "immediate, equal steady budget B" "dms:budget=$b,delay=0" >/dev/null
  f5_row "$tr" "immediate, equal peak B+w" "dms:budget=$((b + w)),delay=0" >/dev/null
  m=$(match "$tr" "dms:budget=@,delay=0" "$b" "$((b + w))" "$target")
  f5_row "$tr" "immediate, equal mean memory" "dms:budget=$m,delay=0" >/dev/null
  f5_row "$tr" "h2o recent=0 at B (identity check)" "h2o:budget=$b,recent=0" >/dev/null
  m=$(match "$tr" "h2o:budget=@,recent=0.5" "$b" "$((b + w))" "$target")
  f5_row "$tr" "h2o recent=0.5, equal mean memory" "h2o:budget=$m,recent=0.5" >/dev/null
}
f5 syn 256 256
f5 syn 128 128
f5 cap 64 64
f5 cap 32 32

# ---------------------------------------------------------------------------------------------
# 6. Every budgeted policy against the oracle bound at the same budget
log "finding 6: policies vs oracle"
F6=$OUT/f6_oracle.csv
echo "trace,budget,policy,mean_kept_mass,min_kept_mass,mean_hbm_fraction,mean_held_tokens,oracle_kept_mass,gap" >"$F6"
f6() { # trace budget prompt steps policies...
  local tr=$1 b=$2 p=$3 n=$4; shift 4
  local oj ok j pol
  oj=$(replay "$T/$tr.h5" "oracle:budget=$b")
  ok=$(field "$oj" mean_kept_mass)
  for pol in "oracle:budget=$b" "$@" "oracle:budget=$((b + n))"; do
    if [[ $pol == "oracle:budget=$b" ]]; then j=$oj; else j=$(replay "$T/$tr.h5" "$pol"); fi
    # held tokens: mean HBM fraction x mean context (prompt + (steps+1)/2), a close estimate
    jq -r --arg tr "$tr" --arg b "$b" --arg ok "$ok" --arg p "$p" --arg n "$n" \
      '[$tr, $b, .policy, .mean_kept_mass, .min_kept_mass, .mean_hbm_fraction,
        (if (.policy | startswith("oracle:")) then (.policy | capture("budget=(?<b>[0-9]+)").b | tonumber)
         else ((.mean_hbm_fraction * (($p|tonumber) + (($n|tonumber) + 1) / 2)) | round) end),
        ($ok|tonumber), (($ok|tonumber) - .mean_kept_mass)] | @csv' <<<"$j" >>"$F6"
  done
}
common() { # budget
  echo "streaming:sinks=4,window=$(($1 - 4))" "h2o:budget=$1" "h2o:budget=$1,recent=0" \
    "tova:budget=$1" "dms:budget=$1,delay=0" "dms:budget=$1" "knorm:budget=$1" "knorm:budget=$1,recent=$(($1 / 2))" \
    "snapkv:budget=$1" "pyramidkv:budget=$1"
}
# shellcheck disable=SC2046
f6 syn 256 512 1536 $(common 256) "adakv:budget=256,mass=mean"
# shellcheck disable=SC2046
f6 synh 256 512 512 $(common 256) "adakv:budget=256,mass=heads" "adakv:budget=256,mass=mean"
# shellcheck disable=SC2046
f6 cap 64 "$P_CAP" 400 $(common 64 | sed 's/pyramidkv:budget=64/pyramidkv:budget=64,window=32/') \
  "adakv:budget=64,mass=heads" "adakv:budget=64,mass=mean"
# the real trace's prompt (50 tokens) fits budget 64: the prompt compressors at budget 40 instead
f6 cap 40 "$P_CAP" 400 "snapkv:budget=40" "snapkv:budget=40,pooling=avg" \
  "adakv:budget=40,mass=heads" "adakv:budget=40,mass=mean"

# ---------------------------------------------------------------------------------------------
# 7. One serving consequence: the quickstart simulation (full vs tiered, full/differential prefetch)
log "finding 7: kvtier sim quickstart"
"$KV" sim "$ROOT/configs/examples/quickstart.textproto" --out "$OUT/f7_sim" >"$OUT/f7_sim.txt"

# ---------------------------------------------------------------------------------------------
# 8. Does the replay's lost attention mass predict the live cache's divergence? Per policy
# point: lost mass of the replay over the captured trace, and the mean KL(full || tiered) of
#   follow  the live cache placed by that replay (--follow-trace: same placement, same tokens);
#   live    the live cache placed by the policy from the model's own (pruned) attention.
# Spearman rank correlation over all points (ranks of ties averaged).
log "finding 8: replay lost mass vs live divergence"
F8=$OUT/f8_live_vs_replay.csv
# (the policy last: its commas are inside quotes, and the awk below splits on every comma)
echo "trace,family,replay_lost_mass,follow_mean_kl,live_mean_kl,live_greedy_agreement,live_evicted_fraction,policy" >"$F8"
f8_row() { # trace-name prompt family policy
  local tr=$1 prompt=$2 fam=$3 pol=$4 j lost fkl
  j=$(replay "$T/$tr.h5" "$pol")
  lost=$(jq -r '1 - .mean_kept_mass' <<<"$j")
  "$KV" live --model "$FIX/stories260K.bin" --policy "$pol" --follow-trace "$T/$tr.h5" \
    --measure "$OUT/f8.json" >/dev/null
  fkl=$(jq -r '.divergence.mean_kl_nats' "$OUT/f8.json")
  "$KV" live --model "$FIX/stories260K.bin" --policy "$pol" --prompt "$prompt" \
    --max-new-tokens 400 --measure "$OUT/f8.json" >/dev/null
  jq -r --arg tr "$tr" --arg fam "$fam" --arg lost "$lost" --arg fkl "$fkl" \
    '[$tr, $fam, ($lost|tonumber), ($fkl|tonumber), .divergence.mean_kl_nats,
      (.divergence.greedy_agreement_tokens|tonumber),
      ((.tiers.final_tier_token_layers[3]|tonumber) /
       ([.tiers.final_tier_token_layers[]|tonumber] | add)), .policy] | @csv' "$OUT/f8.json" >>"$F8"
  rm -f "$OUT/f8.json"
}
for tr in cap cap2; do
  prompt=$PROMPT_A
  [[ $tr == cap2 ]] && prompt=$PROMPT_B
  for r in 0.05 0.1 0.2 0.3 0.5 0.7; do f8_row "$tr" "$prompt" tiered "tiered:hbm=0.5,evict=$r,recent=32"; done
  for b in 16 32 64 128; do
    f8_row "$tr" "$prompt" h2o "h2o:budget=$b"
    f8_row "$tr" "$prompt" streaming "streaming:sinks=4,window=$((b - 4))"
    f8_row "$tr" "$prompt" tova "tova:budget=$b"
    f8_row "$tr" "$prompt" dms "dms:budget=$b,delay=16"
  done
done
# spearman COLUMN_X COLUMN_Y < CSV (header skipped) -> rho
spearman() {
  awk -F, -v cx="$1" -v cy="$2" '
    function ranks(v, r, n,   i, j, k, idx, t, lo) {
      for (i = 1; i <= n; i++) idx[i] = i
      for (i = 2; i <= n; i++) { t = idx[i]; for (j = i - 1; j >= 1 && v[idx[j]] > v[t]; j--) idx[j + 1] = idx[j]; idx[j + 1] = t }
      for (i = 1; i <= n; i = k) {
        for (k = i + 1; k <= n && v[idx[k]] == v[idx[i]]; k++) ;
        for (lo = i; lo < k; lo++) r[idx[lo]] = (i + k - 1) / 2
      }
    }
    NR > 1 { n++; x[n] = $cx + 0; y[n] = $cy + 0 }
    END {
      ranks(x, rx, n); ranks(y, ry, n)
      for (i = 1; i <= n; i++) { mx += rx[i] / n; my += ry[i] / n }
      for (i = 1; i <= n; i++) { sxy += (rx[i] - mx) * (ry[i] - my); sxx += (rx[i] - mx) ^ 2; syy += (ry[i] - my) ^ 2 }
      printf "%.4f\n", sxy / sqrt(sxx * syy)
    }'
}
{
  echo "pairing,points,spearman_rho"
  echo "replay_lost_mass~follow_mean_kl,$(($(wc -l <"$F8") - 1)),$(spearman 3 4 <"$F8")"
  echo "replay_lost_mass~live_mean_kl,$(($(wc -l <"$F8") - 1)),$(spearman 3 5 <"$F8")"
  echo "follow_mean_kl~live_mean_kl,$(($(wc -l <"$F8") - 1)),$(spearman 4 5 <"$F8")"
  for fam in tiered h2o streaming tova dms; do
    grep -E "^(trace|\"[a-z0-9]+\",\"$fam\")," "$F8" >"$OUT/f8_fam.csv"
    echo "$fam:replay_lost_mass~follow_mean_kl,$(($(wc -l <"$OUT/f8_fam.csv") - 1)),$(spearman 3 4 <"$OUT/f8_fam.csv")"
    echo "$fam:replay_lost_mass~live_mean_kl,$(($(wc -l <"$OUT/f8_fam.csv") - 1)),$(spearman 3 5 <"$OUT/f8_fam.csv")"
  done
  rm -f "$OUT/f8_fam.csv"
} >"$OUT/f8_rank_correlation.csv"

# ---------------------------------------------------------------------------------------------
# 9. Tiering instead of preempting: configs/examples/preemption-vs-tiering.textproto admitted
# on demand (as vLLM) and, the same file without `on_demand_admission`, by whole-request
# reservations, and the swapping example. One row per admission and policy.
log "finding 9: preemption vs tiering"
EX=$ROOT/configs/examples/preemption-vs-tiering.textproto
grep -q 'on_demand_admission {' "$EX" || { echo "findings.sh: $EX has no on_demand_admission" >&2; exit 2; }
# the block is three lines: its opening, the watermark, its closing brace
awk '/on_demand_admission \{/ { skip = 3 } skip > 0 { skip--; next } { print }' "$EX" >"$OUT/f9_whole_request.textproto"
"$KV" sim "$EX" --out "$OUT/f9_on_demand" >/dev/null
"$KV" sim "$OUT/f9_whole_request.textproto" --out "$OUT/f9_whole_request" >/dev/null
# The example pages its KV in vLLM's 16-token blocks; recomputing in 256-token blocks is what
# swapping in 256-token blocks (below) is measured against.
"$KV" sim "$EX" --set memory.kv_block_tokens=256 --out "$OUT/f9_on_demand_256" >/dev/null
# Preemption by swapping instead of recompute: the example as it is (vLLM's defaults, 4 GiB of
# swap space and 16-token blocks), and with room for every victim (64 GiB) in 16- and 256-token
# blocks.
SWAP=$ROOT/configs/examples/preemption-by-swapping.textproto
"$KV" sim "$SWAP" --out "$OUT/f9_swap_4g_16" >/dev/null
"$KV" sim "$SWAP" --set workload.on_demand_admission.swap.space_gib=64 \
  --out "$OUT/f9_swap_64g_16" >/dev/null
"$KV" sim "$SWAP" --set workload.on_demand_admission.swap.space_gib=64 \
  --set memory.kv_block_tokens=256 --out "$OUT/f9_swap_64g_256" >/dev/null
{
  echo "admission,tokens_per_s,ttft_p50_ms,tpot_p50_ms,max_running,mean_running,preemptions,preempted_kv_tokens,swapped_preemptions,swap_s,hbm_saved_peak_gib,host_kv_used_peak_gib,policy"
  for adm in whole_request on_demand on_demand_256 swap_4g_16 swap_64g_16 swap_64g_256; do
    jq -r --arg adm "$adm" '.policies[] | .metrics as $m | [$adm, $m.throughput_output_tokens_per_s,
      $m.ttft_p50_ms, $m.tpot_p50_ms, $m.max_running_requests, $m.mean_running_requests,
      $m.preemptions, $m.preempted_kv_tokens, $m.swapped_preemptions, $m.swap_s,
      $m.hbm_saved_peak_gib, $m.host_kv_used_peak_gib, .policy] | @csv' "$OUT/f9_$adm/report.json"
  done
} >"$OUT/f9_preemption.csv"

rm -rf "$OUT/demand" "$OUT/kvtier.bin"
log "done: $OUT"
