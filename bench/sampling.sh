#!/usr/bin/env bash
# Sampling benchmark: decode tokens/s through `spillway worker` with greedy
# decoding and with each sampling truncation, on a 32,000-token vocabulary
# (the "small" preset, Q8_0) and a Qwen-sized 151,936-token one (the
# "qwen3-tiny" shape with --vocab 151936, Q8_0), 1 and 8 concurrent streams;
# MODELS="q06b" adds a model of Qwen3-0.6B's shape (random weights, Q8_0),
# where a token's forward pass is that of a real small model.
# Each stream asks for TOKENS tokens (ignore_eos, not streamed) after a short
# prompt; tok/s is all streams' tokens over the wall time from the first
# request to the last reply, the best of REPEAT rounds; a round runs every
# mode once, so a moment when another process takes a core (a shared 2-core
# machine) spreads over the modes instead of landing on one. "vs greedy" is
# a mode's figure over greedy's on the same model and streams. When
# bench/llamacpp-build.sh's llama-server exists (REF_DIR, default
# build-reference/) the same requests go to it on the same GGUF; otherwise
# its columns print "-" and the header says why. Then one draw's cost on
# its own (bench/sampler_draw.c: CPU time on one thread, steady on a busy
# machine) for each vocabulary size in DRAW_VOCABS, logits of spread 2 and
# 5, and a top-p draw's over mixed distributions, with the proposals and
# alone, its exact search, whose estimate sometimes misses
# (bench/sampler_topp_mix.c); and for each model in DRAW_MODELS, a draw's
# cost on the logits of 200 steps of a real decode of that model
# (sampler_draw --model), with how many of top-p's proposals were refused.
# Prints figures; asserts nothing.
#
#   bench/sampling.sh [BUILD_DIR]          (default: build)
#   THREADS=2 TOKENS=200 REPEAT=3 CONCURRENCY="1 8" MODELS="small v152k" \
#     DRAW_VOCABS="32000 151936" DRAW_MODELS="v152k" bench/sampling.sh
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
dir="$build/models"
threads=${THREADS:-2}
tokens=${TOKENS:-200}
repeat=${REPEAT:-3}
levels=${CONCURRENCY-"1 8"}
models=${MODELS-"small v152k"}
draw_vocabs=${DRAW_VOCABS-"32000 151936"}
draw_models=${DRAW_MODELS-"v152k"}
ref_dir=${REF_DIR:-build-reference}
llama_server="$ref_dir/src/build/bin/llama-server"
mkdir -p "$dir"

# mode -> the request's sampling fields
modes=(greedy temp top_k top_p min_p)
declare -A fields=(
  [greedy]='"temperature":0'
  [temp]='"temperature":0.8,"top_k":0,"top_p":1,"min_p":0'
  [top_k]='"temperature":0.8,"top_k":40,"top_p":1,"min_p":0'
  [top_p]='"temperature":0.8,"top_k":0,"top_p":0.95,"min_p":0'
  [min_p]='"temperature":0.8,"top_k":0,"top_p":1,"min_p":0.05'
)

model_file() {
  local f
  case $1 in
    small) f="$dir/bench-small-q8_0.gguf"
           [ -f "$f" ] || "$bin" model make --preset small --type q8_0 -o "$f" >/dev/null ;;
    v152k) f="$dir/bench-qwen3-tiny-v152k-q8_0.gguf"
           [ -f "$f" ] || "$bin" model make --preset qwen3-tiny --vocab 151936 --type q8_0 \
                            -o "$f" >/dev/null ;;
    q06b)  f="$dir/bench-qwen3-0.6b-shape-q8_0.gguf" # Qwen3-0.6B's shape, random weights
           [ -f "$f" ] || "$bin" model make --arch qwen3 --dim 1024 --layers 28 --heads 16 \
                            --kv-heads 8 --head-dim 128 --ffn 3072 --vocab 151936 \
                            --rope-base 1000000 --tied --type q8_0 -o "$f" >/dev/null ;;
    *) echo "sampling.sh: unknown model $1 (small, v152k, q06b)" >&2; exit 1 ;;
  esac
  printf '%s' "$f"
}

# measure KIND ADDRESS STREAMS: prints "mode tok/s" for every mode
# (KIND unix: a worker's socket path; llama: llama-server's host:port)
measure() {
  local spec=""
  for mode in "${modes[@]}"; do spec+="$mode={${fields[$mode]}};"; done
  python3 - "$1" "$2" "$3" "$tokens" "$repeat" "$spec" <<'PY'
import json, socket, sys, threading, time, http.client

kind, addr, streams, tokens, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
modes = [(m.split("=", 1)[0], json.loads(m.split("=", 1)[1]))
         for m in sys.argv[6].split(";") if m]
prompts = ["Once upon a time there was a little dog", "The cat sat on the mat",
           "In the morning the sun came up", "She said hello to the boy",
           "A big tree stood in the park", "The bird sang a song",
           "We like to eat apples", "Tom and his friend found a box"]

class UnixConn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("w", timeout=600)
        self.unix_path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(600)
        self.sock.connect(self.unix_path)

def one(i, extra, out):
    body = {"prompt": prompts[i % len(prompts)], "max_tokens": tokens, "stream": False,
            "ignore_eos": True, "seed": 1000 + i}
    body.update(extra)
    if kind == "llama":  # llama-server's own names for the same settings
        body["n_predict"] = tokens
        body["cache_prompt"] = False
        host, port = addr.split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=600)
    else:
        c = UnixConn(addr)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    c.close()
    out[i] = r.get("usage", {}).get("completion_tokens", 0)

best = {m: 0.0 for m, _ in modes}
short = {}
for _ in range(repeat):
    for m, extra in modes:
        out = [0] * streams
        t0 = time.monotonic()
        th = [threading.Thread(target=one, args=(i, extra, out)) for i in range(streams)]
        for t in th: t.start()
        for t in th: t.join()
        wall = time.monotonic() - t0
        if sum(out) < streams * tokens:
            short[m] = sum(out)
        best[m] = max(best[m], sum(out) / wall)
for m, _ in modes:
    print(m, "short:%d" % short[m] if m in short else "%.1f" % best[m])
PY
}

wait_up() { # KIND ADDRESS
  for _ in $(seq 300); do
    if [ "$1" = unix ]; then
      curl -sf --unix-socket "$2" http://w/health >/dev/null 2>&1 && return 0
    else
      curl -sf "http://$2/health" >/dev/null 2>&1 && return 0
    fi
    sleep 0.1
  done
  echo "sampling.sh: the server on $2 did not come up" >&2
  return 1
}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

ref_note=$llama_server
[ -x "$llama_server" ] || ref_note="none ($llama_server is absent: bench/llamacpp-build.sh builds it)"
echo "threads $threads, $tokens tokens per stream, best of $repeat rounds; llama-server: $ref_note"
printf '%-7s %-8s %8s %10s %10s %11s %10s\n' model mode streams "tok/s" "vs greedy" "llama tok/s" "vs llama"
for m in $models; do
  file=$(model_file "$m")
  sock="/tmp/spillway-bench-sampling-$$.sock"
  "$bin" worker --model "$file" --listen "unix:$sock" --max-seqs 8 --threads "$threads" \
    --ctx-limit 1024 >/dev/null 2>"$build/bench-sampling.log" &
  wpid=$!
  pids+=("$wpid")
  wait_up unix "$sock"
  lpid=""
  port=$((18000 + $$ % 1000))
  if [ -x "$llama_server" ]; then
    "$llama_server" -m "$file" --port "$port" -t "$threads" -np 8 -c 8192 \
      >/dev/null 2>"$build/bench-sampling-llama.log" &
    lpid=$!
    pids+=("$lpid")
    wait_up tcp "127.0.0.1:$port" || lpid=""
  fi
  for c in $levels; do
    declare -A ours=() theirs=()
    while read -r mode v; do ours[$mode]=$v; done < <(measure unix "$sock" "$c")
    if [ -n "$lpid" ]; then
      while read -r mode v; do theirs[$mode]=$v; done < <(measure llama "127.0.0.1:$port" "$c")
    fi
    for mode in "${modes[@]}"; do
      v=${ours[$mode]}
      lv=${theirs[$mode]:--}
      r="-"
      lr="-"
      [[ $v != short* && ${ours[greedy]} != short* ]] &&
        r=$(awk -v a="$v" -v b="${ours[greedy]}" 'BEGIN { printf "%.2fx", a / b }')
      [[ $v != short* && $lv != - && $lv != short* ]] &&
        lr=$(awk -v a="$v" -v b="$lv" 'BEGIN { printf "%.2fx", a / b }')
      printf '%-7s %-8s %8d %10s %10s %11s %10s\n' "$m" "$mode" "$c" "$v" "$r" "$lv" "$lr"
    done
    unset ours theirs
  done
  kill "$wpid" 2>/dev/null || true
  wait "$wpid" 2>/dev/null || true
  if [ -n "$lpid" ]; then
    kill "$lpid" 2>/dev/null || true
    wait "$lpid" 2>/dev/null || true
  fi
  rm -f "$sock"
done

# one draw on its own
if [ -n "$draw_vocabs$draw_models" ]; then
  work="$build/bench-sampling"
  mkdir -p "$work"
  here=$(cd "$(dirname "$0")" && pwd)
  cc -O2 -std=c11 -D_GNU_SOURCE -o "$work/sampler_draw" "$here/sampler_draw.c" -I"$here/../src" \
    $(cat "$build/spillway-libs.txt") -ljansson -lm -lpthread
  cc -O2 -std=c11 -D_GNU_SOURCE -o "$work/sampler_topp_mix" "$here/sampler_topp_mix.c" \
    -I"$here/../src" $(cat "$build/spillway-libs.txt") -ljansson -lm -lpthread
  for v in $draw_vocabs; do
    for spread in 2 5; do
      "$work/sampler_draw" "$v" "$spread"
    done
    "$work/sampler_topp_mix" "$v"
  done
  for m in $draw_models; do
    "$work/sampler_draw" --model "$(model_file "$m")" 200
  done
fi
