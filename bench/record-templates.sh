#!/usr/bin/env bash
# Records what the real chat templates of the families spillway renders
# make of a fixed set of conversations, with llama.cpp's Jinja engine
# (llama-server --jinja --chat-template-file, POST /apply-template), into
# tests/data/templates/NAME.renders.json, and copies each template's text
# to tests/data/templates/NAME.jinja. test_chat_real_templates detects the
# family from that text and checks spillway's rendering of every recorded
# conversation against the recorded prompt, byte for byte, without
# llama.cpp at test time.
#
#   bench/record-templates.sh [BUILD_DIR]   (default: build; needs the llama.cpp
#                                           that bench/llamacpp-build.sh builds)
#   RECORD_TEMPLATES="Qwen-Qwen3-0.6B" bench/record-templates.sh ...   only those
#
# The templates come from llama.cpp's models/templates (copies of the
# chat_template of each model's Hugging Face repository). The model the
# server loads only has to load: a `model make` preset; the template's
# bos_token and eos_token are set to the family's own texts through
# chat_template_kwargs, so the prompts are those of the real model, and its
# add_bos_token is overridden to false (llama-server cuts a rendered BOS
# that the tokenizer would add again: the preset's "<s>" would vanish from
# Mistral's prompts).
# Dates: the Llama 3.1-3.3 templates print date_string, set to FIXED_DATE
# (as "15 Jan 2026") through chat_template_kwargs; gpt-oss's prints
# strftime_now("%Y-%m-%d"), today's date, which the server cannot fix: the
# server runs in UTC and today's date in "Current date: YYYY-MM-DD" is
# replaced by FIXED_DATE after recording. The test renders with that date
# (the file's "date").
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
ref_bin=$(cd "$("$here/llamacpp-build.sh")" && pwd)
ref_src=$(cd "$ref_bin/../.." && pwd)
templates="$ref_src/models/templates"
out="$here/../tests/data/templates"
work="$build/templates"
mkdir -p "$work" "$out"
FIXED_DATE=2026-01-15
npm_version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
release=$(tar -xzOf "$ref_src/../node-llama-cpp-$npm_version.tgz" package/llama/llama.cpp.info.json |
  jq -r .tag)
port=${RECORD_PORT:-18437}

model="$work/model.gguf"
"$build/spillway" model make --preset qwen3-tiny -o "$model" >/dev/null

# NAME FAMILY BOS EOS: the templates checked, the family spillway must
# detect, the texts of the model's BOS and EOS tokens. Only templates under
# permissive licenses (Apache-2.0, MIT; tests/data/README.md names each)
# are committed: Llama's and Gemma's licenses attach use terms to
# redistribution.
table='
Qwen-Qwen3-0.6B qwen3 - <|im_end|>
Qwen-QwQ-32B qwen3-thinking - <|im_end|>
Qwen-Qwen2.5-7B-Instruct chatml - <|im_end|>
deepseek-ai-DeepSeek-R1-Distill-Qwen-32B deepseek-r1 <｜begin▁of▁sentence｜> <｜end▁of▁sentence｜>
deepseek-ai-DeepSeek-R1-Distill-Llama-8B deepseek-r1 <｜begin▁of▁sentence｜> <｜end▁of▁sentence｜>
openai-gpt-oss-120b harmony <|startoftext|> <|return|>
microsoft-Phi-3.5-mini-instruct phi3 <s> <|endoftext|>
mistralai-Mistral-Nemo-Instruct-2407 mistral <s> </s>
'

# The conversations: every template gets the common ones (the call's id is
# 9 letters and digits, as Mistral's template demands); qwen3 and
# qwen3-thinking also get enable_thinking false, harmony reasoning_effort.
tool='{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
  "required": ["city"]}}}'
common=$(jq -n --argjson tool "$tool" '[
  {name: "user", body: {messages: [{role: "user", content: "What is the capital of France?"}]}},
  {name: "system_user", body: {messages: [
    {role: "system", content: "You are a terse assistant."},
    {role: "user", content: "What is 2+2?"}]}},
  {name: "multi_turn_reasoning", body: {messages: [
    {role: "system", content: "You are a terse assistant."},
    {role: "user", content: "What is 2+2?"},
    {role: "assistant", content: "4.", reasoning_content: "Two plus two is four."},
    {role: "user", content: "And times 3?"}]}},
  {name: "multi_turn_inline_think", body: {messages: [
    {role: "user", content: "What is 2+2?"},
    {role: "assistant", content: "<think>\nTwo plus two is four.\n</think>\n\n4."},
    {role: "user", content: "And times 3?"}]}},
  {name: "tool_call", body: {tools: [$tool], messages: [
    {role: "system", content: "You are a terse assistant."},
    {role: "user", content: "What is the weather in Paris?"},
    {role: "assistant", content: "", tool_calls: [{id: "a1b2c3d4e", type: "function",
      function: {name: "get_weather", arguments: "{\"city\": \"Paris\"}"}}]},
    {role: "tool", tool_call_id: "a1b2c3d4e", content: "{\"temp_c\": 18}"}]}},
  {name: "tool_loop_reasoning", body: {tools: [$tool], messages: [
    {role: "user", content: "Weather in Paris and Oslo?"},
    {role: "assistant", content: "", reasoning_content: "I need both cities.", tool_calls: [
      {id: "a1b2c3d4e", type: "function", function: {name: "get_weather", arguments: "{\"city\": \"Paris\"}"}},
      {id: "f5g6h7i8j", type: "function", function: {name: "get_weather", arguments: "{\"city\": \"Oslo\"}"}}]},
    {role: "tool", tool_call_id: "a1b2c3d4e", content: "18 C"},
    {role: "tool", tool_call_id: "f5g6h7i8j", content: "9 C"}]}},
  {name: "whitespace", body: {messages: [
    {role: "system", content: "  Be brief.\n"},
    {role: "user", content: "\n Hi there  "},
    {role: "assistant", content: " Hello. \n"},
    {role: "user", content: "Bye\n"}]}}
]')
nothink=$(jq -n '[{name: "system_user_no_thinking", body: {
  chat_template_kwargs: {enable_thinking: false}, messages: [
    {role: "system", content: "You are a terse assistant."},
    {role: "user", content: "What is 2+2?"}]}}]')
effort=$(jq -n '[{name: "system_user_effort_high", body: {reasoning_effort: "high", messages: [
    {role: "system", content: "You are a terse assistant."},
    {role: "user", content: "What is 2+2?"}]}}]')

server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  server_pid=
}
trap stop_server EXIT

while read -r name family bos eos; do
  [ -n "$name" ] || continue
  case " ${RECORD_TEMPLATES:-$name} " in *" $name "*) ;; *) continue ;; esac
  cp "$templates/$name.jinja" "$out/$name.jinja"
  cases=$common
  case $family in
    qwen3 | qwen3-thinking) cases=$(jq -n --argjson a "$cases" --argjson b "$nothink" '$a + $b') ;;
    harmony) cases=$(jq -n --argjson a "$cases" --argjson b "$effort" '$a + $b') ;;
  esac
  [ "$bos" = - ] && bos=
  kwargs=$(jq -n --arg b "$bos" --arg e "$eos" --arg d "$(LC_ALL=C date -d "$FIXED_DATE" '+%d %b %Y')" \
    '{bos_token: $b, eos_token: $e, date_string: $d}')
  TZ=UTC "$ref_bin/llama-server" -m "$model" --jinja --chat-template-file "$templates/$name.jinja" \
    --override-kv tokenizer.ggml.add_bos_token=bool:false \
    --port "$port" --host 127.0.0.1 -c 256 -t 1 --no-warmup >"$work/$name.server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  today=$(date -u +%Y-%m-%d)
  recorded='[]'
  n=$(jq length <<<"$cases")
  for i in $(seq 0 $((n - 1))); do
    c=$(jq ".[$i]" <<<"$cases")
    # the kwargs of the case (enable_thinking) win over the BOS/EOS/date ones
    body=$(jq --argjson k "$kwargs" '.body | .chat_template_kwargs = ($k + (.chat_template_kwargs // {}))' <<<"$c")
    resp=$(curl -s "http://127.0.0.1:$port/apply-template" -H 'Content-Type: application/json' -d "$body")
    # a template that refuses the conversation (raise_exception) is
    # recorded as its error message: the test checks that case by hand
    if prompt=$(jq -e '.prompt' <<<"$resp" 2>/dev/null); then
      recorded=$(jq --argjson c "$c" --argjson p "$prompt" --arg t "Current date: $today" \
        --arg f "Current date: $FIXED_DATE" '. + [$c + {prompt: ($p | gsub($t; $f))}]' <<<"$recorded")
    elif err=$(jq -e '.error.message' <<<"$resp" 2>/dev/null); then
      recorded=$(jq --argjson c "$c" --argjson e "$err" '. + [$c + {error: $e}]' <<<"$recorded")
    else
      echo "record-templates: $name: $(jq -c .name <<<"$c"): $resp" >&2
      exit 1
    fi
  done
  stop_server
  jq -n --indent 1 --arg n "$name" --arg f "$family" --arg d "$FIXED_DATE" --argjson c "$recorded" \
    --arg r "llama.cpp $release llama-server --jinja, POST /apply-template" \
    '{template: ($n + ".jinja"), family: $f, recorded_with: $r, date: $d, cases: $c}' \
    >"$out/$name.renders.json"
  echo "record-templates: tests/data/templates/$name.renders.json ($n conversations)"
done <<<"$table"
