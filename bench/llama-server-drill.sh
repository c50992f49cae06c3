#!/usr/bin/env bash
# `spillway drill` against a llama-server pair (not in `make test`: it
# needs llama.cpp): config/llama-server-pair.ini with its llama-server and
# model filled in, the GPU tier -ngl 99 and the CPU tier -ngl 0 on the
# same GGUF, both run by the drill's routers.
#
#   bench/llama-server-drill.sh [BUILD_DIR]           (default: build)
#   REF_DIR=/work/llamacpp-ref MODEL=FILE OUT=DIR bench/llama-server-drill.sh
#
# llama-server comes from bench/llamacpp-build.sh (REF_DIR; built when
# missing); MODEL defaults to ../shared/models/stories260K.gguf. On a
# llama.cpp build without a GPU backend -ngl 99 is ignored and both tiers
# run on the CPU. Prints the drill's scenarios and its four verdicts (s2
# and s4 run; s1, s3, s5 and s6 are reported as not applicable to
# llama-server workers, with the reason) and exits with the drill's
# status: 0 when every scenario that ran passed. Then `spillway bench
# profiles --llama-server` on the same files (NO_PROFILES=1: not).
set -euo pipefail
. "$(dirname "$0")/llama-server-common.sh"
out=${OUT:-$dir/report}
# the example, with this machine's llama-server and model; one thread
# each (a small machine runs both tiers and the router)
sed -e "s|^path = .*|path = $model|" \
    -e "s|command = llama-server |command = $server |" \
    -e "s|-c 4096|-c 1024 --threads ${THREADS:-1}|" \
    -e "s|^state-dir = .*|state-dir = $dir/state|" \
    "$root/config/llama-server-pair.ini" > "$dir/pair.ini"
echo "llama-server: $server ($("$server" --version 2>&1 | grep -m1 version || echo '?'))"
echo "model: $model"
echo "configuration: $dir/pair.ini"
grep '^command' "$dir/pair.ini" | sed 's/^/  /'
set +e
"$bin" drill --config "$dir/pair.ini" --out "$out" 2>&1 | tee "$dir/drill.log" |
  grep -E '^ *[0-9.]+s \[s[0-9]\] (passed|FAILED|skipped)|^ +(ok  |FAIL) |verdict'
status=${PIPESTATUS[0]}
set -e
echo "drill exit status $status (reports in $out; KEEP=1 keeps $dir)"
# the placement profiles on the same llama-server and model (figures only)
if [ -z "${NO_PROFILES:-}" ]; then
  echo
  "$bin" bench profiles --llama-server "$server" --model "$model" --out "$dir/profiles" \
    --threads "${THREADS:-1}" 2>/dev/null || echo "bench profiles failed" >&2
fi
exit "$status"
