#!/usr/bin/env bash
# gpu-check.sh - the one script that proves the cuda:N device on a real
# NVIDIA GPU. CI has no GPU; this runs where one is lent.
#
# 1. Here, on the machine without a GPU, once per checkout:
#        scripts/gpu-check.sh --prepare
#    copies ../shared (models, goldens) into .gpu-check/shared and downloads
#    the .deb packages of the build's libraries (jansson, cmocka, libevent,
#    inih, sqlite, pkgconf) into .gpu-check/debs with apt-get download: the
#    GPU machine is bare and reaches no registry, and ../shared does not
#    travel. .gpu-check/ is added to .git/info/exclude.
# 2. On the GPU machine (the device tool: command "scripts/gpu-check.sh",
#    carry [".gpu-check"], timeout_s 480):
#        scripts/gpu-check.sh
#    The steps share a budget of GPU_CHECK_BUDGET seconds (default 360:
#    with the machine's start, 15 minutes of device time then still hold a
#    second, partial run, e.g. GPU_CHECK_BUILD=build-gpu GPU_CHECK_STEPS=...
#    on the warm machine, whose ignored build-gpu/ is kept between calls):
#    each step's time-out is cut to what is left, and the least telling
#    step, the whole existing suite (ctest), runs last with whatever
#    remains (it is built only then). Everything goes under $OUT (at most 8
#    files): summary.txt (the verdict step by step, then the machine),
#    build.log, test_cuda.log, ctest.log, worker.log, drill.log,
#    profiles.log (the table) and profiles.json. summary.txt is written as
#    each step ends, so a run cut short still says how far it got.
#
# What it checks, in this order:
#   build      CMake Release with -DSPILLWAY_CUDA=ON (sm_90 + PTX): the
#              library, the binary and test_cuda (the other tests are built
#              before ctest);
#   test_cuda  per-operation parity with the CPU (matvec of F32, F16, BF16,
#              Q8_0, Q4_0, Q4_K, Q5_K, Q6_K; dequantization; RMSNorm; RoPE
#              normal and NeoX; SwiGLU; residual and bias adds; KV store
#              layout and attention, f16 and f32 KV), stories260K greedy
#              goldens on cuda:0 (full and split profiles, both KV types),
#              prefill / decode / batched logits against a CPU context, the
#              chunked dequantize + cuBLAS prefill of a Q8_0 model against
#              token-by-token decoding, a Q3_K model refused on cuda:0
#              (no kernel for it), and a too-large cudaMalloc giving
#              SW_EDEVOOM with the GPU still usable (its host-only checks
#              of the kernels' element code run here too);
#   memcheck   the per-kernel parity tests again under compute-sanitizer's
#              memcheck (after a test_cuda failure the whole-model ones
#              too): out-of-bounds or misaligned accesses that the parity
#              figures cannot see; SKIP where the tool cannot run;
#   worker     `spillway worker --device cuda:0` and a CPU worker give the
#              same stories260K greedy token ids through the HTTP API;
#   drill      a router with a cuda:0 worker (policy grow, no reserve) and a
#              CPU worker: a request served on the GPU; then `spillway hog
#              --device cuda:0 --leave 8MiB` takes all the other VRAM, and a
#              long request admitted to the GPU (the router's view of its
#              memory is stale on purpose) runs out of KV memory during
#              decode: the worker answers the typed out_of_memory error, the
#              router replays the request on the CPU worker (200 from cpu, a
#              failover event with kind oom); the GPU worker is up again
#              once the hog exits; a hog above the whole VRAM exits 3 with
#              the out-of-memory message;
#   profiles   `spillway bench profiles --device cuda:0` on the 1b shape
#              (Q4_0): full GPU, split and CPU workers, when that command
#              exists in this tree; it prints the figures;
#   ctest      the whole existing suite in the CUDA build (cpu and sim-gpu
#              devices; nothing there may change when CUDA is compiled in),
#              with the time that is left.
#
# For trying the script itself: GPU_CHECK_STEPS (default "build test_cuda
# memcheck ctest worker drill profiles") picks steps, GPU_CHECK_BUILD=DIR uses a tree
# already built instead of building, GPU_CHECK_DEVICE=sim-gpu:NAME runs the
# worker and drill steps on a simulated GPU, GPU_CHECK_PROFILES_MODEL=FILE
# benches another model.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREP=$ROOT/.gpu-check
cd "$ROOT"

# ---- --prepare (here) --------------------------------------------------------
DEBS="libjansson4 libjansson-dev libcmocka0 libcmocka-dev libevent-2.1-7 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libevent-dev libsqlite3-0 libsqlite3-dev libinih1 libinireader0
      libinih-dev pkgconf-bin libpkgconf3"
if [ "${1:-}" = "--prepare" ]; then
    set -e
    shared=${SPILLWAY_SHARED:-$ROOT/../shared}
    mkdir -p "$PREP/debs" "$PREP/shared"
    grep -qx '/.gpu-check/' .git/info/exclude 2>/dev/null || echo '/.gpu-check/' >> .git/info/exclude
    cp -R "$shared"/. "$PREP/shared/"
    (cd "$PREP/debs" && apt-get download $DEBS)
    du -sh "$PREP"
    echo "gpu-check: prepared; on the GPU machine run scripts/gpu-check.sh with carry [\".gpu-check\"]"
    exit 0
fi

# ---- on the GPU machine ----------------------------------------------------------
B=${GPU_CHECK_BUILD:-$ROOT/build-gpu}
case $B in /*) ;; *) B=$ROOT/$B ;; esac # SPILLWAY_BIN is read from other directories
OUT=${OUT:-$ROOT/build-gpu-check-out}   # $OUT is set on the device machine
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
JOBS=$(nproc)
STEPS=" ${GPU_CHECK_STEPS:-build test_cuda memcheck ctest worker drill profiles} "
want() { case $STEPS in *" $1 "*) return 0 ;; esac; return 1; }
W=$(mktemp -d /tmp/gpu-check.XXXXXX)
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-360}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# cap N: N seconds, or what is left of the budget if that is less (>= 5).
cap() {
    local l
    l=$(left)
    if [ "$1" -lt "$l" ]; then echo "$1"; elif [ "$l" -gt 5 ]; then echo "$l"; else echo 5; fi
}
failed=0
pids=()

say() { echo "$*" | tee -a "$SUMMARY"; }
verdict() { # name ok|FAIL|SKIP detail
    say "$(printf '%-10s %-4s %s  (t+%ds)' "$1" "$2" "$3" $(( $(date +%s) - T0 )))"
    [ "$2" = FAIL ] && failed=1
    return 0
}
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    { echo; echo "---- machine"; cat "$W/env.txt"; } >> "$SUMMARY" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT

if [ -d "$PREP/shared" ]; then export SPILLWAY_SHARED=$PREP/shared; else export SPILLWAY_SHARED=$ROOT/../shared; fi

# nvcc off the PATH: CMakeLists.txt tries /usr/local/cuda/bin/nvcc; a
# versioned toolkit folder is found here (CUDACXX is what CMake reads).
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    for c in /usr/local/cuda-*/bin/nvcc; do [ -x "$c" ] && export CUDACXX=$c; done
fi
NVCC=$(command -v nvcc || echo "${CUDACXX:-/usr/local/cuda/bin/nvcc}")
{
    date -u
    nvidia-smi 2>&1 | head -20
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,memory.used \
        --format=csv 2>&1
    echo "other processes on the GPU:"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
    echo "nvcc: $NVCC"
    "$NVCC" --version 2>&1 | tail -2
    echo "toolkit: $(ls -d /usr/local/cuda* 2>&1 | tr '\n' ' ')"
    echo "cublas/cudart: $(ls "$(dirname "$NVCC")"/../lib64/ 2>&1 |
        grep -E '^lib(cublas|cudart)\.so\.[0-9]+$' | tr '\n' ' ')"
    echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING-unset}" \
        "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
    echo "compute-sanitizer: $(command -v compute-sanitizer ||
        ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)"
    gcc --version 2>&1 | head -1
    cmake --version 2>&1 | head -1
    uname -a
    echo "cores: $JOBS"
} > "$W/env.txt"

# ---- libraries: the system's, or the carried packages unpacked in /tmp ----------
CMAKE_EXTRA=()
if ! pkg-config --exists jansson cmocka libevent inih sqlite3 2>/dev/null; then
    D=/tmp/gpu-check-deps
    if ls "$PREP"/debs/*.deb >/dev/null 2>&1; then
        mkdir -p "$D"
        for f in "$PREP"/debs/*.deb; do
            if command -v dpkg-deb >/dev/null; then
                dpkg-deb -x "$f" "$D"
            else
                (cd "$W" && ar x "$f" && tar -xf data.tar.* -C "$D" && rm -f data.tar.* control.tar.* debian-binary)
            fi
        done
        export PKG_CONFIG_SYSROOT_DIR=$D
        export PKG_CONFIG_LIBDIR=$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/share/pkgconfig
        export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        pc=$(command -v pkg-config || command -v pkgconf || echo "$D/usr/bin/pkgconf")
        CMAKE_EXTRA+=(-DPKG_CONFIG_EXECUTABLE="$pc")
        echo "libraries: carried packages unpacked in $D (pkg-config: $pc)" >> "$W/env.txt"
    else
        echo "libraries: missing and no .gpu-check/debs (run --prepare where a registry is reachable)" >> "$W/env.txt"
    fi
fi

# ---- build ------------------------------------------------------------------------
say "gpu-check: $(nvidia-smi -L 2>/dev/null | head -1)"
if ! want build; then
    verdict build SKIP "using $B"
elif cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_CUDA=ON \
        -DSPILLWAY_SHARED_DIR="$SPILLWAY_SHARED" "${CMAKE_EXTRA[@]}" \
        > "$OUT/build.log" 2>&1 &&
   cmake --build "$B" -j"$JOBS" --target spillway test_cuda >> "$OUT/build.log" 2>&1; then
    verdict build ok "CUDA Release build of spillway and test_cuda, $(grep -c 'Building' "$OUT/build.log") objects"
else
    verdict build FAIL "see build.log"
    tail -40 "$OUT/build.log" >> "$SUMMARY"
    exit 1
fi
SW=$B/spillway
export SPILLWAY_BIN=$SW SPILLWAY_TEST_TMP=$B/test-tmp

# ---- test_cuda ------------------------------------------------------------------------
if ! want test_cuda; then
    verdict test_cuda SKIP "not asked"
elif timeout "$(cap 150)" "$B/test_cuda" > "$OUT/test_cuda.log" 2>&1; then
    if grep -q SKIPPED "$OUT/test_cuda.log"; then
        verdict test_cuda FAIL "tests skipped on a GPU machine (see test_cuda.log)"
    else
        verdict test_cuda ok "$(grep 'relative error' "$OUT/test_cuda.log" | grep -vc '^  host ') GPU parity figures ($(grep -c '^  host ' "$OUT/test_cuda.log") host-twin ones), goldens matched"
    fi
else
    st=$?
    verdict test_cuda FAIL "exit $st$([ $st = 124 ] && echo ' (timed out)'), see test_cuda.log"
    # The first failures with their mismatching elements (test_cuda prints
    # the worst ones and the first few beyond the tolerance).
    grep -E -B1 -A10 '^\[  (ERROR|FAILED)|FAILED  \]' "$OUT/test_cuda.log" | head -40 |
        sed 's/^/    /' >> "$SUMMARY"
fi
# The GPU's figures (the host twins' ones, the same on every machine, stay
# in test_cuda.log).
grep -E "relative error|greedy goldens|out of memory" "$OUT/test_cuda.log" 2>/dev/null |
    grep -v '^  host ' |
    sed 's/^/    /' >> "$SUMMARY"

# ---- memcheck: the per-kernel tests under compute-sanitizer --------------------------
# An out-of-bounds access that happens to read memory the process owns
# passes every parity figure; memcheck names it (kernel, thread, address).
# After a test_cuda failure the whole-model tests are added. Output goes at
# the end of test_cuda.log ($OUT holds 8 files at most).
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
MC_TESTS=test_matvec_parity,test_elementwise_parity,test_rope_parity,test_kv_attention_parity
if ! want memcheck; then
    verdict memcheck SKIP "not asked"
elif [ -z "$CS" ] || [ ! -x "$CS" ]; then
    verdict memcheck SKIP "no compute-sanitizer on this machine"
elif [ "$(left)" -lt 150 ]; then
    verdict memcheck SKIP "$(left) s of the budget left"
else
    grep -q '^test_cuda  FAIL' "$SUMMARY" && MC_TESTS=$MC_TESTS,test_logits_parity,test_gemm_chunks
    {
        echo
        echo "==== compute-sanitizer --tool memcheck, TEST_CUDA_FILTER=$MC_TESTS"
        TEST_CUDA_FILTER=$MC_TESTS timeout "$(cap 90)" "$CS" --tool memcheck --print-limit 20 \
            --error-exitcode 9 "$B/test_cuda" 2>&1
        echo "==== compute-sanitizer exit: $?"
    } >> "$OUT/test_cuda.log"
    mc=$(sed -n '/^==== compute-sanitizer --tool memcheck/,$p' "$OUT/test_cuda.log")
    mc_st=$(echo "$mc" | sed -n 's/^==== compute-sanitizer exit: //p' | tail -1)
    if [ "$mc_st" = 124 ]; then
        verdict memcheck CUT "timed out (see the end of test_cuda.log)"
    elif echo "$mc" | grep -q 'ERROR SUMMARY: 0 errors'; then
        # (a test failing its figures exits non-zero here too: test_cuda's verdict)
        verdict memcheck ok "no invalid access: $(echo "$mc" | grep -m1 'ERROR SUMMARY' |
            sed 's/^=* *//') (test_cuda exit $mc_st)"
    elif echo "$mc" | grep -q -i 'not supported'; then
        verdict memcheck SKIP "compute-sanitizer cannot run here: $(echo "$mc" | grep -m1 -i 'not supported')"
    else
        verdict memcheck FAIL "exit $mc_st, see the end of test_cuda.log"
        echo "$mc" | grep -E -m 8 '^========= (Invalid|Program hit|    at |ERROR SUMMARY)|^\[  (ERROR|FAILED)' |
            sed 's/^/    /' >> "$SUMMARY"
    fi
fi

# ---- the out-of-memory drill ---------------------------------------------------------------
# GPU_CHECK_DEVICE=sim-gpu:NAME runs the same drill on a simulated GPU (how
# the script itself was tried on a machine without one).
GPU_DEV=${GPU_CHECK_DEVICE:-cuda:0}
# HTTP and JSON with python3 (a bare machine may have no curl).
cat > "$W/h.py" <<'PY'
import json, sys, urllib.request, urllib.error
def call(method, url, body=None):
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=90)
        return r.status, r.headers, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode(errors="replace")
    except Exception as e:
        return 0, {}, str(e)
cmd = sys.argv[1]
if cmd == "req":            # req METHOD URL [BODY]: "STATUS WORKER BODY"
    st, h, body = call(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    print(st, h.get("X-Spillway-Worker", "-") if h else "-", body[:1500].replace("\n", " "))
elif cmd == "ready":        # ready URL NAME: exit 0 when worker NAME is ready
    st, h, body = call("GET", sys.argv[2])
    try:
        ws = json.loads(body).get("workers", [])
    except Exception:
        sys.exit(1)
    sys.exit(0 if any(w.get("name") == sys.argv[3] and w.get("state") == "ready" for w in ws)
             else 1)
elif cmd == "ids":          # ids URL BODY: the completion's token ids
    st, h, body = call("POST", sys.argv[2], sys.argv[3])
    try:
        print(st, " ".join(map(str, json.loads(body)["spillway"]["token_ids"])))
    except Exception:
        print(st, body[:300].replace("\n", " "))
elif cmd == "failover":     # failover URL: exit 0 when an oom on gpu was replayed on cpu
    st, h, body = call("GET", sys.argv[2])
    print(body[:3000])
    ev = json.loads(body).get("data", [])
    ok = any((e.get("first_error") or {}).get("kind") == "oom" and
             (e.get("first_error") or {}).get("worker") == "gpu" and
             e.get("replay_worker") == "cpu" and e.get("outcome") == "completed" for e in ev)
    sys.exit(0 if ok else 1)
PY
h() { python3 "$W/h.py" "$@"; }
# A simulated pool outlives its processes: each step removes its name.
SIM_CAPACITY=1GiB
sim_unlink() {
    case $GPU_DEV in
        sim-gpu:*) "$SW" hog --device "$GPU_DEV" --bytes 100TiB --unlink > /dev/null 2>&1 ;;
    esac
    return 0
}

wait_ready() { # URL NAME SECONDS
    local i
    for i in $(seq 1 $(( $3 * 2 ))); do h ready "$1" "$2" && return 0; sleep 0.5; done
    return 1
}

# The worker on cuda:0 against a CPU worker: stories260K, greedy, through
# the HTTP API (prefill chunks, continuous batching), token ids equal.
worker_parity() {
    local model=$SPILLWAY_SHARED/models/stories260K.gguf gpu cpu a b ok=0 i extra=()
    case $GPU_DEV in sim-gpu:*) extra=(--sim-capacity $SIM_CAPACITY) ;; esac
    local body='{"prompt":"Once upon a time, in a small town,","max_tokens":48,"temperature":0,"ignore_eos":true}'
    "$SW" worker -m "$model" --listen 18461 --device "$GPU_DEV" "${extra[@]}" \
        > "$W/wgpu.log" 2>&1 &
    gpu=$!
    pids+=("$gpu")
    "$SW" worker -m "$model" --listen 18462 --device cpu > "$W/wcpu.log" 2>&1 &
    cpu=$!
    pids+=("$cpu")
    for i in $(seq 1 60); do
        h req GET http://127.0.0.1:18461/health | grep -q '^200' &&
            h req GET http://127.0.0.1:18462/health | grep -q '^200' && break
        sleep 0.5
    done
    h req GET http://127.0.0.1:18461/health
    a=$(h ids http://127.0.0.1:18461/v1/completions "$body")
    b=$(h ids http://127.0.0.1:18462/v1/completions "$body")
    echo "gpu: $a"
    echo "cpu: $b"
    [ "${a%% *}" = 200 ] && [ "$a" = "$b" ] || { echo "FAIL: token ids differ"; ok=1; }
    kill "$gpu" "$cpu"
    wait "$gpu" "$cpu"
    sim_unlink
    echo "--- gpu worker log"; tail -20 "$W/wgpu.log"
    return $ok
}

drill() {
    local port=18473 model=$W/drill.gguf cfg=$W/drill.ini r hog serve ok=0 st
    local base=http://127.0.0.1:$port sim_line=""
    case $GPU_DEV in sim-gpu:*) sim_line="sim-capacity = $SIM_CAPACITY" ;; esac
    # KV of 32 KiB per token (8 layers x 1024 wide, f16) and 60 MB of Q8_0
    # weights: 8 MiB of device memory holds about 250 tokens of KV.
    "$SW" model make -o "$model" --dim 1024 --layers 8 --heads 16 --kv-heads 16 --ffn 1024 \
        --vocab 2048 --type q8_0 --seed 7 || return 1
    {
        echo "[server]"
        echo "listen = 127.0.0.1:$port"
        echo "state-dir = $W/state"
        echo "; polled at start only (and while a worker is not ready): the router keeps"
        echo "; believing the GPU is empty after the hog takes it, so the long request"
        echo "; is admitted there and fails there, during decode"
        echo "health-interval-ms = 600000"
        echo "hang-timeout-ms = 3600000"
        echo "[model]"
        echo "path = $model"
        echo "[worker gpu]"
        echo "device = $GPU_DEV"
        echo "$sim_line"
        echo "gpu-layers = -1"
        echo "ctx-limit = 2048"
        echo "max-seqs = 2"
        echo "policy = grow"
        echo "reserve = 0"
        echo "[worker cpu]"
        echo "device = cpu"
        echo "ctx-limit = 2048"
        echo "max-seqs = 2"
    } > "$cfg"
    "$SW" serve --config "$cfg" > "$W/serve.log" 2>&1 &
    serve=$!
    pids+=("$serve")
    wait_ready "$base/health" gpu 60 || { echo "FAIL: the gpu worker did not start"; ok=1; }
    r=$(h req POST "$base/v1/completions" '{"prompt":"Once upon a time","max_tokens":16,"temperature":0}')
    echo "small request: ${r:0:300}"
    set -- $r
    [ "${1:-}" = 200 ] && [ "${2:-}" = gpu ] ||
        { echo "FAIL: the small request was not served by gpu"; ok=1; }

    if [ $ok = 0 ]; then
        # One cudaMalloc of nearly all the free VRAM can be refused for the
        # driver's own bookkeeping: then again leaving 16 MiB (still under
        # the ~22 MiB of KV the long request needs).
        for leave in 8MiB 16MiB; do
            "$SW" hog --device "$GPU_DEV" --leave $leave > "$W/hog.out" 2>&1 &
            hog=$!
            pids+=("$hog")
            for _ in $(seq 1 60); do
                grep -q '^hog: holding' "$W/hog.out" && break
                kill -0 "$hog" 2>/dev/null || break
                sleep 0.5
            done
            echo "hog --leave $leave:"
            cat "$W/hog.out"
            grep -q '^hog: holding' "$W/hog.out" && break
            kill "$hog" 2>/dev/null
            wait "$hog" 2>/dev/null
        done
        grep -q '^hog: holding' "$W/hog.out" || { echo "FAIL: hog did not take the memory"; ok=1; }
    fi
    if [ $ok = 0 ]; then
        r=$(h req POST "$base/v1/completions" \
            '{"prompt":"Once upon a time","max_tokens":700,"temperature":0,"ignore_eos":true}')
        echo "oversized request: ${r:0:300}"
        set -- $r
        [ "${1:-}" = 200 ] && [ "${2:-}" = cpu ] ||
            { echo "FAIL: expected 200 from cpu after the gpu ran out of memory"; ok=1; }
        h failover "$base/v1/spillway/events" ||
            { echo "FAIL: no failover event: oom on gpu, replayed on cpu, completed"; ok=1; }
        echo "--- the gpu worker's out-of-memory lines"
        grep -h -i "out of memory\|out_of_memory" "$W"/state/gpu*.log | head -5

        # More than the whole device: the typed refusal, exit 3.
        "$SW" hog --device "$GPU_DEV" --bytes 100TiB > "$W/hog2.out" 2>&1
        st=$?
        echo "hog of 100 TiB: exit $st: $(cat "$W/hog2.out")"
        [ $st = 3 ] || { echo "FAIL: expected exit 3"; ok=1; }

        kill "$hog"
        wait "$hog"
        # The router restarts a worker that ran out of memory during
        # generation; with the memory back it must be ready again.
        if wait_ready "$base/health" gpu 45; then echo "gpu worker ready again"
        else echo "FAIL: the gpu worker did not come back"; ok=1; fi
    fi
    kill "$serve"
    wait "$serve"
    sim_unlink
    echo "--- router log"; tail -30 "$W/serve.log"
    echo "--- gpu worker log"; tail -30 "$W/state/gpu.log" 2>/dev/null
    return $ok
}
if ! want worker; then
    verdict worker SKIP "not asked"
elif worker_parity > "$OUT/worker.log" 2>&1; then
    verdict worker ok "stories260K greedy through the worker API: $GPU_DEV = cpu, token for token"
else
    verdict worker FAIL "see worker.log"
    grep -E -m 8 "FAIL|^gpu:|^cpu:|error|failed" "$OUT/worker.log" | sed 's/^/    /' >> "$SUMMARY"
fi
if ! want drill; then
    verdict drill SKIP "not asked"
elif drill > "$OUT/drill.log" 2>&1; then
    verdict drill ok "typed OOM on $GPU_DEV during decode, replayed on cpu, gpu worker recovered"
else
    verdict drill FAIL "see drill.log"
    grep FAIL "$OUT/drill.log" | sed 's/^/    /' >> "$SUMMARY"
fi

# ---- bench profiles (when it exists) -------------------------------------------------------
help=$("$SW" bench profiles --help 2>&1)
if ! want profiles; then
    verdict profiles SKIP "not asked"
elif [ -z "$help" ] || echo "$help" | grep -q "not built yet"; then
    verdict profiles SKIP "spillway bench profiles is not in this tree yet"
    echo "$help" > "$OUT/profiles.log"
else
    # GPU_CHECK_PROFILES_MODEL=FILE uses another model (trying the script).
    pmodel=${GPU_CHECK_PROFILES_MODEL:-$W/1b.gguf}
    # On a simulated GPU the bench makes a pool of its own (it passes
    # --sim-capacity to its workers only then); on cuda:N it is --device.
    pextra=(--device "$GPU_DEV")
    case $GPU_DEV in sim-gpu:*) pextra=(--sim-capacity $SIM_CAPACITY) ;; esac
    {
        [ -f "$pmodel" ] || "$SW" model make --preset 1b --type q4_0 -o "$pmodel" &&
        timeout "$(cap 200)" "$SW" bench profiles --model "$pmodel" "${pextra[@]}" \
            --threads "$JOBS" --out "$W/profiles"
    } > "$OUT/profiles.log" 2>&1
    st=$?
    sim_unlink
    if [ $st = 0 ]; then
        cp "$W/profiles/profiles.json" "$OUT/" 2>/dev/null
        verdict profiles ok "full GPU / split / CPU figures in profiles.log, profiles.json"
        sed -n '/^profile /,$p' "$OUT/profiles.log" | head -6 | sed 's/^/    /' >> "$SUMMARY"
    else
        verdict profiles FAIL "see profiles.log"
    fi
    for f in "$W"/profiles/*.log; do # the workers' logs go with $W
        [ -f "$f" ] && { echo "--- $f"; tail -15 "$f"; } >> "$OUT/profiles.log"
    done
fi

# ---- the existing suite in the CUDA build, with the time that is left ---------------------
# Cut short by the budget it says CUT (not a failure of the GPU checks).
ctest_step() {
    local st
    timeout "$(cap 150)" cmake --build "$B" -j"$JOBS" >> "$OUT/build.log" 2>&1
    st=$?
    if [ $st = 124 ]; then
        verdict ctest CUT "the budget ran out building the other tests"
        return
    elif [ $st != 0 ]; then
        verdict ctest FAIL "building the other tests failed (see build.log)"
        return
    fi
    (cd "$B" && timeout "$(cap 300)" ctest -j"$JOBS" -E '^test_cuda$' --timeout 120 \
        --output-on-failure) > "$OUT/ctest.log" 2>&1
    st=$?
    if [ $st = 0 ]; then
        verdict ctest ok "$(grep -E 'tests passed' "$OUT/ctest.log")"
    elif [ $st = 124 ]; then
        verdict ctest CUT "the budget ran out after $(grep -c 'Test *#' "$OUT/ctest.log") tests; $(grep -c '\*\*\*Failed' "$OUT/ctest.log") failed before"
        grep -E '\*\*\*Failed' "$OUT/ctest.log" | sed 's/^/    /' >> "$SUMMARY"
    else
        verdict ctest FAIL "$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
        grep -E '\*\*\*Failed|Timeout|Not Run' "$OUT/ctest.log" | sed 's/^/    /' >> "$SUMMARY"
    fi
}
if ! want ctest; then
    verdict ctest SKIP "not asked"
elif [ "$(left)" -lt 90 ]; then
    verdict ctest SKIP "$(left) s of the budget left"
else
    ctest_step
fi

say "gpu-check: $([ $failed = 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - T0 )) s"
exit $failed
