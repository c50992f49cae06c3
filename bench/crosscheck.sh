#!/usr/bin/env bash
# Cross-checks spillway's forward pass against the reference engine
# (llama.cpp) on GGUF files of every architecture and weight type spillway
# loads, made by `spillway model make` and quantized by llama.cpp's own
# llama-quantize: ../shared has recorded outputs for two small llama files
# only, so qwen2, qwen3, qwen3moe, phi3, gemma3, gpt-oss, Llama 3's RoPE factors, BF16 and the K-quants
# get their second opinion here. Prints a table; exits 1 when a model fails.
#
#   bench/crosscheck.sh [BUILD_DIR]      (default: build; needs the llama.cpp
#                                         that bench/llamacpp-build.sh builds)
#   CROSSCHECK_ONLY=REGEX bench/crosscheck.sh ...   only the models whose name
#                                         matches REGEX (grep -E), e.g. 'q3_k|iq4'
#                                         ('embed': the embeddings rows,
#                                         bench/crosscheck-embeddings.sh)
#
# For each model: spillway generates 24 tokens greedily with its top-5
# log-probabilities (`spillway run --json --top-logprobs 5`); llama.cpp is
# fed the same prompt ids and then spillway's tokens one by one, and
# compared at every step (bench/crosscheck_llamacpp.c). Quantized types are
# also compared with exact arithmetic: the same weights dequantized to F32
# (bench/dequantize_gguf.c) and run by llama.cpp; and every quantized
# tensor's dequantization is compared with llama.cpp's own, value for value
# (bench/dequantize_llamacpp.c; all equal bit for bit, 2026-12-06).
# Both engines round the activations to 8 bits for quantized dot
# products, so each lands ~0.1-0.3
# from the exact log-probabilities on these random-weight models, and not
# at the same place; what is checked is that spillway is on average no
# further from exact than llama.cpp is (the mean |difference| over the
# 24 x 5 log-probabilities within 1.5x + 0.02: the largest single one is
# shown too, but one near-tie step decides it), that the two agree on the
# argmax in at least 80% of the steps (random weights make near-ties), and
# for unquantized files that they agree within 0.02 at every step (both
# keep the KV cache in F16). llama.cpp's distance from exact is measured
# twice: on its own greedy sequence of the exact file's (mean|r-ex|) and on
# spillway's quantized sequence (same-seq, the one spillway's distance is
# measured on); the larger is the yardstick. They part where the sequences
# reach different near-ties: in a mixture of experts a near-tie of the
# router tipped one way changes a step's log-probabilities by up to ~1,
# and it may lie on one sequence and not on the other.
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
here=$(cd "$(dirname "$0")" && pwd)
ref_bin=$(cd "$("$here/llamacpp-build.sh")" && pwd)
ref_src="$ref_bin/../.."
work="$build/crosscheck"
mkdir -p "$work"
cc -O2 -o "$work/crosscheck_llamacpp" "$here/crosscheck_llamacpp.c" -I"$ref_src/include" \
  -I"$ref_src/ggml/include" -L"$ref_bin" -lllama -lggml -lggml-base -ljansson -lm \
  -Wl,-rpath,"$ref_bin"
cc -O2 -o "$work/dequantize_gguf" "$here/dequantize_gguf.c" -I"$here/../src" \
  $(cat "$build/spillway-libs.txt") -ljansson -lm -lpthread
cc -O2 -o "$work/dequantize_llamacpp" "$here/dequantize_llamacpp.c" -I"$ref_src/ggml/include" \
  -I"$here/../src" $(cat "$build/spillway-libs.txt") -L"$ref_bin" -lggml -lggml-base -ljansson \
  -lm -lpthread -Wl,-rpath,"$ref_bin"
xc="$work/crosscheck_llamacpp"
prompt="Once upon a time there was a little"

# name -> `model make` arguments; files from ../shared when present.
# gemma3: heads of 128 (wider than dim / heads, as Gemma 3's 256), layer 0
# sliding with a window of 4 (shorter than the prompt), layer 1 global.
gemma3="--arch gemma3 --head-dim 128 --sliding-window 4 --swa-pattern 2"
# qwen3moe: qwen3's heads, 8 experts of ffn 512 per layer, 2 used per token.
qwen3moe="--arch qwen3moe --head-dim 128 --experts 8 --experts-used 2"
# gpt-oss: heads of 64 (as gpt-oss's), 32 experts of ffn 512, 4 used per
# token (gpt-oss-20b's), layer 0 sliding with a window of 4, layer 1 global,
# YaRN, sinks, biases.
gptoss="--arch gpt-oss --head-dim 64 --experts 32 --experts-used 4 --sliding-window 4"
declare -A made=(
  [llama-f32]="--type f32" [llama-f16]="--type f16" [llama-bf16]="--type bf16"
  [llama-q8_0]="--type q8_0" [llama-q4_0]="--type q4_0" [llama-q4_k]="--type q4_k"
  [llama-q5_k]="--type q5_k" [llama-q6_k]="--type q6_k" [llama-q4_k_m]="--type q4_k_m"
  [llama-q5_k_m]="--type q5_k_m" [llama-q3_k]="--type q3_k" [llama-q2_k]="--type q2_k"
  [llama-iq4_xs]="--type iq4_xs" [llama-iq4_nl]="--type iq4_nl" [llama-q3_k_m]="--type q3_k_m"
  [llama-mxfp4]="--type mxfp4"
  [qwen2-q3_k_m]="--arch qwen2 --type q3_k_m" [llama3-f32]="--arch llama3 --type f32"
  [llama3-q4_k_m]="--arch llama3 --type q4_k_m" [qwen2-f32]="--arch qwen2 --type f32"
  [qwen2-q8_0]="--arch qwen2 --type q8_0" [qwen2-q4_k_m]="--arch qwen2 --type q4_k_m"
  [llama-tied-q8_0]="--type q8_0 --tied"
  [qwen3-f32]="--arch qwen3 --head-dim 128 --type f32" [qwen3-f16]="--arch qwen3 --head-dim 128 --type f16"
  [qwen3-q8_0]="--arch qwen3 --head-dim 128 --type q8_0"
  [qwen3-q4_k_m]="--arch qwen3 --head-dim 128 --type q4_k_m"
  [phi3-f32]="--arch phi3 --type f32" [phi3-f16]="--arch phi3 --type f16"
  [phi3-q8_0]="--arch phi3 --type q8_0" [phi3-q4_k_m]="--arch phi3 --type q4_k_m"
  [gemma3-f32]="$gemma3 --type f32" [gemma3-f16]="$gemma3 --type f16"
  [gemma3-q8_0]="$gemma3 --type q8_0" [gemma3-q4_k_m]="$gemma3 --type q4_k_m"
  [qwen3moe-f32]="$qwen3moe --type f32" [qwen3moe-f16]="$qwen3moe --type f16"
  [qwen3moe-q8_0]="$qwen3moe --type q8_0" [qwen3moe-q4_k_m]="$qwen3moe --type q4_k_m"
  [qwen3moe-mxfp4]="$qwen3moe --type mxfp4"
  [gpt-oss-f32]="$gptoss --type f32" [gpt-oss-f16]="$gptoss --type f16"
  [gpt-oss-q8_0]="$gptoss --type q8_0" [gpt-oss-mxfp4]="$gptoss --type mxfp4")
order="llama-f32 llama-f16 llama-bf16 llama-q8_0 llama-q4_0 llama-q4_k llama-q5_k llama-q6_k
       llama-q4_k_m llama-q5_k_m llama-q3_k llama-q2_k llama-iq4_xs llama-iq4_nl llama-q3_k_m
       llama-mxfp4
       llama3-f32 llama3-q4_k_m qwen2-f32 qwen2-q8_0 qwen2-q4_k_m qwen2-q3_k_m llama-tied-q8_0
       qwen3-f32 qwen3-f16 qwen3-q8_0 qwen3-q4_k_m phi3-f32 phi3-f16 phi3-q8_0 phi3-q4_k_m
       gemma3-f32 gemma3-f16 gemma3-q8_0 gemma3-q4_k_m
       qwen3moe-f32 qwen3moe-f16 qwen3moe-q8_0 qwen3moe-q4_k_m qwen3moe-mxfp4
       gpt-oss-f32 gpt-oss-f16 gpt-oss-q8_0 gpt-oss-mxfp4"
files=()
for m in $order; do
  f="$work/$m.gguf"
  # shellcheck disable=SC2086 # the table's arguments are words
  [ -f "$f" ] || "$bin" model make -o "$f" --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 \
    --vocab 2048 --seed 3 ${made[$m]} >/dev/null
  files+=("$f")
done
# Files quantized by llama.cpp's own quantizer (its choice of types per
# tensor, as the GGUF files people download were made). No imatrix: the
# low-bit types here do not need one (Q2_K only warns).
for base in llama-f32 llama3-f32 qwen2-f32 qwen3-f32 phi3-f32 gemma3-f32 qwen3moe-f32 gpt-oss-f32; do
  types="Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q3_K_S Q3_K_M Q3_K_L Q2_K IQ4_XS IQ4_NL"
  # MXFP4_MOE: the experts' matrices in MXFP4 (llama.cpp quantizes only
  # those; the rest becomes Q8_0), so only for the mixtures of experts;
  # gpt-oss: llama.cpp's Q8_0, Q4_K_M and MXFP4_MOE (as gpt-oss ships)
  [ "$base" = qwen3moe-f32 ] && types="$types MXFP4_MOE"
  [ "$base" = gpt-oss-f32 ] && types="Q8_0 Q4_K_M MXFP4_MOE"
  for t in $types; do
    f="$work/llamacpp-${base%-f32}-$t.gguf"
    [ -f "$f" ] || "$ref_bin/llama-quantize" "$work/$base.gguf" "$f" "$t" >"$f.log" 2>&1 ||
      { echo "crosscheck: llama-quantize $t failed, see $f.log" >&2; rm -f "$f"; exit 1; }
    files+=("$f")
  done
done
for s in stories260K llama-2-tiny-random; do
  [ -f "$here/../../shared/models/$s.gguf" ] && files+=("$here/../../shared/models/$s.gguf")
done

printf '%-28s %6s %8s %10s %12s %12s %12s  %s\n' model steps "argmax=" "max|o-r|" "mean|o-ex|" \
  "mean|r-ex|" "same-seq" verdict
failed=0
for f in "${files[@]}"; do
  name=$(basename "$f" .gguf)
  if [ -n "${CROSSCHECK_ONLY:-}" ] && ! grep -qE -- "$CROSSCHECK_ONLY" <<<"$name"; then
    continue
  fi
  if ! "$bin" run -m "$f" -p "$prompt" -n 24 --temp 0 --ignore-eos --json --top-logprobs 5 \
    >"$work/$name.json" 2>"$work/$name.err"; then
    if grep -q "does not run yet" "$work/$name.err"; then # a type this build lacks (MXFP4)
      printf '%-28s %s\n' "$name" "skipped: $(grep -o "type [a-z0-9_]*" "$work/$name.err" | head -1) not in this build"
      continue
    fi
    cat "$work/$name.err" >&2
    exit 1
  fi
  read -r steps agree diff _ < <("$xc" "$f" "$work/$name.json")
  type=$("$bin" model info "$f" |
    awk '$1 == "blk.0.attn_q.weight" || $1 == "blk.0.attn_qkv.weight" { print $2 }')
  ours_exact=-; ref_exact=-; ref_same=-
  if [ "$type" != f32 ] && [ "$type" != f16 ]; then
    "$work/dequantize_gguf" "$f" "$work/$name.f32.gguf"
    "$bin" run -m "$work/$name.f32.gguf" -p "$prompt" -n 24 --temp 0 --ignore-eos --json \
      --top-logprobs 5 >"$work/$name.f32.json" 2>/dev/null
    # spillway's quantized run against exact weights, and llama.cpp's
    # quantized run against spillway's exact one (the exact runs of the two
    # engines agree within the F16 KV rounding, see the f32 rows).
    ours_exact=$("$xc" "$work/$name.f32.gguf" "$work/$name.json" | cut -d' ' -f4)
    ref_exact=$("$xc" "$f" "$work/$name.f32.json" | cut -d' ' -f4)
    # llama.cpp's distance on spillway's own token sequence (its quantized
    # and its exact run both fed spillway's tokens)
    ref_same=$("$xc" "$f" "$work/$name.json" "$work/$name.f32.gguf" | cut -d' ' -f5)
  fi
  verdict=$(awk -v s="$steps" -v a="$agree" -v d="$diff" -v oe="$ours_exact" -v re="$ref_exact" \
    -v rs="$ref_same" \
    'BEGIN { ok = a * 5 >= s * 4
             if (rs != "-" && rs > re) re = rs
             if (oe == "-") ok = ok && d <= 0.02; else ok = ok && oe <= 1.5 * re + 0.02
             print ok ? "ok" : "FAIL" }')
  [ "$verdict" = ok ] || failed=1
  printf '%-28s %6s %8s %10.4f %12s %12s %12s  %s\n' "$name" "$steps" "$agree" "$diff" \
    "$ours_exact" "$ref_exact" "$ref_same" "$verdict"
done
# Every quantized tensor of those files decoded by llama.cpp's to_float and
# by spillway's eng_dequantize_row: bit for bit, per type.
if ! "$work/dequantize_llamacpp" "${files[@]}" >"$work/dequantize.txt"; then
  failed=1
  echo "dequantization differs from llama.cpp's (see above; $work/dequantize.txt)"
fi
awk '{ n[$2] += $3; v[$2] += $4; d[$2] += $5 }
     END { for (t in n) printf "dequantization %-7s %4d tensors %11d values, %d not bit-equal to llama.cpp'"'"'s\n", t, n[t], v[t], d[t] }' \
  "$work/dequantize.txt" | sort
# /v1/embeddings against llama-server's (pooling mean, CLS and last)
if [ -z "${CROSSCHECK_ONLY:-}" ] || grep -qE -- "$CROSSCHECK_ONLY" <<<"embed"; then
  "$here/crosscheck-embeddings.sh" "$build" || failed=1
fi
exit "$failed"
