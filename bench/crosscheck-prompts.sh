#!/usr/bin/env bash
# How far a quantized file's run is from exact arithmetic, spillway's and
# llama.cpp's, prompt by prompt: bench/crosscheck.sh measures one prompt,
# and a quantized run's distance from exact moves a lot from prompt to
# prompt (a rounding that tips one way or the other early in the forward
# pass decides where a later 8-bit rounding lands), so one prompt, or the
# first step of a few, cannot tell two engines apart.
#
#   bench/crosscheck-prompts.sh MODEL.gguf [BUILD_DIR]   (default build; needs
#                                        the llama.cpp of bench/llamacpp-build.sh)
#   STEPS=N (default 8) greedy steps per prompt; PROMPTS=N (default 16: 16
#   written prompts, then made ones, "The cat and the dog went to the moon ...";
#   the table is printed up to 32 prompts, the summary always)
#
# Per prompt, with top-5 log-probabilities as bench/crosscheck.sh compares
# them (mean |difference| over the 5 ids of each step):
#   ours     spillway's quantized run against llama.cpp's run of the same
#            weights dequantized to F32 (exact), on spillway's greedy tokens
#   same     llama.cpp's quantized run against the same exact run, on the
#            same tokens and ids (a paired measure)
#   ref      llama.cpp's quantized run against exact on the exact run's
#            greedy tokens (bench/crosscheck.sh's mean|r-ex|)
# each as the mean over all steps and for the first step alone (the
# token after the prompt: prefill only). The summary gives the ratio of the
# means, ours / max(same, ref) as bench/crosscheck.sh judges it and
# ours / same with the standard error of the paired difference ours - same
# over the prompts, and the spread of the per-prompt ratios.
set -euo pipefail
model=$1
build=${2:-build}
steps=${STEPS:-8}
n_prompts=${PROMPTS:-16}
bin="$build/spillway"
here=$(cd "$(dirname "$0")" && pwd)
ref_bin=$(cd "$("$here/llamacpp-build.sh")" && pwd)
ref_src="$ref_bin/../.."
work="$build/crosscheck"
mkdir -p "$work"
xc="$work/crosscheck_llamacpp"
if [ ! -x "$xc" ] || [ "$here/crosscheck_llamacpp.c" -nt "$xc" ]; then
  cc -O2 -o "$xc" "$here/crosscheck_llamacpp.c" -I"$ref_src/include" -I"$ref_src/ggml/include" \
    -L"$ref_bin" -lllama -lggml -lggml-base -ljansson -lm -Wl,-rpath,"$ref_bin"
fi
if [ ! -x "$work/dequantize_gguf" ] || [ "$here/dequantize_gguf.c" -nt "$work/dequantize_gguf" ]; then
  read -r -a libs <"$build/spillway-libs.txt"
  cc -O2 -o "$work/dequantize_gguf" "$here/dequantize_gguf.c" -I"$here/../src" "${libs[@]}" \
    -ljansson -lm -lpthread
fi
name=$(basename "$model" .gguf)
exact="$work/$name.f32.gguf"
[ "$exact" -nt "$model" ] || "$work/dequantize_gguf" "$model" "$exact"

prompts=("Once upon a time there was a little" "The quick brown fox jumps over the lazy dog"
  "In the beginning" "She opened the door and saw" "Tom and Lily went to the park to play"
  "It was a dark and stormy night; the rain fell in torrents" "Why is the sky blue?"
  "One day, a big red" "The little girl had a cat named" "After dinner, they all sat down"
  "1, 2, 3, 4, 5," "def main():" "Dear Sir or Madam, I am writing to"
  "The capital of France is" "He ran as fast as he could, but" "Q: What is 7 times 8? A:")
words=(cat dog tree house river king moon girl boy ship bird rain book star fish road)
for ((i = ${#prompts[@]}; i < n_prompts; i++)); do
  p="The ${words[$((i % 16))]} and the ${words[$((i / 16 % 16))]} went to the ${words[$(((i * 7 + 3) % 16))]}"
  [ $((i / 256 % 2)) = 1 ] && p="$p because it was ${words[$(((i * 5 + 1) % 16))]}"
  prompts+=("$p")
done
# per step of a run: "mean |difference| A[, exact B]" from CROSSCHECK_STEPS
steps_of() { CROSSCHECK_STEPS=1 "$xc" "$@" 2>&1 >/dev/null | sed -n 's/.*difference| \([0-9.]*\)\(, exact \([0-9.]*\)\)\{0,1\}$/\1 \3/p'; }

for ((i = 0; i < n_prompts; i++)); do
  p=${prompts[$i]}
  q="$work/$name.p$i.json" e="$work/$name.p$i.f32.json"
  "$bin" run -m "$model" -p "$p" -n "$steps" --temp 0 --ignore-eos --json --top-logprobs 5 >"$q" 2>/dev/null
  "$bin" run -m "$exact" -p "$p" -n "$steps" --temp 0 --ignore-eos --json --top-logprobs 5 >"$e" 2>/dev/null
  paste -d' ' <(steps_of "$exact" "$q" | cut -d' ' -f1) <(steps_of "$model" "$q" "$exact" | cut -d' ' -f2) \
    <(steps_of "$model" "$e" | cut -d' ' -f1) |
    awk -v i="$i" -v p="$p" '{ o += $1; s += $2; r += $3; if (NR == 1) { o1 = $1; s1 = $2; r1 = $3 } }
      END { printf "%-3d %-44s %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f\n", i, substr(p, 1, 44),
            o / NR, s / NR, r / NR, o1, s1, r1 }'
done >"$work/$name.prompts.txt"
if [ "$n_prompts" -le 32 ]; then
  printf '%-3s %-44s %8s %8s %8s %8s %8s %8s\n' '#' prompt ours same ref "ours@1" "same@1" "ref@1"
  cat "$work/$name.prompts.txt"
fi
awk '{ o += $(NF-5); s += $(NF-4); r += $(NF-3); o1 += $(NF-2); s1 += $(NF-1); r1 += $NF
       y = $(NF-4) > $(NF-3) ? $(NF-4) : $(NF-3); ym += y; rt[NR] = y > 0 ? $(NF-5) / y : 0
       y1 = $(NF-1) > $NF ? $(NF-1) : $NF; ym1 += y1; rt1[NR] = y1 > 0 ? $(NF-2) / y1 : 0
       d = $(NF-5) - $(NF-4); dd += d * d; d1 = $(NF-2) - $(NF-1); dd1 += d1 * d1 }
     function spread(a, n,   j, k, t) { for (j = 1; j <= n; j++) for (k = j + 1; k <= n; k++)
         if (a[k] < a[j]) { t = a[j]; a[j] = a[k]; a[k] = t }
       return sprintf("%.2f..%.2f (median %.2f)", a[1], a[n], (a[int((n + 1) / 2)] + a[int(n / 2) + 1]) / 2) }
     # standard error of the mean of the paired differences ours - same
     function se(sum, sum2, n) { return n > 1 ? sqrt((sum2 / n - (sum / n) ^ 2) / (n - 1)) : 0 }
     END { n = NR
       printf "%d prompts, all steps: ours %.4f same %.4f ref %.4f  ours/max(same,ref) %.3f  ours/same %.3f (ours-same %+.4f +- %.4f)  per prompt %s\n",
         n, o / n, s / n, r / n, o / ym, o / s, (o - s) / n, se(o - s, dd, n), spread(rt, n)
       printf "%d prompts, first step: ours %.4f same %.4f ref %.4f  ours/max(same,ref) %.3f  ours/same %.3f (ours-same %+.4f +- %.4f)  per prompt %s\n",
         n, o1 / n, s1 / n, r1 / n, o1 / ym1, o1 / s1, (o1 - s1) / n, se(o1 - s1, dd1, n), spread(rt1, n) }' \
  "$work/$name.prompts.txt"
