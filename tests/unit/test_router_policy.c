/* test_router_policy.c - the router's decisions as tables, without sockets
 * or processes: the routing policy, the failover decision and the
 * admission queue, linked directly from spillway_core.
 *
 * 1. The policy (router_policy.h): rt_policy_decide over hand-built pool
 *    views. Each row is a view (in preference order), a need and a tried
 *    set, and the expected worker, what it reserves, the reason each worker
 *    was passed over (reason[], by rt_pool.w index), their union, the best
 *    prediction and whether the choice was the no-rates fallback. Rows
 *    cover every skip reason and the order they are checked in, the
 *    preference order, the deadline (exact boundary, the predicted wait,
 *    the fallback to a worker without rates only when no worker with rates
 *    is in time), need.idle, an unknown prompt reserving the whole context
 *    (the whole KV budget while the context is unknown too),
 *    max_tokens -1, and memory that is or is not counted.
 *    rt_policy_kv_bytes: whole blocks, rounded up; of a sliding-window
 *    model's local layers no more than their window's blocks.
 * 2. The failover decision (router_failover.h): every row of DESIGN.md's
 *    "When is a request replayable?" table that is a failover (the deadline
 *    row is the policy's, above), and every input combination that changes
 *    the answer: the outcome, what the client already has, the worker's
 *    kind, server-side tools, single-pass callers and the
 *    SPILLWAY_SABOTAGE switches, with the order they are looked at in.
 * 3. The queue (router_queue.h) over a hand-filled rt_pool: immediate
 *    grants (max_wait_s 0), FULL, NEVER, DEADLINE and TIMEOUT results, the
 *    books taken on a grant and given back by rt_queue_release, the
 *    admission ordinal, Retry-After bounds, and one threaded test: waiters
 *    on an occupied worker are granted in ticket order, one per release,
 *    whatever order they arrived in, and the waiters ahead count in a
 *    deadline's predicted wait.
 *
 * Nothing here asserts on the wall clock: a max_wait_s of 0 times out at
 * once, and the threaded test checks who was granted right after each
 * release (the grant happens inside rt_queue_release, under the lock).
 */
#include "testutil.h"

#include "router/router.h"
#include "router/router_failover.h"
#include "router/router_policy.h"
#include "router/router_pool.h"
#include "router/router_queue.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Mismatches are printed, all of them, and counted; each test asserts the
 * count is 0 at its end (after cleaning up its threads, if any). */
static int g_failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            print_error("%s:%d: ", __FILE__, __LINE__);                                            \
            print_error(__VA_ARGS__);                                                              \
            print_error("\n");                                                                     \
            g_failures++;                                                                          \
        }                                                                                          \
    } while (0)

static bool near(double a, double b) { return a - b < 1e-6 && b - a < 1e-6; }

/* ---- 1. the policy ------------------------------------------------------ */

/* Worker views: ready (or another state), memory counted in blocks of 16
 * tokens of 1 KiB, rates in tokens per second. */
#define RDY(i) .index = (i), .state = WS_READY
#define IN_STATE(i, s) .index = (i), .state = (s)
#define OPENAI .kind = RT_KIND_OPENAI
#define MEM16(budget, reserved)                                                                    \
    .count_memory = true, .block_tokens = 16, .block_bytes = 1024, .kv_budget = (budget),          \
    .kv_reserved = (reserved)
#define RATES(prefill, decode) .prefill_rate = (prefill), .decode_rate = (decode)
#define NODL .deadline_ms = -1
#define NOBEST .best_pred_ms = -1

typedef struct policy_row {
    const char *name;
    int n;
    rt_worker_view w[8]; /* preference order */
    rt_need need;
    bool tried[RT_MAX_WORKERS];
    /* expected */
    int worker;
    int64_t kv_bytes;
    long kv_tokens;
    unsigned skipped;
    unsigned reason[RT_MAX_WORKERS];
    double best_pred_ms;
    bool rates_unknown;
} policy_row;

/* Predictions below: prompt / prefill + generated / decode, in ms, plus
 * need.wait_ms. With rates 1000/100, prompt 100 and max_tokens 50:
 * 100 + 500 = 600 ms. 150 tokens in blocks of 16: 10 blocks, 10240 bytes. */
static const policy_row POLICY_ROWS[] = {
    /* preference order */
    {.name = "the first eligible worker in view order wins",
     .n = 3, .w = {{RDY(0)}, {RDY(1)}, {RDY(2)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    {.name = "preference is the view's order, not the index",
     .n = 3, .w = {{RDY(2)}, {RDY(0)}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 2, .kv_tokens = 150, NOBEST},
    {.name = "a worker after the chosen one is not reached: reason 0",
     .n = 3, .w = {{RDY(0)}, {IN_STATE(1, WS_DOWN)}, {RDY(2), .held = true}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    /* tried */
    {.name = "tried: passed over",
     .n = 2, .w = {{RDY(0)}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL}, .tried = {[0] = true},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_TRIED,
     .reason = {[0] = RT_SKIP_TRIED}, NOBEST},
    {.name = "tried and reason[] are by rt_pool.w index, not view position",
     .n = 3, .w = {{RDY(15)}, {IN_STATE(7, WS_SUSPECT)}, {RDY(3)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL}, .tried = {[15] = true, [0] = true},
     .worker = 3, .kv_tokens = 150, .skipped = RT_SKIP_TRIED | RT_SKIP_DOWN,
     .reason = {[15] = RT_SKIP_TRIED, [7] = RT_SKIP_DOWN}, NOBEST},
    /* down */
    {.name = "down: starting, down and suspect are all not ready",
     .n = 4, .w = {{IN_STATE(0, WS_STARTING)}, {IN_STATE(1, WS_DOWN)},
                   {IN_STATE(2, WS_SUSPECT)}, {RDY(3)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 3, .kv_tokens = 150, .skipped = RT_SKIP_DOWN,
     .reason = {[0] = RT_SKIP_DOWN, [1] = RT_SKIP_DOWN, [2] = RT_SKIP_DOWN}, NOBEST},
    /* kind */
    {.name = "kind: a resume cannot go to a kind=openai worker",
     .n = 2, .w = {{RDY(0), OPENAI}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_KIND,
     .reason = {[0] = RT_SKIP_KIND}, NOBEST},
    /* images: only a worker that takes them (a llama-server with a
     * projector); one not asked yet is judged once it is up */
    {.name = "images: a spillway worker and one without a projector are passed over",
     .n = 3, .w = {{RDY(0), .images = 0}, {RDY(1), .kind = RT_KIND_LLAMA_SERVER, .images = 0},
                   {RDY(2), .kind = RT_KIND_LLAMA_SERVER, .images = 1}},
     .need = {.prompt = 100, .max_tokens = 50, .images = true, NODL},
     .worker = 2, .kv_tokens = 150, .skipped = RT_SKIP_IMAGES,
     .reason = {[0] = RT_SKIP_IMAGES, [1] = RT_SKIP_IMAGES}, NOBEST},
    {.name = "images: none takes them",
     .n = 2, .w = {{RDY(0)}, {RDY(1), .kind = RT_KIND_LLAMA_SERVER, .images = -1}},
     .need = {.prompt = 100, .max_tokens = 50, .images = true, NODL},
     .worker = -1, .skipped = RT_SKIP_IMAGES,
     .reason = {[0] = RT_SKIP_IMAGES, [1] = RT_SKIP_IMAGES}, NOBEST},
    {.name = "images: one not known yet and down is down",
     .n = 1, .w = {{IN_STATE(0, WS_DOWN), .kind = RT_KIND_LLAMA_SERVER, .images = -1}},
     .need = {.prompt = 100, .max_tokens = 50, .images = true, NODL},
     .worker = -1, .skipped = RT_SKIP_DOWN, .reason = {[0] = RT_SKIP_DOWN}, NOBEST},
    {.name = "images: text goes anywhere",
     .n = 2, .w = {{RDY(0)}, {RDY(1), .kind = RT_KIND_LLAMA_SERVER, .images = 1}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    /* remote = never */
    {.name = "remote: remote = never passes over a remote worker",
     .n = 2, .w = {{RDY(0), OPENAI, .remote = true}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .local_only = true, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_REMOTE,
     .reason = {[0] = RT_SKIP_REMOTE}, NOBEST},
    {.name = "remote: remote = never with only a remote worker: none",
     .n = 1, .w = {{RDY(0), OPENAI, .remote = true}},
     .need = {.prompt = 100, .max_tokens = 50, .local_only = true, NODL},
     .worker = -1, .skipped = RT_SKIP_REMOTE, .reason = {[0] = RT_SKIP_REMOTE}, NOBEST},
    {.name = "remote: without remote = never a remote worker is fine",
     .n = 2, .w = {{RDY(0), OPENAI, .remote = true}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    {.name = "kind: without a resume a kind=openai worker is fine",
     .n = 2, .w = {{RDY(0), OPENAI}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    /* kind = llama-server: a resume only where the replay table says
     * another llama-server continues it exactly (resume_ls), and only on
     * one whose vocabulary is the model's */
    {.name = "kind: a greedy resume goes to a llama-server of the model's vocabulary",
     .n = 2, .w = {{RDY(0), .kind = RT_KIND_LLAMA_SERVER, .ls_resumable = true}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, .resume_ls = true, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    {.name = "kind: a resume the replay table keeps off llama-server skips it",
     .n = 2, .w = {{RDY(0), .kind = RT_KIND_LLAMA_SERVER, .ls_resumable = true}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_KIND,
     .reason = {[0] = RT_SKIP_KIND}, NOBEST},
    {.name = "kind: a llama-server of another vocabulary never takes a resume",
     .n = 2, .w = {{RDY(0), .kind = RT_KIND_LLAMA_SERVER}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, .resume_ls = true, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_KIND,
     .reason = {[0] = RT_SKIP_KIND}, NOBEST},
    {.name = "kind: resume_ls does not open kind=openai",
     .n = 2, .w = {{RDY(0), OPENAI, .ls_resumable = true}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, .resume_ls = true, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_KIND,
     .reason = {[0] = RT_SKIP_KIND}, NOBEST},
    {.name = "kind: a resume on a spillway worker is fine",
     .n = 1, .w = {{RDY(0)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    /* context */
    {.name = "ctx: a prompt as long as the context does not fit",
     .n = 2, .w = {{RDY(0), .ctx_limit = 100}, {RDY(1), .ctx_limit = 4096}},
     .need = {.prompt = 100, .max_tokens = 10, NODL},
     .worker = 1, .kv_tokens = 110, .skipped = RT_SKIP_CTX,
     .reason = {[0] = RT_SKIP_CTX}, NOBEST},
    {.name = "ctx: a prompt one short fits; prompt + max_tokens is cut to the context",
     .n = 1, .w = {{RDY(0), .ctx_limit = 100}},
     .need = {.prompt = 99, .max_tokens = 10, NODL},
     .worker = 0, .kv_tokens = 100, NOBEST},
    {.name = "ctx: nothing to generate (embeddings): an input as long as the context fits",
     .n = 1, .w = {{RDY(0), .ctx_limit = 100}},
     .need = {.prompt = 100, .max_tokens = 0, NODL},
     .worker = 0, .kv_tokens = 100, NOBEST},
    {.name = "ctx: nothing to generate, one token over the context: none",
     .n = 1, .w = {{RDY(0), .ctx_limit = 100}},
     .need = {.prompt = 101, .max_tokens = 0, NODL},
     .worker = -1, .skipped = RT_SKIP_CTX, .reason = {[0] = RT_SKIP_CTX}, NOBEST},
    {.name = "ctx: an unknown context (0) is not checked",
     .n = 1, .w = {{RDY(0)}},
     .need = {.prompt = 100000, .max_tokens = 10, NODL},
     .worker = 0, .kv_tokens = 100010, NOBEST},
    /* held */
    {.name = "held: refused since its last /health",
     .n = 2, .w = {{RDY(0), .held = true}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_HELD,
     .reason = {[0] = RT_SKIP_HELD}, NOBEST},
    /* slots */
    {.name = "slots: every sequence the books allow is taken",
     .n = 2, .w = {{RDY(0), .max_seqs = 2, .seqs = 2}, {RDY(1), .max_seqs = 2, .seqs = 1}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_SLOTS,
     .reason = {[0] = RT_SKIP_SLOTS}, NOBEST},
    {.name = "slots: max_seqs 0 is no limit",
     .n = 1, .w = {{RDY(0), .seqs = 99}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    /* memory */
    {.name = "mem: a need of exactly the budget fits (10 blocks)",
     .n = 1, .w = {{RDY(0), MEM16(10240, 0)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_bytes = 10240, .kv_tokens = 150, NOBEST},
    {.name = "mem: the reserved bytes count: one byte short",
     .n = 2, .w = {{RDY(0), MEM16(20480, 10241)}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 1, .kv_bytes = 0, .kv_tokens = 150, .skipped = RT_SKIP_MEM,
     .reason = {[0] = RT_SKIP_MEM}, NOBEST},
    {.name = "mem: one token over 10 blocks is 11 blocks (161 tokens)",
     .n = 2, .w = {{RDY(0), MEM16(10240, 0)}, {RDY(1), MEM16(11264, 0)}},
     .need = {.prompt = 111, .max_tokens = 50, NODL},
     .worker = 1, .kv_bytes = 11264, .kv_tokens = 161, .skipped = RT_SKIP_MEM,
     .reason = {[0] = RT_SKIP_MEM}, NOBEST},
    {.name = "mem: not counted (count_memory false) never skips, reserves 0",
     .n = 1, .w = {{RDY(0), .block_tokens = 16, .block_bytes = 1024, .kv_budget = 0,
                    .kv_reserved = 1 << 30}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_bytes = 0, .kv_tokens = 150, NOBEST},
    {.name = "mem: each worker's own block size (150 tokens: 5 blocks of 32)",
     .n = 2, .w = {{RDY(0), MEM16(1000, 0)},
                   {RDY(1), .count_memory = true, .block_tokens = 32, .block_bytes = 4096,
                    .kv_budget = 1 << 20}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 1, .kv_bytes = 20480, .kv_tokens = 150, .skipped = RT_SKIP_MEM,
     .reason = {[0] = RT_SKIP_MEM}, NOBEST},
    /* one reason per worker: the first in the order they are checked */
    {.name = "one reason per worker, in check order; skipped is their union",
     .n = 8,
     .w = {{IN_STATE(0, WS_DOWN), OPENAI, .held = true},           /* tried */
           {IN_STATE(1, WS_DOWN), OPENAI, .held = true},           /* down */
           {RDY(2), OPENAI, .ctx_limit = 50, .held = true},        /* kind */
           {RDY(3), .ctx_limit = 50, .held = true},                /* ctx */
           {RDY(4), .held = true, .max_seqs = 1, .seqs = 1},       /* held */
           {RDY(5), .max_seqs = 1, .seqs = 1, MEM16(0, 0)},        /* slots */
           {RDY(6), MEM16(0, 0), RATES(1, 1)},                     /* mem */
           {RDY(7), RATES(1000, 100)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, .deadline_ms = 10000},
     .tried = {[0] = true},
     .worker = 7, .kv_tokens = 150,
     .skipped = RT_SKIP_TRIED | RT_SKIP_DOWN | RT_SKIP_KIND | RT_SKIP_CTX | RT_SKIP_HELD |
                RT_SKIP_SLOTS | RT_SKIP_MEM,
     .reason = {[0] = RT_SKIP_TRIED, [1] = RT_SKIP_DOWN, [2] = RT_SKIP_KIND, [3] = RT_SKIP_CTX,
                [4] = RT_SKIP_HELD, [5] = RT_SKIP_SLOTS, [6] = RT_SKIP_MEM},
     .best_pred_ms = 600},
    {.name = "none eligible: worker -1, nothing reserved, skipped the union",
     .n = 3, .w = {{IN_STATE(0, WS_DOWN)}, {RDY(1), .held = true},
                   {RDY(2), .max_seqs = 1, .seqs = 1}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = -1, .skipped = RT_SKIP_DOWN | RT_SKIP_HELD | RT_SKIP_SLOTS,
     .reason = {[0] = RT_SKIP_DOWN, [1] = RT_SKIP_HELD, [2] = RT_SKIP_SLOTS}, NOBEST},
    /* deadline */
    {.name = "deadline: a slow worker is skipped, a faster one chosen",
     .n = 2, .w = {{RDY(0), RATES(1000, 10)} /* 100 + 5000 */, {RDY(1), RATES(1000, 100)}},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1000},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_DEADLINE,
     .reason = {[0] = RT_SKIP_DEADLINE}, .best_pred_ms = 600},
    {.name = "deadline: none in time; best_pred_ms is the smallest prediction",
     .n = 3, .w = {{RDY(0), RATES(1000, 10)} /* 5100 */, {RDY(1), RATES(1000, 25)} /* 2100 */,
                   {RDY(2), RATES(100, 25)} /* 3000 */},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1000},
     .worker = -1, .skipped = RT_SKIP_DEADLINE,
     .reason = {[0] = RT_SKIP_DEADLINE, [1] = RT_SKIP_DEADLINE, [2] = RT_SKIP_DEADLINE},
     .best_pred_ms = 2100},
    {.name = "deadline: a prediction equal to the deadline is in time",
     .n = 1, .w = {{RDY(0), RATES(1000, 100)} /* 500 + 1000 */},
     .need = {.prompt = 500, .max_tokens = 100, .deadline_ms = 1500},
     .worker = 0, .kv_tokens = 600, .best_pred_ms = 1500},
    {.name = "deadline: one millisecond short is missed",
     .n = 1, .w = {{RDY(0), RATES(1000, 100)}},
     .need = {.prompt = 500, .max_tokens = 100, .deadline_ms = 1499},
     .worker = -1, .skipped = RT_SKIP_DEADLINE, .reason = {[0] = RT_SKIP_DEADLINE},
     .best_pred_ms = 1500},
    {.name = "deadline: need.wait_ms is counted in the prediction (missed)",
     .n = 1, .w = {{RDY(0), RATES(1000, 100)}},
     .need = {.prompt = 500, .max_tokens = 100, .deadline_ms = 1500, .wait_ms = 250},
     .worker = -1, .skipped = RT_SKIP_DEADLINE, .reason = {[0] = RT_SKIP_DEADLINE},
     .best_pred_ms = 1750},
    {.name = "deadline: need.wait_ms is counted in the prediction (in time)",
     .n = 1, .w = {{RDY(0), RATES(1000, 100)}},
     .need = {.prompt = 500, .max_tokens = 100, .deadline_ms = 1750, .wait_ms = 250},
     .worker = 0, .kv_tokens = 600, .best_pred_ms = 1750},
    {.name = "deadline: no rates in time: the first worker without rates is the fallback",
     .n = 3, .w = {{RDY(0), RATES(1000, 100)} /* 1500 */, {RDY(1)}, {RDY(2)}},
     .need = {.prompt = 500, .max_tokens = 100, .deadline_ms = 1000},
     .worker = 1, .kv_tokens = 600, .skipped = RT_SKIP_DEADLINE,
     .reason = {[0] = RT_SKIP_DEADLINE}, .best_pred_ms = 1500, .rates_unknown = true},
    {.name = "deadline: a later worker with rates in time beats an earlier one without",
     .n = 2, .w = {{RDY(0)}, {RDY(1), RATES(1000, 100)} /* 600 */},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1000},
     .worker = 1, .kv_tokens = 150, .best_pred_ms = 600},
    {.name = "deadline: only workers without rates: the first, rates_unknown",
     .n = 2, .w = {{RDY(0)}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1},
     .worker = 0, .kv_tokens = 150, NOBEST, .rates_unknown = true},
    {.name = "deadline: one rate of two unknown is no rates",
     .n = 2, .w = {{RDY(0), RATES(1000, 0)}, {RDY(1), RATES(0, 100)}},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1},
     .worker = 0, .kv_tokens = 150, NOBEST, .rates_unknown = true},
    {.name = "deadline: the fallback reserves by its own context and blocks",
     .n = 2, .w = {{RDY(0), MEM16(1 << 20, 0), RATES(1, 1)},
                   {RDY(1), .ctx_limit = 120, .count_memory = true, .block_tokens = 32,
                    .block_bytes = 2048, .kv_budget = 1 << 20}},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1000},
     .worker = 1, .kv_bytes = 8192, .kv_tokens = 120, .skipped = RT_SKIP_DEADLINE,
     .reason = {[0] = RT_SKIP_DEADLINE}, .best_pred_ms = 150000, .rates_unknown = true},
    {.name = "deadline: a worker without rates skipped for another reason is no fallback",
     .n = 3, .w = {{IN_STATE(0, WS_DOWN)}, {RDY(1), .held = true}, {RDY(2)}},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1},
     .worker = 2, .kv_tokens = 150, .skipped = RT_SKIP_DOWN | RT_SKIP_HELD,
     .reason = {[0] = RT_SKIP_DOWN, [1] = RT_SKIP_HELD}, NOBEST, .rates_unknown = true},
    {.name = "deadline: best_pred_ms only from workers that reached the deadline check",
     .n = 2, .w = {{IN_STATE(0, WS_DOWN), RATES(1e9, 1e9)}, {RDY(1), RATES(1000, 10)}},
     .need = {.prompt = 100, .max_tokens = 50, .deadline_ms = 1000},
     .worker = -1, .skipped = RT_SKIP_DOWN | RT_SKIP_DEADLINE,
     .reason = {[0] = RT_SKIP_DOWN, [1] = RT_SKIP_DEADLINE}, .best_pred_ms = 5100},
    {.name = "no deadline: rates are not looked at",
     .n = 1, .w = {{RDY(0), RATES(1, 1)}},
     .need = {.prompt = 100, .max_tokens = 50, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    {.name = "deadline: max_tokens -1 predicts generation up to the context",
     .n = 1, .w = {{RDY(0), .ctx_limit = 1000, RATES(1000, 100)} /* 100 + 9000 */},
     .need = {.prompt = 100, .max_tokens = -1, .deadline_ms = 9000},
     .worker = -1, .skipped = RT_SKIP_DEADLINE, .reason = {[0] = RT_SKIP_DEADLINE},
     .best_pred_ms = 9100},
    {.name = "deadline: an unknown prompt predicts the whole context generated",
     .n = 1, .w = {{RDY(0), .ctx_limit = 200, RATES(1000, 100)} /* 0 + 2000 */},
     .need = {.prompt = -1, .max_tokens = 10, .deadline_ms = 2000},
     .worker = 0, .kv_tokens = 200, .best_pred_ms = 2000},
    /* idle */
    {.name = "idle: state, held, slots and reservations are ignored",
     .n = 1, .w = {{IN_STATE(0, WS_DOWN), .held = true, .max_seqs = 1, .seqs = 1,
                    MEM16(10240, 10240)}},
     .need = {.prompt = 100, .max_tokens = 50, .idle = true, NODL},
     .worker = 0, .kv_bytes = 10240, .kv_tokens = 150, NOBEST},
    {.name = "idle: a worker that cannot be back by itself does not count",
     .n = 2, .w = {{IN_STATE(0, WS_DOWN), .back_in_s = -1}, {RDY(1), .ctx_limit = 100}},
     .need = {.prompt = 100, .max_tokens = 50, .idle = true, .max_wait_ms = 10000, NODL},
     .worker = -1, .skipped = RT_SKIP_DOWN | RT_SKIP_CTX,
     .reason = {[0] = RT_SKIP_DOWN, [1] = RT_SKIP_CTX}, NOBEST},
    {.name = "idle: a restart within the wait counts, one after it does not",
     .n = 2, .w = {{IN_STATE(0, WS_DOWN), .back_in_s = 12}, {IN_STATE(1, WS_DOWN), .back_in_s = 8}},
     .need = {.prompt = 100, .max_tokens = 50, .idle = true, .max_wait_ms = 10000, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_DOWN, .reason = {[0] = RT_SKIP_DOWN},
     NOBEST},
    {.name = "idle: no bound on the wait, any restart counts",
     .n = 1, .w = {{IN_STATE(0, WS_DOWN), .back_in_s = 12}},
     .need = {.prompt = 100, .max_tokens = 50, .idle = true, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
    {.name = "idle: tried, kind, context and the budget itself still count",
     .n = 4, .w = {{RDY(0)}, {IN_STATE(1, WS_STARTING), OPENAI}, {RDY(2), .ctx_limit = 100},
                   {IN_STATE(3, WS_DOWN), MEM16(10239, 0)}},
     .need = {.prompt = 100, .max_tokens = 50, .resume = true, .idle = true, NODL},
     .tried = {[0] = true},
     .worker = -1, .skipped = RT_SKIP_TRIED | RT_SKIP_KIND | RT_SKIP_CTX | RT_SKIP_MEM,
     .reason = {[0] = RT_SKIP_TRIED, [1] = RT_SKIP_KIND, [2] = RT_SKIP_CTX, [3] = RT_SKIP_MEM},
     NOBEST},
    {.name = "idle with a deadline: a down worker's prediction misses it",
     .n = 1, .w = {{IN_STATE(0, WS_DOWN), RATES(1000, 100)}},
     .need = {.prompt = 100, .max_tokens = 50, .idle = true, .deadline_ms = 500},
     .worker = -1, .skipped = RT_SKIP_DEADLINE, .reason = {[0] = RT_SKIP_DEADLINE},
     .best_pred_ms = 600},
    {.name = "idle with a deadline: a down worker predicted in time",
     .n = 1, .w = {{IN_STATE(0, WS_DOWN), RATES(1000, 100)}},
     .need = {.prompt = 100, .max_tokens = 50, .idle = true, .deadline_ms = 600},
     .worker = 0, .kv_tokens = 150, .best_pred_ms = 600},
    /* what is reserved */
    {.name = "unknown prompt (-1) reserves the whole context (256 blocks)",
     .n = 1, .w = {{RDY(0), .ctx_limit = 4096, MEM16(1 << 30, 0)}},
     .need = {.prompt = -1, .max_tokens = 10, NODL},
     .worker = 0, .kv_bytes = 262144, .kv_tokens = 4096, NOBEST},
    {.name = "unknown prompt is never too long for the context",
     .n = 1, .w = {{RDY(0), .ctx_limit = 1, MEM16(1024, 0)}},
     .need = {.prompt = -1, .max_tokens = 10, NODL},
     .worker = 0, .kv_bytes = 1024, .kv_tokens = 1, NOBEST},
    {.name = "unknown prompt, unknown context: the whole budget, alone there",
     .n = 2, .w = {{RDY(0), MEM16(8192, 0)}, {RDY(1), MEM16(8192, 1024)}},
     .need = {.prompt = -1, .max_tokens = 10, NODL},
     .worker = 0, .kv_bytes = 8192, .kv_tokens = 10, NOBEST},
    {.name = "unknown max_tokens, unknown context: nothing else may be reserved there",
     .n = 2, .w = {{RDY(0), MEM16(8192, 1)}, {RDY(1)}},
     .need = {.prompt = 100, .max_tokens = -1, NODL},
     .worker = 1, .kv_tokens = 100, .skipped = RT_SKIP_MEM, .reason = {[0] = RT_SKIP_MEM},
     NOBEST},
    {.name = "unknown prompt: the whole context must fit the budget",
     .n = 2, .w = {{RDY(0), .ctx_limit = 4096, MEM16(262143, 0)}, {RDY(1), .ctx_limit = 4096}},
     .need = {.prompt = -1, .max_tokens = 10, NODL},
     .worker = 1, .kv_tokens = 4096, .skipped = RT_SKIP_MEM, .reason = {[0] = RT_SKIP_MEM},
     NOBEST},
    {.name = "max_tokens -1 reserves up to the context (63 blocks for 1000)",
     .n = 1, .w = {{RDY(0), .ctx_limit = 1000, MEM16(1 << 20, 0)}},
     .need = {.prompt = 100, .max_tokens = -1, NODL},
     .worker = 0, .kv_bytes = 64512, .kv_tokens = 1000, NOBEST},
    {.name = "prompt + max_tokens over the context reserves the context",
     .n = 1, .w = {{RDY(0), .ctx_limit = 1000, MEM16(1 << 20, 0)}},
     .need = {.prompt = 100, .max_tokens = 5000, NODL},
     .worker = 0, .kv_bytes = 64512, .kv_tokens = 1000, NOBEST},
    /* n > 1: a sequence per choice */
    {.name = "n = 3 reserves each choice's KV (3 x 10 blocks)",
     .n = 1, .w = {{RDY(0), MEM16(1 << 20, 0)}},
     .need = {.prompt = 100, .max_tokens = 50, .n_choices = 3, NODL},
     .worker = 0, .kv_bytes = 30720, .kv_tokens = 150, NOBEST},
    {.name = "n = 3 does not fit a budget of two choices",
     .n = 1, .w = {{RDY(0), MEM16(20480, 0)}},
     .need = {.prompt = 100, .max_tokens = 50, .n_choices = 3, NODL},
     .worker = -1, .kv_tokens = 0, .skipped = RT_SKIP_MEM, .reason = {[0] = RT_SKIP_MEM},
     NOBEST},
    {.name = "n = 3 needs three free sequences",
     .n = 2, .w = {{RDY(0), .max_seqs = 4, .seqs = 2}, {RDY(1), .max_seqs = 4, .seqs = 1}},
     .need = {.prompt = 100, .max_tokens = 50, .n_choices = 3, NODL},
     .worker = 1, .kv_tokens = 150, .skipped = RT_SKIP_SLOTS, .reason = {[0] = RT_SKIP_SLOTS},
     NOBEST},
    {.name = "n over max_seqs takes every sequence (the worker queues the rest)",
     .n = 1, .w = {{RDY(0), .max_seqs = 2, .seqs = 0}},
     .need = {.prompt = 100, .max_tokens = 50, .n_choices = 5, NODL},
     .worker = 0, .kv_tokens = 150, NOBEST},
};

static void check_policy_row(const policy_row *r, const bool *tried)
{
    rt_pool_view v;
    memset(&v, 0, sizeof v);
    v.n = r->n;
    memcpy(v.w, r->w, sizeof r->w);
    rt_decision d;
    memset(&d, 0x5a, sizeof d); /* everything must be written */
    int got = rt_policy_decide(&v, &r->need, tried, &d);
    EXPECT(got == d.worker, "[%s] returned %d, d.worker %d", r->name, got, d.worker);
    EXPECT(d.worker == r->worker, "[%s] worker %d, want %d", r->name, d.worker, r->worker);
    EXPECT(d.kv_bytes == r->kv_bytes, "[%s] kv_bytes %lld, want %lld", r->name,
           (long long)d.kv_bytes, (long long)r->kv_bytes);
    EXPECT(d.kv_tokens == r->kv_tokens, "[%s] kv_tokens %ld, want %ld", r->name, d.kv_tokens,
           r->kv_tokens);
    EXPECT(d.skipped == r->skipped, "[%s] skipped 0x%x, want 0x%x", r->name, d.skipped,
           r->skipped);
    for (int i = 0; i < RT_MAX_WORKERS; i++)
        EXPECT(d.reason[i] == r->reason[i], "[%s] reason[%d] 0x%x, want 0x%x", r->name, i,
               d.reason[i], r->reason[i]);
    EXPECT(near(d.best_pred_ms, r->best_pred_ms), "[%s] best_pred_ms %g, want %g", r->name,
           d.best_pred_ms, r->best_pred_ms);
    EXPECT(d.rates_unknown == r->rates_unknown, "[%s] rates_unknown %d, want %d", r->name,
           d.rates_unknown, r->rates_unknown);
    /* the union of reason[] is skipped */
    unsigned all = 0;
    for (int i = 0; i < RT_MAX_WORKERS; i++)
        all |= d.reason[i];
    EXPECT(all == d.skipped, "[%s] union of reason[] 0x%x, skipped 0x%x", r->name, all,
           d.skipped);
}

static void test_policy_table(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t i = 0; i < sizeof POLICY_ROWS / sizeof POLICY_ROWS[0]; i++)
        check_policy_row(&POLICY_ROWS[i], POLICY_ROWS[i].tried);
    assert_int_equal(g_failures, 0);
}

/* tried NULL is no worker tried: every row without a tried set decides the
 * same with NULL. */
static void test_policy_tried_null(void **state)
{
    (void)state;
    g_failures = 0;
    size_t n = 0;
    for (size_t i = 0; i < sizeof POLICY_ROWS / sizeof POLICY_ROWS[0]; i++) {
        const policy_row *r = &POLICY_ROWS[i];
        bool any = false;
        for (int k = 0; k < RT_MAX_WORKERS; k++)
            any |= r->tried[k];
        if (!any) {
            check_policy_row(r, NULL);
            n++;
        }
    }
    assert_true(n > 10);
    assert_int_equal(g_failures, 0);
}

static void test_policy_kv_bytes(void **state)
{
    (void)state;
    static const struct {
        bool count_memory;
        int32_t block_tokens;
        int64_t block_bytes;
        long tokens;
        int64_t bytes;
    } rows[] = {
        {true, 16, 1024, 0, 0},
        {true, 16, 1024, -5, 0},
        {true, 16, 1024, 1, 1024},
        {true, 16, 1024, 15, 1024},
        {true, 16, 1024, 16, 1024},
        {true, 16, 1024, 17, 2048},
        {true, 16, 1024, 32, 2048},
        {true, 16, 1024, 33, 3072},
        {true, 1, 3, 7, 21},
        {true, 256, (int64_t)1 << 30, 1L << 20, (int64_t)1 << 42}, /* no 32-bit overflow */
        {false, 16, 1024, 100, 0},
        {false, 0, 0, 100, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        rt_worker_view w;
        memset(&w, 0, sizeof w);
        w.count_memory = rows[i].count_memory;
        w.block_tokens = rows[i].block_tokens;
        w.block_bytes = rows[i].block_bytes;
        int64_t got = rt_policy_kv_bytes(&w, rows[i].tokens);
        if (got != rows[i].bytes)
            print_error("row %zu: %ld tokens: %lld bytes, want %lld\n", i, rows[i].tokens,
                        (long long)got, (long long)rows[i].bytes);
        assert_true(got == rows[i].bytes);
    }
    /* A sliding-window model: blocks of 1024 bytes of which 768 are the
     * local layers' share, at most 3 blocks of it per sequence; a share
     * the worker did not report (0) counts whole blocks, as before. */
    static const struct {
        int64_t sliding_bytes;
        int32_t sliding_max;
        long tokens;
        int64_t bytes;
    } sliding[] = {
        {768, 3, 1, 1024},
        {768, 3, 48, 3072},
        {768, 3, 49, 3072 + 256},
        {768, 3, 160, 3 * 1024 + 7 * 256},
        {768, 3, 1L << 20, 3 * 768 + (int64_t)(1 << 16) * 256},
        {0, 3, 160, 10 * 1024},
    };
    for (size_t i = 0; i < sizeof sliding / sizeof sliding[0]; i++) {
        rt_worker_view w;
        memset(&w, 0, sizeof w);
        w.count_memory = true;
        w.block_tokens = 16;
        w.block_bytes = 1024;
        w.sliding_block_bytes = sliding[i].sliding_bytes;
        w.sliding_blocks_max = sliding[i].sliding_max;
        int64_t got = rt_policy_kv_bytes(&w, sliding[i].tokens);
        if (got != sliding[i].bytes)
            print_error("sliding row %zu: %ld tokens: %lld bytes, want %lld\n", i,
                        sliding[i].tokens, (long long)got, (long long)sliding[i].bytes);
        assert_true(got == sliding[i].bytes);
    }
}

/* ---- 2. the failover decision ------------------------------------------- */

/* in: outcome, stream, tokens_sent, content_sent, kind, tool, single_pass,
 * no_replay, no_resume, external_ids, several_choices, ls_resume,
 * spillway_left. error_code is checked except on a resume, where the
 * header leaves it open (it is the first error's code there). */
typedef struct failover_row {
    const char *name;
    rt_failover_in in;
    /* expected */
    rt_action action;
    const char *decision;
    const char *error_code;  /* NULL: none */
    bool any_code;           /* error_code not specified for this action */
    bool out_of_rotation;
    bool restart;
    const char *reason_has;  /* a phrase of the reason, or NULL */
} failover_row;

#define SP RT_KIND_SPILLWAY
#define OA RT_KIND_OPENAI
#define LS RT_KIND_LLAMA_SERVER
#define EXT_STOP "none (external engine: no resume)"
#define NO_REPLAY_STOP "none (SPILLWAY_SABOTAGE=no-replay)"

static const failover_row FAILOVER_ROWS[] = {
    /* n > 1: a stream of several choices is never resumed */
    {"n > 1: a stream with tokens sent stops",
     {RT_OUT_CRASH, true, 5, true, SP, RT_TOOL_NONE, false, false, false, false, true, RT_LSR_OK, false, false},
     RT_FO_STOP, "none (n > 1: no resume)", "worker_failed", false, true, false, "several choices"},
    {"n > 1: a stream with nothing sent is replayed",
     {RT_OUT_CRASH, true, 0, false, SP, RT_TOOL_NONE, false, false, false, false, true, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, NULL},
    {"n > 1: not streamed, replayed whole",
     {RT_OUT_CRASH, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, true, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, NULL},
    /* finished: nothing to decide */
    {"ok", {RT_OUT_OK, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_DONE, "none", NULL, false, false, false, "completed"},
    {"ok, a stream with tokens sent",
     {RT_OUT_OK, true, 9, true, OA, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_DONE, "none", NULL, false, false, false, "completed"},
    {"ok, even with a tool of unknown outcome and sabotage",
     {RT_OUT_OK, false, 0, false, SP, RT_TOOL_UNKNOWN, true, true, true, false, false, RT_LSR_OK, false, false},
     RT_FO_DONE, "none", NULL, false, false, false, "completed"},
    /* DESIGN.md: 4xx from a worker: not retried */
    {"4xx from a worker: not retried",
     {RT_OUT_CLIENT_ERROR, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_DONE, "none", NULL, false, false, false, "not retried"},
    {"4xx on a stream with tokens sent: not retried",
     {RT_OUT_CLIENT_ERROR, true, 5, true, SP, RT_TOOL_EXECUTED, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_DONE, "none", NULL, false, false, false, "not retried"},
    /* DESIGN.md: client disconnected: cancel everywhere, no replay */
    {"client gone: cancel",
     {RT_OUT_CLIENT_GONE, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_CANCEL, "none", NULL, false, false, false, "no replay"},
    {"client gone mid-stream, tool unknown: still cancel",
     {RT_OUT_CLIENT_GONE, true, 12, true, OA, RT_TOOL_UNKNOWN, true, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_CANCEL, "none", NULL, false, false, false, "no replay"},
    /* refused before any work: back to its place, the worker stays in rotation */
    {"refused: requeue",
     {RT_OUT_REFUSED, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REQUEUE, "requeue", NULL, false, false, false, "queue"},
    {"refused on a stream, single pass, no-replay: still requeue",
     {RT_OUT_REFUSED, true, 0, false, OA, RT_TOOL_UNKNOWN, true, true, true, false, false, RT_LSR_OK, false, false},
     RT_FO_REQUEUE, "requeue", NULL, false, false, false, "queue"},
    /* DESIGN.md: non-streaming, no tool executed: replay from the start */
    {"oom, non-stream: replay, restart the worker",
     {RT_OUT_OOM, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, true, "non-streaming"},
    {"crash, non-stream: replay, no restart",
     {RT_OUT_CRASH, false, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "non-streaming"},
    {"crash, non-stream on kind=openai: replay",
     {RT_OUT_CRASH, false, 0, false, OA, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "non-streaming"},
    {"oom, non-stream with content (a buffered answer): replay",
     {RT_OUT_OOM, false, 0, true, OA, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, true, "non-streaming"},
    /* DESIGN.md: streaming, nothing sent yet: replay, transparently */
    {"oom, stream, nothing sent: replay",
     {RT_OUT_OOM, true, 0, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, true, "nothing sent"},
    {"crash, stream, nothing sent, kind=openai: replay",
     {RT_OUT_CRASH, true, 0, false, OA, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "nothing sent"},
    /* DESIGN.md: streaming, k tokens sent: resume */
    {"oom, stream, tokens sent: resume",
     {RT_OUT_OOM, true, 7, true, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, true, "resumed"},
    {"crash, stream, tokens sent: resume",
     {RT_OUT_CRASH, true, 7, true, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "resumed"},
    {"crash, stream, content (a tool call) but no token ids: resume",
     {RT_OUT_CRASH, true, 0, true, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "resumed"},
    {"crash, stream, token ids but no text yet: resume",
     {RT_OUT_CRASH, true, 3, false, SP, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "resumed"},
    /* an external engine cannot resume */
    {"kind=openai, stream, text sent, crash: stop",
     {RT_OUT_CRASH, true, 0, true, OA, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, EXT_STOP, "worker_failed", false, true, false, "external engine"},
    {"kind=openai, stream, text sent, oom: stop, out_of_memory, restart",
     {RT_OUT_OOM, true, 4, true, OA, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, EXT_STOP, "out_of_memory", false, true, true, "external engine"},
    {"kind=openai, stream, text sent, no-resume: still stop",
     {RT_OUT_CRASH, true, 4, true, OA, RT_TOOL_NONE, false, false, true, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, EXT_STOP, "worker_failed", false, true, false, "external engine"},
    /* kind = llama-server: resumed when its native stream gave the ids of
     * all it sent (external_ids), else as kind = openai */
    {"llama-server, stream, tokens with their ids, crash: resume",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "llama-server"},
    {"llama-server, stream, tokens with their ids, oom: resume, restart",
     {RT_OUT_OOM, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, true, "llama-server"},
    {"llama-server, stream, text through the OpenAI endpoint (no ids): stop",
     {RT_OUT_CRASH, true, 0, true, LS, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, EXT_STOP, "worker_failed", false, true, false, "without the token ids"},
    {"llama-server, stream, a token without its id: stop",
     {RT_OUT_CRASH, true, 5, true, LS, RT_TOOL_NONE, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, EXT_STOP, "worker_failed", false, true, false, "without the token ids"},
    {"llama-server, stream, ids but no-resume: replay from the start",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, true, true, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "no-resume"},
    {"llama-server, stream, nothing sent: replay",
     {RT_OUT_CRASH, true, 0, false, LS, RT_TOOL_NONE, false, false, false, true, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "nothing sent"},
    /* kind = llama-server: where its resume may go (ls_resume: whether
     * another llama-server continues it exactly; spillway_left) */
    {"llama-server, greedy, ids: resume, on another llama-server too",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_OK, true, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "another llama-server"},
    {"llama-server, greedy, ids, no spillway worker left: resume on a llama-server",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "continues exactly"},
    {"llama-server, sampled, a spillway worker left: resume there",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_SAMPLED, true, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "random stream"},
    {"llama-server, sampled, no spillway worker left: stop",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_SAMPLED, false, false},
     RT_FO_STOP, "none (llama-server cannot continue it)", "worker_failed", false, true, false,
     "random stream"},
    {"llama-server, grammar, a spillway worker left: resume there",
     {RT_OUT_OOM, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_CONSTRAINED, true, false},
     RT_FO_RESUME, "resume", NULL, true, true, true, "advances the grammar"},
    {"llama-server, grammar, no spillway worker left: stop, out_of_memory",
     {RT_OUT_OOM, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_CONSTRAINED, false, false},
     RT_FO_STOP, "none (llama-server cannot continue it)", "out_of_memory", false, true, true,
     "could not be advanced over the sent text"},
    {"llama-server, stop strings, no spillway worker left: stop",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_STOP, false, false},
     RT_FO_STOP, "none (llama-server cannot continue it)", "worker_failed", false, true, false,
     "stop strings"},
    {"llama-server, ids a spillway worker sent too, none left: stop",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_SPILLWAY_IDS, false, false},
     RT_FO_STOP, "none (llama-server cannot continue it)", "worker_failed", false, true, false,
     "spillway worker"},
    /* image content: only another llama-server with a projector takes it */
    {"llama-server, image, greedy: resume on another llama-server",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_OK, false, true},
     RT_FO_RESUME, "resume", NULL, true, true, false, "same image bytes"},
    {"llama-server, image, sampled: stop (no spillway worker takes an image)",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_SAMPLED, false, true},
     RT_FO_STOP, "none (llama-server cannot continue it)", "worker_failed", false, true, false,
     "takes no image"},
    {"llama-server, image, text that does not tokenize back: stop",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, true, false,
      RT_LSR_IMAGE_TEXT, false, true},
     RT_FO_STOP, "none (llama-server cannot continue it)", "worker_failed", false, true, false,
     "tokenize back"},
    {"llama-server, sampled, no ids: the external engine's stop comes first",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, false, false, false,
      RT_LSR_SAMPLED, false, false},
     RT_FO_STOP, EXT_STOP, "worker_failed", false, true, false, "without the token ids"},
    {"spillway worker, grammar, no spillway worker left: still a resume (spillway only)",
     {RT_OUT_CRASH, true, 6, true, SP, RT_TOOL_NONE, false, false, false, false, false,
      RT_LSR_CONSTRAINED, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "resumed"},
    {"llama-server, sampled, no-resume: replay from the start",
     {RT_OUT_CRASH, true, 6, true, LS, RT_TOOL_NONE, false, false, true, true, false,
      RT_LSR_SAMPLED, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "no-resume"},
    {"kind=openai never resumes, external_ids or not",
     {RT_OUT_CRASH, true, 6, true, OA, RT_TOOL_NONE, false, false, false, true, false, RT_LSR_OK, false, false},
     RT_FO_STOP, EXT_STOP, "worker_failed", false, true, false, "external engine"},
    /* DESIGN.md: a tool call started, outcome unknown, not idempotent */
    {"tool unknown, crash: stop, unsafe_to_retry",
     {RT_OUT_CRASH, false, 0, false, SP, RT_TOOL_UNKNOWN, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, "none", "unsafe_to_retry", false, true, false, "not idempotent"},
    {"tool unknown, oom: stop, unsafe_to_retry, restart",
     {RT_OUT_OOM, false, 0, false, SP, RT_TOOL_UNKNOWN, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, "none", "unsafe_to_retry", false, true, true, "not idempotent"},
    {"tool unknown beats resume, single pass, no-replay and external engine",
     {RT_OUT_CRASH, true, 7, true, OA, RT_TOOL_UNKNOWN, true, true, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, "none", "unsafe_to_retry", false, true, false, "not idempotent"},
    /* DESIGN.md: a server-side tool call already executed: replay reuses it */
    {"tool executed, non-stream: replay with the recorded result",
     {RT_OUT_CRASH, false, 0, false, SP, RT_TOOL_EXECUTED, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "recorded tool result"},
    {"tool executed, oom: replay, restart",
     {RT_OUT_OOM, false, 0, false, SP, RT_TOOL_EXECUTED, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, true, "recorded tool result"},
    {"tool executed, stream with tokens sent: resume",
     {RT_OUT_CRASH, true, 7, true, SP, RT_TOOL_EXECUTED, false, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_RESUME, "resume", NULL, true, true, false, "resumed"},
    /* single pass: the caller (an agent run) replays the whole run */
    {"single pass, crash: stop",
     {RT_OUT_CRASH, false, 0, false, SP, RT_TOOL_NONE, true, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, "none", "worker_failed", false, true, false, "whole run"},
    {"single pass, oom, stream with tokens sent: stop, out_of_memory",
     {RT_OUT_OOM, true, 7, true, SP, RT_TOOL_EXECUTED, true, false, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, "none", "out_of_memory", false, true, true, "whole run"},
    {"single pass beats no-replay and the external engine",
     {RT_OUT_CRASH, true, 7, true, OA, RT_TOOL_NONE, true, true, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, "none", "worker_failed", false, true, false, "whole run"},
    /* SPILLWAY_SABOTAGE=no-replay */
    {"no-replay, non-stream crash: stop",
     {RT_OUT_CRASH, false, 0, false, SP, RT_TOOL_NONE, false, true, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, NO_REPLAY_STOP, "worker_failed", false, true, false, "no-replay"},
    {"no-replay, oom, stream with tokens: stop (not resumed), out_of_memory",
     {RT_OUT_OOM, true, 7, true, SP, RT_TOOL_NONE, false, true, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, NO_REPLAY_STOP, "out_of_memory", false, true, true, "no-replay"},
    {"no-replay beats the external engine's stop",
     {RT_OUT_CRASH, true, 7, true, OA, RT_TOOL_NONE, false, true, false, false, false, RT_LSR_OK, false, false},
     RT_FO_STOP, NO_REPLAY_STOP, "worker_failed", false, true, false, "no-replay"},
    /* SPILLWAY_SABOTAGE=no-resume: replay from the start instead */
    {"no-resume, stream with tokens sent: replay from the start",
     {RT_OUT_CRASH, true, 7, true, SP, RT_TOOL_NONE, false, false, true, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "no-resume"},
    {"no-resume, oom, stream with tokens sent: replay, restart",
     {RT_OUT_OOM, true, 7, true, SP, RT_TOOL_NONE, false, false, true, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, true, "no-resume"},
    {"no-resume, stream with nothing sent: a plain replay",
     {RT_OUT_CRASH, true, 0, false, SP, RT_TOOL_NONE, false, false, true, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, false, "nothing sent"},
    {"no-resume, non-stream: a plain replay",
     {RT_OUT_OOM, false, 0, false, SP, RT_TOOL_NONE, false, false, true, false, false, RT_LSR_OK, false, false},
     RT_FO_REPLAY, "replay", NULL, false, true, true, "non-streaming"},
};

static void test_failover_table(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t i = 0; i < sizeof FAILOVER_ROWS / sizeof FAILOVER_ROWS[0]; i++) {
        const failover_row *r = &FAILOVER_ROWS[i];
        rt_failover f = rt_failover_decide(&r->in);
        EXPECT(f.action == r->action, "[%s] action %d, want %d", r->name, (int)f.action,
               (int)r->action);
        EXPECT(f.decision && !strcmp(f.decision, r->decision), "[%s] decision \"%s\", want \"%s\"",
               r->name, f.decision ? f.decision : "(null)", r->decision);
        if (!r->any_code) {
            bool same = r->error_code ? f.error_code && !strcmp(f.error_code, r->error_code)
                                      : f.error_code == NULL;
            EXPECT(same, "[%s] error_code %s, want %s", r->name,
                   f.error_code ? f.error_code : "(null)",
                   r->error_code ? r->error_code : "(null)");
        }
        EXPECT(f.out_of_rotation == r->out_of_rotation, "[%s] out_of_rotation %d, want %d",
               r->name, f.out_of_rotation, r->out_of_rotation);
        EXPECT(f.restart == r->restart, "[%s] restart %d, want %d", r->name, f.restart,
               r->restart);
        EXPECT(f.reason && f.reason[0], "[%s] no reason", r->name);
        if (r->reason_has && f.reason)
            EXPECT(strstr(f.reason, r->reason_has), "[%s] reason \"%s\" lacks \"%s\"", r->name,
                   f.reason, r->reason_has);
        /* a llama-server may take the resume only from a llama-server's
         * greedy native stream */
        bool on_ls = r->action == RT_FO_RESUME && r->in.kind == LS && r->in.external_ids &&
                     r->in.ls_resume == RT_LSR_OK;
        EXPECT(f.resume_on_ls == on_ls, "[%s] resume_on_ls %d, want %d", r->name,
               f.resume_on_ls, on_ls);
        /* a typed error only when it stops */
        if (r->action == RT_FO_STOP)
            EXPECT(f.error_code && f.error_code[0], "[%s] a stop without an error code", r->name);
        /* restart only for an out-of-memory, and only out of rotation */
        EXPECT(!f.restart || (r->in.outcome == RT_OUT_OOM && f.out_of_rotation),
               "[%s] restart without an oom", r->name);
    }
    assert_int_equal(g_failures, 0);
}

/* The outcome's name is the failover event's first error "kind". */
static void test_failover_outcome_names(void **state)
{
    (void)state;
    assert_string_equal(rt_outcome_name(RT_OUT_OK), "ok");
    assert_string_equal(rt_outcome_name(RT_OUT_CLIENT_ERROR), "client_error");
    assert_string_equal(rt_outcome_name(RT_OUT_REFUSED), "refused");
    assert_string_equal(rt_outcome_name(RT_OUT_OOM), "oom");
    assert_string_equal(rt_outcome_name(RT_OUT_CRASH), "worker_crash");
    assert_string_equal(rt_outcome_name(RT_OUT_CLIENT_GONE), "cancelled");
    assert_string_equal(rt_outcome_name((rt_outcome)99), "unknown");
    assert_string_equal(rt_outcome_name((rt_outcome)-1), "unknown");
}

/* ---- 3. the queue ------------------------------------------------------- */

static rt_pool g_pool;
static rt_queue g_queue;
static atomic_int g_stop;

/* n ready spillway workers w0.. in index order, 4 sequences each, context
 * 4096, memory not counted, no rates. */
static void pool_fill(rt_pool *p, int n)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    p->n_slots = p->n_live = n;
    for (int i = 0; i < n; i++) {
        rt_worker *w = &p->w[i];
        snprintf(w->cfg.name, sizeof w->cfg.name, "w%d", i);
        w->cfg.kind = RT_KIND_SPILLWAY;
        w->state = WS_READY;
        w->slots_max = 4;
        w->ctx_limit = 4096;
        w->kv_budget = -1;
        w->kv_device_capacity = -1;
        w->last_exit = -1;
        p->order[i] = i;
    }
}

/* Memory counted on worker i: blocks of 16 tokens of 1 KiB, budget bytes. */
static void pool_memory(rt_pool *p, int i, int64_t budget)
{
    p->w[i].on_device = true;
    p->w[i].kv_block_tokens = 16;
    p->w[i].kv_block_bytes = 1024;
    p->w[i].kv_budget = budget;
}

static void waiter_init(rt_queue *q, rt_waiter *w, long prompt, long max_tokens,
                        long long deadline_ms)
{
    memset(w, 0, sizeof *w);
    w->ticket = rt_queue_ticket(q);
    w->need.prompt = prompt;
    w->need.max_tokens = max_tokens;
    w->need.deadline_ms = deadline_ms;
    w->first = true;
}

static rt_admit_result admit_now(rt_queue *q, rt_waiter *w)
{
    double waited = -1;
    rt_admit_result r = rt_queue_admit(q, w, 0, -1, &g_stop, &waited);
    assert_true(waited >= 0);
    return r;
}

static void assert_books(rt_pool *p, int wi, int seqs, int64_t kv_bytes)
{
    pthread_mutex_lock(&p->mu);
    int s = p->w[wi].books.seqs;
    int64_t b = p->w[wi].books.kv_bytes;
    pthread_mutex_unlock(&p->mu);
    if (s != seqs || b != kv_bytes)
        print_error("worker %d books: %d seqs, %lld bytes; want %d, %lld\n", wi, s, (long long)b,
                    seqs, (long long)kv_bytes);
    assert_int_equal(s, seqs);
    assert_true(b == kv_bytes);
}

static int queue_teardown(void **state)
{
    (void)state;
    pthread_mutex_destroy(&g_pool.mu);
    return 0;
}

/* Grants at once take the books; release gives them back; the ordinal
 * counts first admissions only; the preference order picks the worker. */
static void test_queue_grant_and_release(void **state)
{
    (void)state;
    g_stop = 0;
    pool_fill(&g_pool, 2);
    g_pool.order[0] = 1; /* w1 preferred */
    g_pool.order[1] = 0;
    pool_memory(&g_pool, 1, 1 << 20);
    rt_queue_init(&g_queue, &g_pool, 8);

    g_pool.w[1].pid = 4321;
    g_pool.w[1].restarts = 2;

    rt_waiter a, b, c;
    waiter_init(&g_queue, &a, 100, 50, -1);
    waiter_init(&g_queue, &b, 100, 50, -1);
    waiter_init(&g_queue, &c, 100, 50, -1);
    assert_true(a.ticket < b.ticket && b.ticket < c.ticket);

    assert_int_equal(admit_now(&g_queue, &a), RT_ADMIT_OK);
    assert_int_equal(a.grant.worker, 1);
    assert_true(a.grant.kv_bytes == 10240); /* 150 tokens: 10 blocks */
    assert_int_equal(a.grant.kv_tokens, 150);
    assert_int_equal(a.ordinal, 1);
    assert_true(a.generation == ((uint64_t)2 << 32 | 4321)); /* the process it was granted */
    assert_books(&g_pool, 1, 1, 10240);
    assert_books(&g_pool, 0, 0, 0);
    assert_int_equal(g_queue.depth, 0);

    assert_int_equal(admit_now(&g_queue, &b), RT_ADMIT_OK);
    assert_int_equal(b.grant.worker, 1);
    assert_int_equal(b.ordinal, 2);
    assert_books(&g_pool, 1, 2, 20480);

    /* a request coming back (not its first admission) takes no ordinal */
    c.first = false;
    assert_int_equal(admit_now(&g_queue, &c), RT_ADMIT_OK);
    assert_int_equal(c.ordinal, 0);
    assert_int_equal(g_queue.admissions, 2);
    assert_books(&g_pool, 1, 3, 30720);
    assert_int_equal(g_queue.depth, 0);
    assert_int_equal(g_queue.wait_count, 3);

    /* a tally, when given, counts on the worker the reservation was on */
    rt_tally tally = {.ok = true, .tokens = 42};
    rt_queue_release(&g_queue, b.grant.worker, b.grant.kv_bytes, &tally);
    assert_books(&g_pool, 1, 2, 20480);
    assert_int_equal(g_pool.w[1].req_ok, 1);
    assert_int_equal(g_pool.w[1].tokens, 42);
    assert_int_equal(g_pool.w[1].req_failed + g_pool.w[1].req_client_error, 0);
    assert_int_equal(g_pool.w[0].req_ok, 0);
    rt_queue_release(&g_queue, a.grant.worker, a.grant.kv_bytes, NULL);
    rt_queue_release(&g_queue, c.grant.worker, c.grant.kv_bytes, NULL);
    assert_books(&g_pool, 1, 0, 0);
    assert_books(&g_pool, 0, 0, 0);

    /* w1 full by its slots: w0 takes the next, memory not counted there,
     * and the grant says why w1 was passed over */
    g_pool.w[1].books.seqs = 4;
    rt_waiter d;
    waiter_init(&g_queue, &d, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &d), RT_ADMIT_OK);
    assert_int_equal(d.grant.worker, 0);
    assert_true(d.grant.kv_bytes == 0);
    assert_int_equal(d.grant.reason[1], RT_SKIP_SLOTS);
    assert_int_equal(d.ordinal, 3);
    assert_books(&g_pool, 0, 1, 0);
    rt_queue_release(&g_queue, 0, 0, NULL);
    assert_books(&g_pool, 0, 0, 0);
    assert_int_equal(g_queue.passes, 0);

    /* n = 3: three sequences and each one's KV taken, and given back */
    g_pool.w[1].books.seqs = 0;
    rt_waiter e;
    waiter_init(&g_queue, &e, 100, 50, -1);
    e.need.n_choices = 3;
    assert_int_equal(admit_now(&g_queue, &e), RT_ADMIT_OK);
    assert_int_equal(e.grant.worker, 1);
    assert_int_equal(e.grant.seqs, 3);
    assert_true(e.grant.kv_bytes == 30720);
    assert_books(&g_pool, 1, 3, 30720);
    rt_queue_release_shared(&g_queue, 1, e.grant.kv_bytes, NULL, NULL, 0, e.grant.seqs);
    assert_books(&g_pool, 1, 0, 0);
}

/* Placement by prefix (router_prefix.h): a granted prompt's blocks go
 * into its worker's summary, and the next request that starts the same is
 * granted there while it has room - over the first worker of the same
 * preference, which holds none of it; otherwise preference order as
 * before, and a worker ranked after the first is never taken for its
 * cache. A new process starts with an empty summary. */
static void test_queue_prefix_placement(void **state)
{
    (void)state;
    g_stop = 0;
    pool_fill(&g_pool, 2);
    rt_queue_init(&g_queue, &g_pool, 8);
    int32_t ids[200];
    for (int i = 0; i < 200; i++)
        ids[i] = 3 + i * 7;
    uint64_t h[RT_PREFIX_MAX_BLOCKS], other[RT_PREFIX_MAX_BLOCKS];
    int n = rt_prefix_hashes(ids, 200, h, RT_PREFIX_MAX_BLOCKS);
    assert_int_equal(n, 199 / 16); /* never the last token's block */
    assert_int_equal(rt_prefix_hashes(ids, 17, h, RT_PREFIX_MAX_BLOCKS), 1);
    assert_int_equal(rt_prefix_hashes(ids, 16, h, RT_PREFIX_MAX_BLOCKS), 0);
    assert_int_equal(rt_prefix_hashes(ids, 200, h, 4), 4);
    n = rt_prefix_hashes(ids, 200, h, RT_PREFIX_MAX_BLOCKS);
    ids[40] = 1; /* a prompt that parts in block 2 */
    int n_other = rt_prefix_hashes(ids, 200, other, RT_PREFIX_MAX_BLOCKS);
    assert_true(other[0] == h[0] && other[1] == h[1] && other[2] != h[2]);

    /* the first goes to w0 (preferred); w1 has served the prompt before */
    rt_prefix_note(&g_pool.w[1].prefix, h, n);
    assert_int_equal(rt_prefix_match(&g_pool.w[1].prefix, h, n), n);
    assert_int_equal(rt_prefix_match(&g_pool.w[1].prefix, other, n_other), 2);
    assert_int_equal(rt_prefix_match(&g_pool.w[0].prefix, h, n), 0);
    rt_waiter a, b, c, d;
    waiter_init(&g_queue, &a, 200, 10, -1);
    a.need.prefix = h;
    a.need.n_prefix = n;
    assert_int_equal(admit_now(&g_queue, &a), RT_ADMIT_OK);
    assert_int_equal(a.grant.worker, 1);
    /* one that parts after two blocks also prefers w1 (2 > 0) */
    waiter_init(&g_queue, &b, 200, 10, -1);
    b.need.prefix = other;
    b.need.n_prefix = n_other;
    assert_int_equal(admit_now(&g_queue, &b), RT_ADMIT_OK);
    assert_int_equal(b.grant.worker, 1);
    /* ... and is remembered there now */
    assert_int_equal(rt_prefix_match(&g_pool.w[1].prefix, other, n_other), n_other);
    /* no hashes: preference order */
    waiter_init(&g_queue, &c, 200, 10, -1);
    assert_int_equal(admit_now(&g_queue, &c), RT_ADMIT_OK);
    assert_int_equal(c.grant.worker, 0);
    /* w1 full: w0 takes it, and remembers it too */
    g_pool.w[1].books.seqs = 4;
    waiter_init(&g_queue, &d, 200, 10, -1);
    d.need.prefix = h;
    d.need.n_prefix = n;
    assert_int_equal(admit_now(&g_queue, &d), RT_ADMIT_OK);
    assert_int_equal(d.grant.worker, 0);
    assert_int_equal(d.grant.reason[1], RT_SKIP_SLOTS);
    assert_int_equal(rt_prefix_match(&g_pool.w[0].prefix, h, n), n);
    g_pool.w[1].books.seqs = 0;
    rt_queue_release(&g_queue, 1, 0, NULL);
    rt_queue_release(&g_queue, 1, 0, NULL);
    rt_queue_release(&g_queue, 0, 0, NULL);
    rt_queue_release(&g_queue, 0, 0, NULL);

    /* w1 ranked after w0 (a CPU worker behind a GPU, say): its summary
     * holding the whole prompt does not move the request off w0 */
    rt_prefix_clear(&g_pool.w[0].prefix);
    g_pool.w[1].cfg.preference = 2;
    rt_waiter e;
    waiter_init(&g_queue, &e, 200, 100, -1);
    e.need.prefix = h;
    e.need.n_prefix = n;
    assert_int_equal(admit_now(&g_queue, &e), RT_ADMIT_OK);
    assert_int_equal(e.grant.worker, 0);
    rt_queue_release(&g_queue, 0, 0, NULL);
    g_pool.w[1].cfg.preference = 0;
    assert_true(rt_policy_prefers(&(rt_worker_view){.preference = 1}, 0,
                                  &(rt_worker_view){.preference = 1}, 1));
    assert_false(rt_policy_prefers(&(rt_worker_view){.preference = 1}, 3,
                                   &(rt_worker_view){.preference = 1}, 3));
    assert_false(rt_policy_prefers(&(rt_worker_view){.preference = 1}, 0,
                                   &(rt_worker_view){.preference = 2}, 9));
    rt_prefix_clear(&g_pool.w[1].prefix);
    assert_int_equal(rt_prefix_match(&g_pool.w[1].prefix, h, n), 0);
}

/* The prompt blocks requests in flight share count once in the books
 * (rt_pool_shared_attach_locked): A (20 blocks reserved: 10 of prompt)
 * reaches its first token with all 10 in the worker's prefix cache; B,
 * with the same first 6 blocks, reaches its own with those 6 cached and 2
 * more blocks of its own copy. The books hold A's and B's reservations
 * less the 6 blocks they share; as they end, the shared blocks stay
 * charged to the one still holding them, and the books end at 0. A block
 * outside the cache (prefix_tokens) stays in its request's reservation.
 * A request granted while the blocks it starts with are held reserves only
 * the rest. */
static void test_shared_blocks_once(void **state)
{
    (void)state;
    g_stop = 0;
    pool_fill(&g_pool, 1);
    pool_memory(&g_pool, 0, 1 << 20); /* blocks of 16 tokens, 1 KiB */
    rt_queue_init(&g_queue, &g_pool, 8);
    const int64_t bb = 1024;
    int32_t a_ids[170], b_ids[170];
    for (int i = 0; i < 170; i++) {
        a_ids[i] = 3 + i;
        b_ids[i] = i < 96 ? a_ids[i] : 1000 + i; /* the same first 6 blocks */
    }
    uint64_t ha[RT_PREFIX_MAX_BLOCKS], hb[RT_PREFIX_MAX_BLOCKS];
    int na = rt_prefix_hashes(a_ids, 170, ha, RT_PREFIX_MAX_BLOCKS);
    int nb = rt_prefix_hashes(b_ids, 170, hb, RT_PREFIX_MAX_BLOCKS);
    assert_int_equal(na, 10);
    assert_int_equal(nb, 10);

    rt_waiter a, b;
    waiter_init(&g_queue, &a, 170, 150, -1); /* 320 tokens: 20 blocks */
    waiter_init(&g_queue, &b, 170, 150, -1);
    assert_int_equal(admit_now(&g_queue, &a), RT_ADMIT_OK);
    assert_int_equal(admit_now(&g_queue, &b), RT_ADMIT_OK);
    assert_true(a.grant.kv_bytes == 20 * bb && b.grant.kv_bytes == 20 * bb);
    assert_books(&g_pool, 0, 2, 40 * bb);

    int reg_a = a.grant.shared_blocks, reg_b = b.grant.shared_blocks; /* none in flight yet */
    assert_int_equal(reg_a + reg_b, 0);
    int64_t moved_a = rt_queue_shared_attach(&g_queue, 0, ha, na, 160, &reg_a);
    assert_int_equal(reg_a, 10);
    assert_true(moved_a == 10 * bb);
    assert_books(&g_pool, 0, 2, 40 * bb); /* moved into the table, not gone */
    /* B: 6 blocks shared with A, 2 of its own offered, the rest its copies */
    int64_t moved_b = rt_queue_shared_attach(&g_queue, 0, hb, nb, 128, &reg_b);
    assert_int_equal(reg_b, 8);
    assert_true(moved_b == 8 * bb);
    assert_books(&g_pool, 0, 2, 34 * bb); /* the 6 shared blocks once */
    assert_int_equal(rt_shared_refs(&g_pool.w[0].shared, ha[5]), 2);
    assert_int_equal(rt_shared_refs(&g_pool.w[0].shared, hb[6]), 1);
    assert_int_equal(rt_shared_refs(&g_pool.w[0].shared, hb[8]), 0);

    /* C, A's prompt again, arrives now: A's 10 blocks are held, so C
     * reserves only its other 10 (need.share; not when it is a resumed
     * stream, whose worker computes the prompt itself) and holds them once
     * more from its grant */
    rt_waiter c, c2;
    waiter_init(&g_queue, &c2, 170, 150, -1);
    c2.need.prefix = ha;
    c2.need.n_prefix = na;
    c2.need.share = false;
    assert_int_equal(admit_now(&g_queue, &c2), RT_ADMIT_OK);
    assert_true(c2.grant.kv_bytes == 20 * bb && c2.grant.shared_blocks == 0);
    rt_queue_release_shared(&g_queue, 0, c2.grant.kv_bytes, NULL, ha, 0, 1);
    waiter_init(&g_queue, &c, 170, 150, -1);
    c.need.prefix = ha;
    c.need.n_prefix = na;
    c.need.share = true;
    assert_int_equal(admit_now(&g_queue, &c), RT_ADMIT_OK);
    assert_int_equal(c.grant.shared_blocks, 10);
    assert_true(c.grant.kv_bytes == 10 * bb);
    assert_books(&g_pool, 0, 3, 44 * bb);
    assert_int_equal(rt_shared_refs(&g_pool.w[0].shared, ha[9]), 2);
    /* its first token: the 10 it holds from the grant are skipped */
    int reg_c = c.grant.shared_blocks;
    assert_true(rt_queue_shared_attach(&g_queue, 0, ha, na, 160, &reg_c) == 0);
    assert_int_equal(reg_c, 10);
    rt_queue_release_shared(&g_queue, 0, c.grant.kv_bytes, NULL, ha, reg_c, 1);
    assert_books(&g_pool, 0, 2, 34 * bb);

    /* A ends: its 4 own blocks leave with it, the 6 shared stay for B */
    rt_queue_release_shared(&g_queue, 0, a.grant.kv_bytes - moved_a, NULL, ha, reg_a, 1);
    assert_books(&g_pool, 0, 1, 20 * bb);
    assert_int_equal(rt_shared_refs(&g_pool.w[0].shared, ha[5]), 1);
    rt_queue_release_shared(&g_queue, 0, b.grant.kv_bytes - moved_b, NULL, hb, reg_b, 1);
    assert_books(&g_pool, 0, 0, 0);
    assert_int_equal(g_pool.w[0].shared.live, 0);

    /* memory not counted (a CPU worker): nothing moves */
    g_pool.w[0].kv_budget = -1;
    reg_a = 0;
    assert_true(rt_queue_shared_attach(&g_queue, 0, ha, na, 160, &reg_a) == 0);
    assert_int_equal(reg_a, 0);
}

/* The books' reservations bound memory: a third request that does not fit
 * what is left waits (max_wait_s 0: TIMEOUT at once, not NEVER: idle it
 * fits), and fits again once one is released. */
static void test_queue_memory_books(void **state)
{
    (void)state;
    g_stop = 0;
    pool_fill(&g_pool, 1);
    pool_memory(&g_pool, 0, 20480); /* two requests of 10 blocks */
    rt_queue_init(&g_queue, &g_pool, 8);

    rt_waiter a, b, c;
    waiter_init(&g_queue, &a, 100, 50, -1);
    waiter_init(&g_queue, &b, 100, 50, -1);
    waiter_init(&g_queue, &c, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &a), RT_ADMIT_OK);
    assert_int_equal(admit_now(&g_queue, &b), RT_ADMIT_OK);
    assert_books(&g_pool, 0, 2, 20480);
    assert_int_equal(admit_now(&g_queue, &c), RT_ADMIT_TIMEOUT);
    assert_false(c.granted);
    assert_int_equal(g_queue.depth, 0);
    assert_books(&g_pool, 0, 2, 20480);

    rt_queue_release(&g_queue, 0, a.grant.kv_bytes, NULL);
    assert_books(&g_pool, 0, 1, 10240);
    assert_int_equal(admit_now(&g_queue, &c), RT_ADMIT_OK);
    assert_int_equal(c.ordinal, 3); /* its first admission, at last */
    assert_books(&g_pool, 0, 2, 20480);
    rt_queue_release(&g_queue, 0, b.grant.kv_bytes, NULL);
    rt_queue_release(&g_queue, 0, c.grant.kv_bytes, NULL);
    assert_books(&g_pool, 0, 0, 0);

    /* giving back more than is booked stops at zero */
    rt_queue_release(&g_queue, 0, 4096, NULL);
    assert_books(&g_pool, 0, 0, 0);
}

/* Two workers on one device (of two models, or of one) share its KV
 * memory, measured while both were idle: what the books admitted to one
 * binds the other; a request that would fit the idle device waits, it is
 * not refused; on two devices each has its own. A request names its
 * model. */
static void test_queue_shared_device(void **state)
{
    (void)state;
    g_stop = 0;
    for (int shared = 1; shared >= 0; shared--) {
        pool_fill(&g_pool, 2);
        pool_memory(&g_pool, 0, 20480); /* each sees the same free memory */
        pool_memory(&g_pool, 1, 20480);
        g_pool.w[1].model = 1;
        snprintf(g_pool.w[0].cfg.device, sizeof g_pool.w[0].cfg.device, "sim-gpu:one");
        snprintf(g_pool.w[1].cfg.device, sizeof g_pool.w[1].cfg.device, "%s",
                 shared ? "sim-gpu:one" : "sim-gpu:two");
        /* both idle: the shared device's KV memory is measured */
        rt_pool_device_measure_locked(&g_pool, 1);
        assert_int_equal(g_pool.w[0].kv_device_capacity, shared ? 20480 : -1);
        rt_queue_init(&g_queue, &g_pool, 8);
        rt_waiter a1, a2, b1, b2;
        waiter_init(&g_queue, &a1, 100, 50, -1); /* 10 blocks each */
        waiter_init(&g_queue, &a2, 100, 50, -1);
        waiter_init(&g_queue, &b1, 100, 50, -1);
        waiter_init(&g_queue, &b2, 100, 50, -1);
        b1.need.model = b2.need.model = 1;
        /* a burst on model 0 fills the device */
        assert_int_equal(admit_now(&g_queue, &a1), RT_ADMIT_OK);
        assert_int_equal(admit_now(&g_queue, &a2), RT_ADMIT_OK);
        assert_int_equal(a1.grant.worker, 0);
        assert_int_equal(a2.grant.worker, 0);
        /* model 1's worker sees it only when they share the device */
        assert_int_equal(admit_now(&g_queue, &b1), shared ? RT_ADMIT_TIMEOUT : RT_ADMIT_OK);
        if (shared) {
            /* once model 0's worker holds it, its /health says so: the
             * free memory both report fell, nothing is outstanding */
            g_pool.w[0].kv_held_bytes = 20480;
            g_pool.w[1].kv_budget = 0;
            assert_int_equal(admit_now(&g_queue, &b1), RT_ADMIT_TIMEOUT);
            /* model 0's requests end: their memory is back for model 1 */
            rt_queue_release(&g_queue, 0, a1.grant.kv_bytes, NULL);
            rt_queue_release(&g_queue, 0, a2.grant.kv_bytes, NULL);
            g_pool.w[0].kv_held_bytes = 0;
            g_pool.w[0].kv_budget = g_pool.w[1].kv_budget = 20480;
            assert_int_equal(admit_now(&g_queue, &b1), RT_ADMIT_OK);
        }
        assert_int_equal(b1.grant.worker, 1);
        /* and a model-0 request waiting now is bound by model 1's */
        assert_int_equal(admit_now(&g_queue, &b2), RT_ADMIT_OK);
        rt_waiter a3;
        waiter_init(&g_queue, &a3, 100, 50, -1);
        /* shared: b1 and b2 hold the device; else a1 and a2 hold worker 0 */
        assert_int_equal(admit_now(&g_queue, &a3), RT_ADMIT_TIMEOUT);
        if (shared)
            pthread_mutex_destroy(&g_pool.mu); /* pool_fill makes it again */
    }
}

/* FULL, NEVER, DEADLINE and TIMEOUT, each without waiting. */
static void test_queue_refusals(void **state)
{
    (void)state;
    g_stop = 0;
    pool_fill(&g_pool, 1);
    g_pool.w[0].slots_max = 1;
    g_pool.w[0].books.seqs = 1; /* occupied */
    rt_queue_init(&g_queue, &g_pool, 0);

    /* queue-size 0: a request that must wait is refused FULL */
    rt_waiter w;
    waiter_init(&g_queue, &w, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_FULL);
    assert_int_equal(g_queue.depth, 0);
    assert_int_equal(g_queue.wait_count, 0);
    /* queue-size 1: it may wait (and times out at once) */
    g_queue.cap = 1;
    waiter_init(&g_queue, &w, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_TIMEOUT);
    assert_int_equal(g_queue.wait_count, 1);
    assert_int_equal(g_queue.peak_depth, 1);
    assert_books(&g_pool, 0, 1, 0);

    /* never: the prompt is longer than any context, even with a full
     * queue (NEVER is said before FULL) */
    g_queue.cap = 0;
    waiter_init(&g_queue, &w, 5000, 10, -1);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_NEVER);
    assert_int_equal(w.grant.worker, -1);
    assert_int_equal(w.grant.reason[0], RT_SKIP_CTX);
    assert_true(w.grant.skipped & RT_SKIP_CTX);
    g_queue.cap = 8;

    /* never: every worker tried */
    bool tried[RT_MAX_WORKERS] = {[0] = true};
    waiter_init(&g_queue, &w, 100, 50, -1);
    w.tried = tried;
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_NEVER);
    assert_int_equal(w.grant.reason[0], RT_SKIP_TRIED);

    /* never: a resume, and the only worker is kind = openai */
    g_pool.w[0].cfg.kind = RT_KIND_OPENAI;
    waiter_init(&g_queue, &w, 100, 50, -1);
    w.need.resume = true;
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_NEVER);
    assert_int_equal(w.grant.reason[0], RT_SKIP_KIND);
    g_pool.w[0].cfg.kind = RT_KIND_SPILLWAY;

    /* never: more KV than the whole budget */
    pool_memory(&g_pool, 0, 10239);
    waiter_init(&g_queue, &w, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_NEVER);
    assert_int_equal(w.grant.reason[0], RT_SKIP_MEM);
    g_pool.w[0].kv_budget = -1;

    /* a worker down, held or busy is not NEVER: it may come back */
    g_pool.w[0].state = WS_DOWN;
    g_pool.w[0].held = true;
    waiter_init(&g_queue, &w, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_TIMEOUT);
    g_pool.w[0].state = WS_READY;
    g_pool.w[0].held = false;

    /* deadline: 100 + 500 ms predicted even idle */
    g_pool.w[0].prefill_rate = 1000;
    g_pool.w[0].decode_rate = 100;
    waiter_init(&g_queue, &w, 100, 50, 599);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_DEADLINE);
    assert_int_equal(w.grant.reason[0], RT_SKIP_DEADLINE);
    assert_true(near(w.grant.best_pred_ms, 600));
    /* in time, but busy: waits */
    waiter_init(&g_queue, &w, 100, 50, 600);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_TIMEOUT);
    /* in time and free: granted at once (no time has passed in the queue) */
    g_pool.w[0].books.seqs = 0;
    waiter_init(&g_queue, &w, 100, 50, 600);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_OK);
    assert_int_equal(w.grant.worker, 0);
    assert_true(near(w.grant.best_pred_ms, 600));
    rt_queue_release(&g_queue, 0, w.grant.kv_bytes, NULL);
    /* a deadline on a worker without rates: admitted as the fallback */
    g_pool.w[0].prefill_rate = 0;
    waiter_init(&g_queue, &w, 100, 50, 1);
    assert_int_equal(admit_now(&g_queue, &w), RT_ADMIT_OK);
    assert_true(w.grant.rates_unknown);
    rt_queue_release(&g_queue, 0, w.grant.kv_bytes, NULL);

    /* the router stopping: a request that must wait is told so */
    g_pool.w[0].books.seqs = 1;
    g_stop = 1;
    waiter_init(&g_queue, &w, 100, 50, -1);
    double waited;
    assert_int_equal(rt_queue_admit(&g_queue, &w, 60, -1, &g_stop, &waited), RT_ADMIT_STOPPED);
    g_stop = 0;

    assert_int_equal(g_queue.depth, 0);
    assert_books(&g_pool, 0, 1, 0);
}

/* Retry-After: the depth over the drain rate, 1..60 s, the fallback when
 * nothing was admitted lately. */
static void test_queue_retry_after(void **state)
{
    (void)state;
    pool_fill(&g_pool, 1);
    rt_queue_init(&g_queue, &g_pool, 8);
    static const struct {
        double rate;
        int depth;
        double fallback_s;
        int want;
    } rows[] = {
        {0, 0, 5, 5},       /* no rate: the fallback */
        {0, 50, 2.5, 3},    /* rounded up; the depth does not count */
        {0, 0, 0.2, 1},     /* at least 1 */
        {0, 0, 0, 1},
        {0, 0, -3, 1},
        {0, 0, 120, 60},    /* at most 60 */
        {2, 3, 99, 2},      /* (3 + 1) / 2 */
        {2, 4, 99, 3},      /* 2.5 up */
        {100, 0, 99, 1},    /* 0.01 s: 1 */
        {0.01, 0, 1, 60},   /* 100 s: 60 */
        {1, 59, 1, 60},
        {1, 60, 1, 60},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        g_queue.rate = rows[i].rate;
        g_queue.depth = rows[i].depth;
        pthread_mutex_lock(&g_pool.mu);
        int got = rt_queue_retry_after_locked(&g_queue, rows[i].fallback_s);
        pthread_mutex_unlock(&g_pool.mu);
        if (got != rows[i].want)
            print_error("row %zu: rate %g depth %d fallback %g: %d, want %d\n", i, rows[i].rate,
                        rows[i].depth, rows[i].fallback_s, got, rows[i].want);
        assert_int_equal(got, rows[i].want);
    }
    g_queue.depth = 0;
    g_queue.rate = 0;
    /* a fallback that is not a number is 1, not undefined */
    pthread_mutex_lock(&g_pool.mu);
    int nan_s = rt_queue_retry_after_locked(&g_queue, NAN);
    pthread_mutex_unlock(&g_pool.mu);
    assert_int_equal(nan_s, 1);
}

/* ---- the threaded test: grants in ticket order -------------------------- */

typedef struct qthread {
    rt_waiter w;
    pthread_t th;
    bool started;
    rt_admit_result res;
    double waited;
} qthread;

static void *admit_thread(void *arg)
{
    qthread *t = arg;
    /* a long limit: a missing grant fails the checks below, the time-out
     * only keeps the test from hanging */
    t->res = rt_queue_admit(&g_queue, &t->w, 30, -1, &g_stop, &t->waited);
    return NULL;
}

static int queue_depth(void)
{
    pthread_mutex_lock(&g_pool.mu);
    int d = g_queue.depth;
    pthread_mutex_unlock(&g_pool.mu);
    return d;
}

/* Waits (at most ~10 s) until depth waiters are linked. */
static bool wait_depth(int depth)
{
    for (int i = 0; i < 10000; i++) {
        if (queue_depth() == depth)
            return true;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

/* Which of the three not in done[] is granted now (-1 none, -2 more than
 * one). A waiter stays granted once it is. */
static int granted_now(qthread *t, const bool *done)
{
    int g = -1;
    pthread_mutex_lock(&g_pool.mu);
    for (int k = 0; k < 3; k++)
        if (!done[k] && t[k].w.granted)
            g = g == -1 ? k : -2;
    pthread_mutex_unlock(&g_pool.mu);
    return g;
}

/* A worker with max-seqs 1, occupied; three waiters with tickets 0 < 1 <
 * 2 (by position in t[]) start in start_order, each after the one before
 * is linked; then releases one by one: each grants exactly the next
 * ticket, inside rt_queue_release. */
static void run_fifo(const int start_order[3])
{
    g_failures = 0;
    g_stop = 0;
    pool_fill(&g_pool, 1);
    g_pool.w[0].slots_max = 1;
    g_pool.w[0].prefill_rate = 1000;
    g_pool.w[0].decode_rate = 100;
    pool_memory(&g_pool, 0, 1 << 20);
    rt_queue_init(&g_queue, &g_pool, 8);

    rt_waiter occupant;
    waiter_init(&g_queue, &occupant, 100, 50, -1);
    assert_int_equal(admit_now(&g_queue, &occupant), RT_ADMIT_OK);
    assert_int_equal(occupant.ordinal, 1);

    static qthread t[3];
    memset(t, 0, sizeof t);
    for (int k = 0; k < 3; k++)
        waiter_init(&g_queue, &t[k].w, 100, 50, -1); /* tickets in t[] order */
    for (int s = 0; s < 3; s++) {
        qthread *th = &t[start_order[s]];
        if (pthread_create(&th->th, NULL, admit_thread, th) != 0) {
            EXPECT(false, "pthread_create");
            break;
        }
        th->started = true;
        EXPECT(wait_depth(s + 1), "waiter %d never linked (depth %d)", start_order[s],
               queue_depth());
    }
    bool done[3] = {false, false, false};
    EXPECT(granted_now(t, done) == -1, "granted while the worker is occupied");

    /* the waiters ahead count in a deadline's predicted wait: three ahead
     * at 2 admissions a second is 1500 ms, but each is 600 ms of work on
     * the one sequence by the worker's rates, so at least 1800 ms; plus
     * its own 600 ms */
    pthread_mutex_lock(&g_pool.mu);
    g_queue.rate = 2;
    pthread_mutex_unlock(&g_pool.mu);
    rt_waiter late;
    waiter_init(&g_queue, &late, 100, 50, 2399);
    EXPECT(admit_now(&g_queue, &late) == RT_ADMIT_DEADLINE, "a deadline behind three waiters");
    EXPECT(near(late.grant.best_pred_ms, 2400), "predicted %g ms, want 2400",
           late.grant.best_pred_ms);
    /* with a fast worker the admissions' rate is the larger: 1500 + 6 */
    pthread_mutex_lock(&g_pool.mu);
    g_pool.w[0].prefill_rate = 100000;
    g_pool.w[0].decode_rate = 10000;
    pthread_mutex_unlock(&g_pool.mu);
    waiter_init(&g_queue, &late, 100, 50, 1505);
    EXPECT(admit_now(&g_queue, &late) == RT_ADMIT_DEADLINE, "a deadline behind three waiters");
    EXPECT(near(late.grant.best_pred_ms, 1506), "predicted %g ms, want 1506",
           late.grant.best_pred_ms);
    pthread_mutex_lock(&g_pool.mu);
    g_pool.w[0].prefill_rate = 1000;
    g_pool.w[0].decode_rate = 100;
    pthread_mutex_unlock(&g_pool.mu);
    waiter_init(&g_queue, &late, 100, 50, 2400);
    EXPECT(admit_now(&g_queue, &late) == RT_ADMIT_TIMEOUT, "a deadline just in time waits");
    EXPECT(queue_depth() == 3, "depth %d after the deadline checks", queue_depth());
    EXPECT(granted_now(t, done) == -1, "granted by a leaving waiter");

    int64_t share = occupant.grant.kv_bytes;
    for (int k = 0; k < 3; k++) {
        rt_queue_release(&g_queue, 0, share, NULL);
        int g = granted_now(t, done);
        EXPECT(g == k, "release %d granted waiter %d, want %d (ticket order)", k, g, k);
        EXPECT(queue_depth() == 2 - k, "depth %d after release %d", queue_depth(), k);
        if (g < 0)
            break;
        done[g] = true;
        share = t[g].w.grant.kv_bytes;
        pthread_mutex_lock(&g_pool.mu);
        int seqs = g_pool.w[0].books.seqs;
        pthread_mutex_unlock(&g_pool.mu);
        EXPECT(seqs == 1, "books hold %d sequences after release %d", seqs, k);
    }

    /* clean up whatever happened: stop the rest, then join */
    g_stop = 1;
    for (int k = 0; k < 3; k++)
        if (t[k].started)
            pthread_join(t[k].th, NULL);
    g_stop = 0;
    for (int k = 0; k < 3; k++) {
        EXPECT(t[k].res == RT_ADMIT_OK, "waiter %d: result %d", k, (int)t[k].res);
        EXPECT(t[k].w.ordinal == (uint64_t)k + 2, "waiter %d: ordinal %llu, want %d", k,
               (unsigned long long)t[k].w.ordinal, k + 2);
    }
    if (t[2].res == RT_ADMIT_OK)
        rt_queue_release(&g_queue, 0, t[2].w.grant.kv_bytes, NULL);
    pthread_mutex_lock(&g_pool.mu);
    EXPECT(g_pool.w[0].books.seqs == 0 && g_pool.w[0].books.kv_bytes == 0,
           "books not empty at the end: %d seqs, %lld bytes", g_pool.w[0].books.seqs,
           (long long)g_pool.w[0].books.kv_bytes);
    EXPECT(g_queue.passes == 0, "%llu passes", (unsigned long long)g_queue.passes);
    EXPECT(g_queue.peak_depth == 4, "peak depth %d", g_queue.peak_depth);
    EXPECT(g_queue.depth == 0, "depth %d at the end", g_queue.depth);
    pthread_mutex_unlock(&g_pool.mu);
    assert_int_equal(g_failures, 0);
}

static void test_queue_fifo_arrival_order(void **state)
{
    (void)state;
    static const int order[3] = {0, 1, 2};
    run_fifo(order);
}

/* Requests coming back (refused, replayed) keep their ticket: started in
 * reverse, they are still granted earliest ticket first. */
static void test_queue_fifo_ticket_order(void **state)
{
    (void)state;
    static const int order[3] = {2, 0, 1};
    run_fifo(order);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_table),
        cmocka_unit_test(test_policy_tried_null),
        cmocka_unit_test(test_policy_kv_bytes),
        cmocka_unit_test(test_failover_table),
        cmocka_unit_test(test_failover_outcome_names),
        cmocka_unit_test_teardown(test_queue_grant_and_release, queue_teardown),
        cmocka_unit_test_teardown(test_queue_prefix_placement, queue_teardown),
        cmocka_unit_test_teardown(test_shared_blocks_once, queue_teardown),
        cmocka_unit_test_teardown(test_queue_memory_books, queue_teardown),
        cmocka_unit_test_teardown(test_queue_refusals, queue_teardown),
        cmocka_unit_test_teardown(test_queue_shared_device, queue_teardown),
        cmocka_unit_test_teardown(test_queue_retry_after, queue_teardown),
        cmocka_unit_test_teardown(test_queue_fifo_arrival_order, queue_teardown),
        cmocka_unit_test_teardown(test_queue_fifo_ticket_order, queue_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
