#!/usr/bin/env bash
# newcomer.sh - README.md's quick start, run as a newcomer runs it: its
# commands, read from the README's "Quick start" block, in their order,
# each checked for the result the README promises; then in a second order
# that starts with `make run` stopped before the simulated-GPU commands
# (which use its pool's name), to show that nothing it left behind is in
# their way.
#
#   scripts/newcomer.sh BUILD_DIR        (ctest: newcomer)
#
# What is changed so that it runs beside anything else on the machine,
# and nothing else: the ports (8080, 8090, 8081) are free ones picked
# now, the pools (sim-gpu:demo, :models, :try) and the state directories
# get names of this run's own, `build/` is BUILD_DIR, and small.gguf is
# written in a scratch directory. `make` runs the README's targets with
# PREBUILT=1 (the binary BUILD_DIR has; nothing is installed or compiled)
# and the two configurations rewritten as above. The benchmark lines
# (make bench, bench/...) are not run: they take minutes and print
# figures, they promise none. A line that needs ../shared is skipped
# without it.
#
# Every process it starts is stopped by its id at the end, also on a
# failure; the scratch directory is removed when all passed.
set -uo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: newcomer.sh BUILD_DIR}" && pwd)
bin=$build/spillway
[ -x "$bin" ] || { echo "newcomer: $bin is missing"; exit 1; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/spillway-newcomer.XXXXXX")
tag=nc$$
failures=0
pids=()

log() { echo "newcomer: $*"; }
check() { # check OK WHAT
    if [ "$1" = 0 ]; then echo "  ok   $2"; else echo "  FAIL $2"; failures=$((failures + 1)); fi
}
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill -INT -- "-$p" 2>/dev/null || kill -INT "$p" 2>/dev/null
    done
    sleep 1
    for p in "${pids[@]}"; do
        kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    rm -f /dev/shm/spillway-sim-*-"$tag"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port_run=$(free_port)
port_models=$(free_port)
port_worker=$(free_port)
while [ "$port_models" = "$port_run" ]; do port_models=$(free_port); done
while [ "$port_worker" = "$port_run" ] || [ "$port_worker" = "$port_models" ]; do
    port_worker=$(free_port)
done

# The two configurations, with this run's ports, pools and state.
sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$port_run/" -e "s/sim-gpu:demo/sim-gpu:demo-$tag/" \
    -e "s#^state-dir = .*#state-dir = $scratch/state#" -e "s#= build/#= $build/#" \
    "$src/config/demo.ini" >"$scratch/demo.ini"
sed -e "s/127\.0\.0\.1:8090/127.0.0.1:$port_models/" -e "s/sim-gpu:models/sim-gpu:models-$tag/" \
    -e "s#^state-dir = .*#state-dir = $scratch/state-models#" -e "s#= build/#= $build/#" \
    "$src/config/models.ini" >"$scratch/models.ini"

# The quick start's commands, one a line, without their comments.
mapfile -t commands < <(awk '/^## Quick start/ {q = 1} q && /^```sh/ {b = 1; next}
                             b && /^```/ {exit} b {print}' "$src/README.md" |
                        sed -e 's/[[:space:]]*#[^'"'"'"]*$//' -e '/^[[:space:]]*$/d')
[ "${#commands[@]}" -ge 10 ] || { log "no quick start block in README.md"; exit 1; }

pool_try=try-$tag
# One README line as this run runs it.
localize() {
    local c=$1
    c=${c//localhost:8080/127.0.0.1:$port_run}
    c=${c//localhost:8090/127.0.0.1:$port_models}
    c=${c//localhost:8081/127.0.0.1:$port_worker}
    c=${c//--listen 8081/--listen $port_worker}
    c=${c//sim-gpu:try/sim-gpu:$pool_try}
    c=${c//build\/spillway/$bin}
    c=${c//small.gguf/$scratch/small.gguf}
    c=${c//..\/shared/${SPILLWAY_SHARED:-$src/../shared}}
    c=${c% &}
    case $c in
    make\ *)
        c="make -s -C $src ${c#make } BUILD=$build PREBUILT=1 RUN_CONFIG=$scratch/demo.ini MODELS_CONFIG=$scratch/models.ini"
        ;;
    esac
    printf '%s' "$c"
}

# Starts a long-running line in its own process group (Ctrl-C's target)
# with its output in FILE; its pid (and group) into $started.
start_bg() { # start_bg FILE CMD
    setsid bash -c "exec $2" >"$1" 2>&1 &
    started=$!
    pids+=("$started")
}
wait_for() { # wait_for FILE TEXT SECONDS
    local t=0
    while ! grep -q -- "$2" "$1" 2>/dev/null; do
        sleep 0.2
        t=$((t + 1))
        [ $t -lt $(($3 * 5)) ] || return 1
    done
}
# Ctrl-C to a process group and its exit; its status.
interrupt() { # interrupt PID
    kill -INT -- "-$1" 2>/dev/null
    local t=0
    while kill -0 "$1" 2>/dev/null && [ $t -lt 150 ]; do sleep 0.1; t=$((t + 1)); done
    wait "$1" 2>/dev/null
    local st=$?
    local keep=()
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    pids=("${keep[@]}")
    return $st
}
pool_gone() { [ ! -e "/dev/shm/spillway-sim-$1" ]; }

run_pid=
models_pid=
worker_pid=

# One README line, run and checked by what it is.
step() {
    local line=$1 cmd out rc
    cmd=$(localize "$line")
    out=$scratch/out.$RANDOM
    case $line in
    "make run")
        start_bg "$out" "$cmd"
        run_pid=$started
        wait_for "$out" "listening on 127.0.0.1:$port_run" 60
        check $? "make run: the router listens"
        ! grep -q "Entering directory\|Leaving directory" "$out"
        check $? "make run: no make directory lines"
        [ "$(sed -n '/listening on/q;p' "$out" | wc -l)" -le 12 ]
        check $? "make run: a few lines before the router's ($(sed -n '/listening on/q;p' "$out" | wc -l))"
        ;;
    "make run-models")
        start_bg "$out" "$cmd"
        models_pid=$started
        wait_for "$out" "listening on 127.0.0.1:$port_models" 60
        check $? "make run-models: the router listens (make run $([ -n "$run_pid" ] && echo running || echo stopped))"
        ;;
    *max_tokens\":32*)
        eval "curl -D '$out.h' -o '$out' ${cmd#curl }"
        grep -q '"choices"' "$out" && grep -qi '^X-Spillway-Worker: gpu' "$out.h"
        check $? "a short completion, on the GPU worker"
        ;;
    *max_tokens\":1900*)
        eval "$cmd" >"$out"
        grep -q '^HTTP/1.1 200' "$out" && grep -qi '^X-Spillway-Worker: cpu' "$out"
        check $? "a long completion, on the CPU worker"
        ;;
    *v1/models*)
        eval "$cmd" >"$out"
        grep -q '"demo-small"' "$out" && grep -q '"small"' "$out"
        check $? "/v1/models lists each model and its alias"
        ;;
    "make generate")
        eval "$cmd" >"$out" 2>&1
        rc=$?
        [ $rc = 0 ] && [ -s "$out" ]
        check $? "make generate: 32 tokens"
        ;;
    *"model make"*)
        eval "$cmd" >"$out" 2>&1
        [ $? = 0 ] && [ -s "$scratch/small.gguf" ]
        check $? "model make: small.gguf"
        ;;
    *"model info"*)
        eval "$cmd" >"$out" 2>&1
        [ $? = 0 ] && grep -q "token_embd" "$out"
        check $? "model info: the tensor table"
        ;;
    *stories260K*)
        if [ ! -e "${SPILLWAY_SHARED:-$src/../shared}/models/stories260K.gguf" ]; then
            echo "  skip stories260K.gguf: no ../shared"
            return
        fi
        eval "$cmd" >"$out" 2>&1
        check $? "run stories260K.gguf"
        ;;
    *--json*)
        eval "$cmd" >"$out" 2>/dev/null
        [ $? = 0 ] && python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1]) if l.strip()]' "$out"
        check $? "run --json: JSON records"
        ;;
    *"model plan"*)
        eval "$cmd" >"$out" 2>&1
        rc=$?
        [ $rc = 0 ] && grep -q "fits" "$out"
        check $? "model plan: fits (exit $rc)"
        pool_gone "$pool_try"
        check $? "model plan: created no pool"
        ;;
    *--gpu-layers*)
        eval "$cmd" >"$out" 2>&1
        rc=$?
        check $rc "run --gpu-layers 4 on the simulated GPU (exit $rc$([ $rc = 0 ] || echo ": $(tail -1 "$out")"))"
        pool_gone "$pool_try"
        check $? "run: its pool went with it"
        ;;
    *hog*)
        start_bg "$out" "$cmd"
        local hog=$started
        wait_for "$out" "hog: holding" 30
        check $? "hog: holds 200 MiB"
        interrupt "$hog"
        check $? "hog: Ctrl-C ends it (exit 0)"
        pool_gone "$pool_try"
        check $? "hog: its pool went with it"
        ;;
    *"spillway worker"*)
        start_bg "$out" "$cmd"
        worker_pid=$started
        wait_for "$out" " ready: context" 60
        check $? "worker: listens, its model loaded"
        ;;
    *chat/completions*)
        eval "$cmd" >"$out"
        grep -q '"choices"' "$out"
        check $? "the worker answers a chat"
        ;;
    make\ bench* | bench/*) ;;
    *)
        echo "  FAIL no check for this README line: $line"
        failures=$((failures + 1))
        ;;
    esac
}

stop_all() {
    local what
    for what in worker_pid models_pid run_pid; do
        local p=${!what}
        [ -n "$p" ] || continue
        interrupt "$p"
        printf -v "$what" '%s' ""
    done
    local left
    left=$(cd /dev/shm && ls -d "spillway-sim-demo-$tag" "spillway-sim-models-$tag" 2>/dev/null | tr '\n' ' ')
    [ -z "$left" ]
    check $? "Ctrl-C: the routers' pools went with them${left:+ (left: $left)}"
}

log "README.md's order (ports $port_run, $port_models, $port_worker; pools *-$tag)"
for line in "${commands[@]}"; do
    step "$line"
done
stop_all

log "make run stopped first, then the simulated GPU under its pool's name"
pool_try=demo-$tag
order=("make run" "max_tokens\":32" "STOP" "model make" "model plan" "--gpu-layers" "hog"
       "make run-models" "v1/models" "make generate" "spillway worker" "chat/completions")
for want in "${order[@]}"; do
    if [ "$want" = STOP ]; then
        interrupt "$run_pid"
        run_pid=
        pool_gone "demo-$tag"
        check $? "make run stopped: its pool is gone"
        continue
    fi
    for line in "${commands[@]}"; do
        case $line in *"$want"*) step "$line"; break ;; esac
    done
done
stop_all

if [ $failures -ne 0 ]; then
    log "FAILED ($failures checks; outputs in $scratch)"
    trap - EXIT
    cleanup
    exit 1
fi
rm -rf "$scratch"
log "passed"
