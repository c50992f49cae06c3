#!/usr/bin/env bash
# Prefix-cache benchmark: what a chat UI or an agent loop does, resending
# the whole conversation every turn, against llama.cpp's llama-server
# (prompt cache on, its default) on the same GGUF with the same threads.
# Prints figures; asserts nothing.
#
#   bench/prefix-chat.sh [BUILD_DIR]           (default: build)
#   THREADS=2 CONVERSATIONS=3 TURNS=6 bench/prefix-chat.sh
#
# 1. Time to first token, turn by turn: a system prompt of about 1,500
#    tokens, then a user turn and the server's own reply appended each turn
#    (32 new tokens a reply, greedy). Each server runs its own
#    conversations; their requests alternate, one at a time, so neither
#    competes with the other for the cores. CONVERSATIONS conversations
#    (each its own system prompt); the median of turns 2..TURNS per server.
# 2. Throughput with 8 chats at once that share one system prompt (3 turns
#    of 48 tokens each, a new system prompt each round): spillway
#    --max-seqs 8 against llama-server -np 8, one server at a time, ROUNDS
#    rounds alternated.
# 3. Sequences of 2048 tokens that fit on a 256 MiB sim-gpu with f16, q8_0
#    and q4_0 KV (`spillway model plan`).
#
# llama-server comes from bench/llamacpp-build.sh (REF_DIR); without it,
# the llama-server columns are skipped with a message.
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
threads=${THREADS:-2}
convs=${CONVERSATIONS:-3}
turns=${TURNS:-6}
rounds=${ROUNDS:-2}
ref_bin="${REF_DIR:-build-reference}/src/build/bin/llama-server"
dir="$build/models"
# the small preset (512-dim, 8 layers, 32k vocabulary, Q8_0) trained for
# 8192 tokens, so that a conversation is not cut at the preset's 2048
model="$dir/bench-small-q8_0-ctx8k.gguf"
mkdir -p "$dir"
[ -f "$model" ] || "$bin" model make --preset small --type q8_0 --ctx 8192 -o "$model" >/dev/null

port_sw=$((20000 + $$ % 10000))
port_ls=$((port_sw + 1))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "prefix-chat.sh: the server on port $1 did not start" >&2
  exit 1
}

"$bin" worker --model "$model" --listen "127.0.0.1:$port_sw" --max-seqs 8 --threads "$threads" \
  --ctx-limit 8192 >/dev/null 2>"$build/bench-prefix-worker.log" &
pids+=($!)
have_ls=0
if [ -x "$ref_bin" ]; then
  "$ref_bin" -m "$model" --host 127.0.0.1 --port "$port_ls" -t "$threads" -tb "$threads" \
    -np 8 -c 65536 --no-webui >"$build/bench-prefix-llama-server.log" 2>&1 &
  pids+=($!)
  have_ls=1
else
  echo "llama-server not found at $ref_bin (bench/llamacpp-build.sh builds it): its columns are skipped"
fi
wait_ready "$port_sw"
[ "$have_ls" = 1 ] && wait_ready "$port_ls"

python3 - "$port_sw" "$port_ls" "$have_ls" "$convs" "$turns" "$rounds" <<'EOF'
import json, statistics, sys, threading, time, http.client

port_sw, port_ls, have_ls = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
convs, turns, rounds = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
servers = [("spillway", port_sw)] + ([("llama-server", port_ls)] if have_ls else [])

WORDS = ("the river carried small boats past the old mill while children counted "
         "stones along the bank and a quiet wind moved through tall grass near "
         "houses with red roofs where bakers opened early").split()

def system_prompt(seed, n_words=1100):
    out, x = [], seed * 7919 + 13
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) & 0x7fffffff
        out.append(WORDS[x % len(WORDS)])
    return "You are a careful assistant. " + " ".join(out)

def chat(port, messages, max_tokens):
    """One streamed chat request: (ttft_s, text, prompt_tokens, cached_tokens)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, text, usage, buf = None, [], {}, b""
    while True:
        d = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not d:
            break
        buf += d
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                j = json.loads(line[6:])
                for ch in j.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        text.append(piece)
                if j.get("usage"):
                    usage = j["usage"]
    c.close()
    details = usage.get("prompt_tokens_details") or {}
    return ttft, "".join(text), usage.get("prompt_tokens"), details.get("cached_tokens")

# ---- 1. time to first token, turn by turn --------------------------------
print(f"1. time to first token, a ~1,500-token system prompt and a growing history "
      f"({convs} conversations, {turns} turns, 32 tokens a reply)")
ttft = {name: {t: [] for t in range(1, turns + 1)} for name, _ in servers}
cached_seen = {name: [] for name, _ in servers}
for ci in range(convs):
    history = {name: [{"role": "system", "content": system_prompt(ci + 1)}] for name, _ in servers}
    for t in range(1, turns + 1):
        for name, port in servers:
            history[name].append({"role": "user",
                                  "content": f"Question {t}: what happens next by the river?"})
            s, text, prompt, cached = chat(port, history[name], 32)
            if s is None:
                sys.exit(f"{name}: turn {t} of conversation {ci} gave no text (see its log)")
            ttft[name][t].append(s)
            if t > 1 and cached is not None:
                cached_seen[name].append((prompt, cached))
            history[name].append({"role": "assistant", "content": text})
print("   turn  " + "  ".join(f"{name:>14}" for name, _ in servers))
for t in range(1, turns + 1):
    print(f"   {t:4d}  " + "  ".join(f"{statistics.median(ttft[name][t]) * 1000:11.1f} ms"
                                     for name, _ in servers))
later = {name: statistics.median([x for t in range(2, turns + 1) for x in ttft[name][t]])
         for name, _ in servers}
for name, _ in servers:
    c = cached_seen[name]
    extra = (f"; cached_tokens {sum(k for _, k in c)} of {sum(p for p, _ in c)} prompt tokens"
             if c and all(k is not None for _, k in c) else "")
    print(f"   {name}: turns 2..{turns} median {later[name] * 1000:.1f} ms{extra}")
if have_ls:
    print(f"   ratio spillway / llama-server, turns 2..{turns}: "
          f"{later['spillway'] / later['llama-server']:.2f}x (goal: at most 1.0x)")

# ---- 2. 8 chats sharing a system prompt -----------------------------------
print("2. 8 chats at once sharing one system prompt, 3 turns of 48 tokens each")
def client(port, i, out, shared):
    msgs = [{"role": "system", "content": shared}]
    n = 0
    for t in range(3):
        msgs.append({"role": "user", "content": f"Chat {i}, turn {t}: tell me about the mill."})
        _, text, _, _ = chat(port, msgs, 48)
        msgs.append({"role": "assistant", "content": text})
        n += 48
    out[i] = n
results = {name: [] for name, _ in servers}
for rnd in range(rounds):
    shared = system_prompt(99 + rnd)  # a new one each round: no server has it yet
    for name, port in servers:
        out = [0] * 8
        th = [threading.Thread(target=client, args=(port, i, out, shared)) for i in range(8)]
        t0 = time.monotonic()
        for x in th: x.start()
        for x in th: x.join()
        results[name].append(sum(out) / (time.monotonic() - t0))
for name, _ in servers:
    print(f"   {name}: {max(results[name]):.1f} tok/s (best of {rounds}; all: "
          + ", ".join(f"{v:.1f}" for v in results[name]) + ")")
if have_ls:
    print(f"   ratio spillway / llama-server: "
          f"{max(results['spillway']) / max(results['llama-server']):.2f}x (goal: at least 1.0x)")
EOF

echo "3. sequences of 2048 tokens that fit on a 256 MiB sim-gpu (model plan)"
f16=0
for kv in f16 q8_0 q4_0; do
  n=$("$bin" model plan -m "$model" --device "sim-gpu:bench-prefix-$$" --sim-capacity 256MiB \
      --ctx 2048 --kv-type "$kv" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_seqs"])')
  [ "$kv" = f16 ] && f16=$n
  python3 -c "import sys; n, f = int(sys.argv[2]), int(sys.argv[3]); print(f'   {sys.argv[1]:5s} {n:4d} sequences' + (f' ({n / f:.2f}x f16)' if f else ''))" "$kv" "$n" "$f16"
done
