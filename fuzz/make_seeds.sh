#!/bin/sh
# Writes the seed corpus of the trace-reader fuzzer: small valid traces of every granularity.
# usage: fuzz/make_seeds.sh KVTIER_BINARY FOLDER
set -eu
kvtier=$1
folder=$2
mkdir -p "$folder"
export SOURCE_DATE_EPOCH=0
"$kvtier" trace synth --model stories260K --prompt-tokens 6 --steps 4 --top-k 4 --heads \
  --prefill-window 2 --key-norms --chunk-elements 16 --out "$folder/all.h5" >/dev/null
"$kvtier" trace synth --model stories260K --prompt-tokens 5 --steps 3 --out "$folder/mean.h5" \
  >/dev/null
"$kvtier" trace synth --model stories260K --prompt-tokens 5 --steps 6 --top-k 3 --no-mean \
  --pattern chat --dtype fp32 --out "$folder/topk_fp32.h5" >/dev/null
"$kvtier" trace synth --model stories260K --prompt-tokens 8 --steps 5 --deflate 0 \
  --out "$folder/uncompressed.h5" >/dev/null
