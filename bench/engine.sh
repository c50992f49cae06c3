#!/usr/bin/env bash
# Engine benchmark: prefill and decode tokens/s with 2 threads, prompt 128,
# 32 generated, on models made by `spillway model make` (the presets small
# and 1b), next to the reference engine's figures (ref_prefill, ref_decode
# below: llama.cpp's llama-bench on the same shapes, measured once on this
# machine kind; bench/reference.sh measures them again now). Prints figures; asserts nothing.
#
#   bench/engine.sh [BUILD_DIR]        (default: build)
#   MODELS="small-q8_0 1b-q8_0 1b-q4_0" THREADS=2 RUNS=3 bench/engine.sh
# Each model is benchmarked RUNS times (default 3, each the best of 2
# repetitions) and the best prefill and decode figures are kept: on a shared
# 2-core machine one run can be 30% off or worse when another process takes
# a core, and the best run is the one closest to what the engine does alone.
# The K-quant variants (1b-q4_k, 1b-q6_k: every matrix in that type; 1b-q4_k_m:
# the Q4_K_M mix, Q6_K for output and some attn_v / ffn_down) have
# no reference figures; their columns print "-".
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
dir="$build/models"
threads=${THREADS:-2}
runs=${RUNS:-3}
models=${MODELS:-"small-q8_0 1b-q8_0 1b-q4_0 1b-q4_k 1b-q4_k_m 1b-q6_k"}
mkdir -p "$dir"

# Reference engine (llama.cpp CPU build, same shapes, 2 threads), tok/s.
declare -A ref_prefill=([small-q8_0]=2634 [1b-q8_0]=84 [1b-q4_0]=122)
declare -A ref_decode=([small-q8_0]=596 [1b-q8_0]=12.4 [1b-q4_0]=22.3)

# Read bandwidth from a buffer that fits this machine's cache share and from
# one that does not: a model whose decode reads more than the cache holds
# is bound by the second figure. The small model's ~44 MB per token sits in
# between: on the test VM it streams at the first figure when the shared L3
# is not busy with other guests, at the second when it is. One thread's
# figure shows what a core alone can pull.
"$bin" bench memory --threads "$threads" --bytes 24MiB
"$bin" bench memory --threads "$threads" --bytes 48MiB
"$bin" bench memory --threads "$threads" --bytes 1GiB
"$bin" bench memory --threads 1 --bytes 1GiB
printf '%-12s %10s %10s %7s %10s %10s %7s %9s\n' model prefill ref ratio decode ref ratio "read GB/s"
for m in $models; do
  preset=${m%%-*}
  type=${m#*-}
  file="$dir/bench-$m.gguf"
  if [ ! -f "$file" ]; then
    "$bin" model make --preset "$preset" --type "$type" -o "$file" >/dev/null
  fi
  p=0; d=0; bw=0
  for _ in $(seq "$runs"); do
    rec=$("$bin" bench engine -m "$file" --prompt 128 --gen 32 --threads "$threads" --reps 2 --json)
    field() { printf '%s' "$rec" | grep -o "\"$1\":[-0-9.e+]*" | cut -d: -f2; }
    p=$(awk -v a="$p" -v b="$(field prefill_tokens_per_second)" 'BEGIN { print (b > a) ? b : a }')
    if awk -v a="$d" -v b="$(field decode_tokens_per_second)" 'BEGIN { exit !(b > a) }'; then
      d=$(field decode_tokens_per_second); bw=$(field decode_read_gb_per_second)
    fi
  done
  awk -v n="$m" -v p="$p" -v d="$d" -v rp="${ref_prefill[$m]:-0}" -v rd="${ref_decode[$m]:-0}" -v bw="$bw" \
    'function r(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "-" }
     function f(v) { return v > 0 ? sprintf("%.1f", v) : "-" }
     BEGIN { printf "%-12s %10.1f %10s %7s %10.1f %10s %7s %9.1f\n", n, p, f(rp), r(p, rp), d, f(rd), r(d, rd), bw }'
done
