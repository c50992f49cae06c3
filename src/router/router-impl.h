/* router-impl.h - what the router's files share: the router (its pieces
 * and the state they share), the request being served, and the helpers
 * each part offers the others. Private to src/router.
 *
 * The router is handed to every part, as a libuv handle: rt_serve owns
 * the one rt_router (router.c; no other file names it) and passes a
 * pointer to it down. A function that serves a request reaches it as
 * q->rt (rt_req.rt); one that serves none takes an rt_router *rt as its
 * first parameter.
 *
 *   router.c            rt_serve: start-up, shutdown; events
 *   router_conns.c      the connection threads (each accepts for itself)
 *   router_http.c       the client side: request parsing, limits, keys,
 *                       responses, /health, /metrics, /v1/models, events
 *   router_relay.c      one generation request: parse once, admit, attempt,
 *                       fail over (the pieces below, in this order)
 *   router_pool.c       the worker table and the books (its own lock)
 *   router_policy.c     which worker takes a request, or why none (pure)
 *   router_queue.c      the FIFO admission queue, woken on released capacity
 *   router_attempt.c    one exchange with one upstream, ending in an outcome
 *   router_sink.c       where the answer goes: client, capture, agent callback
 *   router_failover.c   replay / resume / requeue / stop (pure; DESIGN.md's table)
 *   router_supervisor.c spawn, reap, restart, /health polling into the pool
 *   router_idem.c       Idempotency-Key: stored responses, replay
 *   router_lease.c      the ledger leases' keeper; 503 ledger_unavailable
 *   router_jobs.c       /v1/spillway/jobs and the job runner threads
 *   router_responses.c  /v1/responses: OpenAI's Responses API on the chat
 *                       route, stored responses, background ones as jobs
 *   router_agent.c      agent runs ("tool_execution": "server"), tool calls
 *   router_stats.c      the activity ring, /v1/spillway/stats, the drill
 *                       report routes
 *   router_events.c     /v1/spillway/events/stream (server-sent events)
 *   router_dashboard.c  /dashboard (the page, embedded at build time)
 *   router_reload.c     SIGHUP and POST /v1/spillway/reload: the file read
 *                       again, workers added, drained, restarted
 *   router_demand.c     workers on demand: started for a waiting request,
 *                       stopped when idle or to make room
 *   router_command.c    an engine the router runs (command =): its argv
 *   router_llamaserver.c kind = llama-server: health figures, the native
 *                       stream with token ids, its typed errors
 *   router_image.c      image content parts: checked, routed only to a
 *                       worker that takes images, counted in the books
 *
 * Lock order: the pool's (rt_pool.mu, which also guards the queue), then
 * the router's (rt_router.mu); no other lock is held while taking either.
 */
#ifndef SPILLWAY_ROUTER_IMPL_H
#define SPILLWAY_ROUTER_IMPL_H

#include "router/router.h"
#include "router/router_pool.h"
#include "router/router_queue.h"
#include "router/router_failover.h"

#include "common/alloc.h"
#include "ledger/ledger.h"

#include "gguf/gguf_cache.h"
#include "chat/chat_template.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define RT_EVENTS 128
/* event streams open at once (/v1/spillway/events/stream); they do not
 * count against max-connections */
#define RT_MAX_STREAMS 16
/* the activity ring: RT_STATS_SLOTS slots of RT_STATS_SLOT_S seconds each
 * (the last 10 minutes) */
#define RT_STATS_SLOTS 60
#define RT_STATS_SLOT_S 10

/* One slot of the activity ring (router_stats.c): what ended in one
 * RT_STATS_SLOT_S window. Guarded by rt_router.mu. */
typedef struct rt_stats_slot {
    int64_t epoch;               /* monotonic seconds / RT_STATS_SLOT_S, plus 1;
                                    0 empty */
    uint64_t requests, failed, failovers, tokens;
    uint64_t waits;              /* admissions that got a worker or timed out */
    double wait_s;               /* their queue waits, summed */
    uint64_t w_requests[RT_MAX_WORKERS], w_tokens[RT_MAX_WORKERS]; /* by pool index */
} rt_stats_slot;

/* SPILLWAY_SABOTAGE switches (docs/router.md, Sabotage): each disables one
 * safety so the drill can show that its scenario detects the loss. */
typedef struct rt_sabotage {
    bool no_replay, no_resume, no_tool_ledger, no_restart, no_deadline;
} rt_sabotage;

struct rt_jobs;

/* A model the router serves (fixed from start to exit): its id, the
 * tokenizer and chat family its prompts are counted with. */
typedef struct rt_model {
    rt_model_config cfg;       /* name: the id (resolved for a [model]
                                  section without one) */
    eng_tokenizer *tok;
    eng_chat_family family;
    /* its attention cache, from the file's metadata (router_books.c);
     * cache_error: why it could not be read ("" read) */
    eng_gguf_cache_shape cache;
    char cache_error[SW_ERROR_MESSAGE_MAX];
    uint64_t weights_bytes;    /* the file's tensors */
} rt_model;

/* A configuration a reload replaced, kept until the router ends: a
 * request that began before it may still read it. */
typedef struct rt_retired {
    rt_config *cfg;
    struct rt_retired *next;
} rt_retired;

/* The router: its pieces and what they share. mu guards the metrics,
 * the event ring and the idle connections; the pool has its own lock,
 * which also guards the queue. */
typedef struct rt_router {
    /* the running configuration: read as rt->cfg->KEY (an atomic load of
     * the pointer); a reload publishes a new one whole (router_reload.c).
     * Its workers are what the router started with: the pool has the
     * live ones. */
    const rt_config *_Atomic cfg;
    const rt_config *first_cfg;  /* rt_serve's caller's; never freed here */
    rt_retired *retired;         /* guarded by the reload lock */
    uint64_t reloads_ok, reloads_failed;
    atomic_int reload_signal;    /* SIGHUP seen, the main thread reloads */
    pthread_mutex_t mu;
    rt_pool pool;               /* the workers and the books */
    rt_queue queue;             /* requests waiting for a worker */
    struct {                    /* the connection threads (router_conns.c) */
        int lfd;                /* the listening socket */
        int cap;                /* threads at most */
        int threads, waiting;   /* running; in accept now (atomics) */
        int closing;            /* atomic */
    } conns;
    rt_model models[RT_MAX_MODELS];
    int n_models;
    int default_model;          /* a request without "model" goes there */
    bool route_by_model;        /* [model NAME] sections: the router picks
                                   the model's workers by "model"; a [model]
                                   section alone leaves "model" to them */
    /* set by the signal handler, read by every thread: a lock-free
     * atomic (async-signal-safe, C11 7.14.1.1), not a volatile
     * sig_atomic_t, which is safe for the handler's own thread only */
    atomic_int stop;
    /* stop-delay-ms: while armed (serving, a delay configured) the first
     * SIGTERM/SIGINT sets drain_signal instead of stop; the main thread
     * then sets draining (/health answers 503), and stop once the delay
     * is over. A second signal stops at once. */
    atomic_int drain_armed, drain_signal, draining;
    int active_conns;
    uint64_t seq;
    char *events[RT_EVENTS];
    char events_type[RT_EVENTS][24]; /* each record's "type": the SSE event name */
    int n_events, next_event;
    uint64_t events_total;      /* events recorded since the start (the last
                                   one's stream id) */
    pthread_cond_t events_cond; /* broadcast on each event and at shutdown
                                   (CLOCK_MONOTONIC); waited on with mu */
    int n_streams;              /* event streams open (not in active_conns) */
    rt_stats_slot stats[RT_STATS_SLOTS];
    double started_at;          /* monotonic */
    uint64_t failovers_oom, failovers_crash, rejected_capacity, rejected_auth, rejected_bad;
    uint64_t requests_total;
    /* requests answered without a worker, by reason */
    uint64_t refused_queue_full, refused_queue_timeout, refused_deadline, refused_context;
    uint64_t lat_buckets[12], ttft_buckets[12];
    uint64_t lat_count, ttft_count;
    double lat_sum, ttft_sum;
    ldg_ledger *ledger;
    /* 0 after a ledger call found the database unreachable
     * (SW_EUNAVAILABLE), 1 after one reached it (router_lease.c) */
    atomic_int ledger_reachable;
    /* a shared ledger (under mu): jobs this router's runners claimed from
     * it (another router's, or one whose router died), and results it
     * dropped because the fence refused them (taken over meanwhile) */
    uint64_t jobs_claimed, fenced_jobs, fenced_keys;
    rt_sabotage sabotage;
    /* SPILLWAY_FAULT modes of the router itself (crash tests) */
    bool fault_exit_after_tool_started, fault_exit_after_tool_called;
    struct rt_jobs *jobs;
    uint64_t idem_replays, tool_calls, tool_reused, jobs_done, jobs_failed;
    /* keep-alive connections waiting for their next request, oldest
     * first (router_http.c); a new connection closes the oldest one when
     * max-connections is reached (rt__evict_idle) */
    struct rt_idle *idle_head, *idle_tail;
    int n_idle;
    uint64_t keepalive_evictions, keepalive_reused;
    uint64_t ledger_swept;      /* rows deleted by the retention sweep */
    uint64_t async_fallbacks;   /* requests queued as jobs (Prefer: respond-async) */
    uint64_t continues_sent;    /* 100 Continue interim responses */
    /* capacity fallbacks to another model, by [from][to] model index and
     * reason (RT_FALLBACK_REASONS, router_relay.c) */
#define RT_FALLBACK_REASONS 4
    uint64_t capacity_fallbacks[RT_MAX_MODELS][RT_MAX_MODELS][RT_FALLBACK_REASONS];
} rt_router;

/* A connection idle between two requests (lives on its thread's stack;
 * linked under rt_router.mu). */
typedef struct rt_idle {
    int fd;
    bool evicted;            /* a new connection took its slot */
    struct rt_idle *prev, *next;
} rt_idle;

/* When max-connections is reached: unlinks the oldest idle keep-alive
 * connection, shuts its socket down and hands its slot to the caller
 * (active_conns unchanged); false when none is idle. Called with
 * rt->mu held. */
bool rt__evict_idle_locked(rt_router *rt);

/* What a request sent, kept when capture is on: for the Idempotency-Key
 * store, the jobs and the agent loop's inner generations. A stream is
 * kept as its SSE text ("data: ...\n\n" events). */
#define RT_CAPTURE_MAX ((size_t)64 << 20)
typedef struct rt_capture {
    bool on;
    int status;              /* 0 until a response began */
    char content_type[64];
    bool stream;
    char *body;              /* sw_free (rt__capture_free) */
    size_t len, cap;
    bool overflow;           /* over RT_CAPTURE_MAX: incomplete */
    bool hold;               /* a whole (not streamed) answer is kept in held,
                                not written, until rt__capture_release: an
                                Idempotency-Key's answer goes out only after
                                the ledger has it */
    char *held;              /* the answer's bytes, head and body (sw_free) */
    size_t held_len;
} rt_capture;

void rt__capture_free(rt_capture *c);
int rt__capture_append(rt_capture *c, const void *p, size_t n);

/* One client request (one of the requests a keep-alive connection
 * serves), or one the router makes itself (a job, an agent step: fd -1,
 * capture on). */
typedef struct rt_req {
    rt_router *rt;           /* the router serving it */
    int fd;
    bool keep_alive;         /* the response says Connection: keep-alive */
    bool chunked_open;       /* a chunked response began and has not ended */
    bool write_failed;       /* a write to the client failed */
    bool responded;          /* something was written to the client */
    char method[16];
    char path[256];
    char request_id[80];
    char auth[256];
    char origin[256];        /* Origin (a browser's page), "" none */
    const char *cors_allow;  /* its Access-Control-Allow-Origin, NULL: none */
    long long deadline_ms;   /* -1 none */
    char *body;
    size_t body_len;
    char worker[64];
    const char *remote_route;  /* "routine" or "capacity" when q->worker is a remote
                                  service (X-Spillway-Remote-Route); else NULL */
    int model;               /* index into rt->models of the model that
                                serves it (0 until its body is read) */
    int asked_model;         /* the one the body asked for (a capacity
                                fallback changes model, not this) */
    bool no_fallback;        /* X-Spillway-Fallback: none */
    int attempts;
    char idem_key[256];      /* Idempotency-Key, "" none */
    bool idem_key_bad;       /* present but not 1..255 printable ASCII */
    rt_capture cap;
    bool single_pass;        /* a worker failure ends it (worker_failed) */
    bool worker_failed;      /* it ended because a worker failed */
    bool body_edited;        /* the parsed body no longer says what body (text) does */
    rt_outcome outcome;      /* how its last attempt ended (router_failover.h) */
    int outcome_kind;        /* RT_KIND_* of the worker of that attempt */
    bool completed;          /* a full answer (or a final 4xx) was sent */
    bool tried[RT_MAX_WORKERS]; /* workers already tried (failed) */
    const char *error_code;  /* code of an error the router sent itself */
    /* An agent run's generation: the relay records no failover event but
     * leaves its first_error here (the caller owns it); the run records
     * one event that says how the whole run ended. */
    bool defer_event;
    json_t *failover_first_error;
    /* An agent run's streamed generation (router_agent.c): it has no
     * client socket, and each SSE payload the relay would send the client
     * goes to on_event instead, which writes what the client should see
     * (the final answer's text as it comes; nothing of a tool-call
     * generation). 0 to go on, -1 when the client is gone. NULL: the
     * ordinary relay. */
    int (*on_event)(struct rt_req *q, const char *payload);
    void *on_event_ctx;
    /* on_event writes the capture itself (what the client sees), instead
     * of rt_sink_event capturing the payload (router_responses.c) */
    bool on_event_captures;
    /* A whole answer (or error) goes to on_body instead, which sends what
     * the client should see with rt__send_response (a POST /v1/responses:
     * the chat answer as a Response, an error naming the Responses
     * parameter; router_responses.c). NULL: as is. */
    void (*on_body)(struct rt_req *q, int status, const char *ctype, const char *extra,
                    const char *body, size_t len);
    /* POST /v1/messages and /v1/messages/count_tokens (router_messages.c):
     * every whole answer, errors included, goes out in Anthropic's shape */
    bool messages;
    /* Prefer: respond-async (RFC 7240): when admission would answer 503
     * capacity_exceeded, the request is stored as a job and answered 202
     * instead (router_jobs.c, rt__jobs_accept_async) */
    bool prefer_async;
    long long job_deadline_ms; /* X-Spillway-Job-Deadline-Ms, -1 none */
    /* admission (router_queue.h): the place in arrival order, the
     * ordinal of its first admission (X-Spillway-Admission) and the time
     * it waited (X-Spillway-Queue-Ms); 0 before */
    uint64_t ticket, admission;
    double queue_ms;
    /* its attempts are recorded in the ledger: an Idempotency-Key, a job
     * or an agent run (durability promised); else only in memory and
     * the event log */
    bool durable;
    /* X-Spillway-Fault (tests; common/alloc.h, fault scopes): from its
     * header line to the end of the request, the allocations of the
     * request's thread are counted and the one asked for fails */
    bool fault_scoped;
    sw_alloc_scope fault_scope;
    sw_alloc_scope *fault_prev; /* the thread's scope before */
    /* POST /v1/embeddings (router_embeddings.c): relayed as a completion
     * that generates nothing, never streamed, never made a job */
    bool embeddings;
} rt_req;

/* Writes the answer held back (cap.hold) to the client, if any. */
void rt__capture_release(rt_req *q);

double rt__now_s(void);  /* monotonic */
double rt__wall_s(void); /* Unix time */
/* Histogram bucket bounds (seconds); the 12th bucket is +Inf. */
extern const double rt__hist_le[11];

/* supervisor */
void rt__sup_pass(rt_router *rt, bool force_health);
void *rt__sup_thread(void *arg); /* arg: the rt_router */
void rt__stop_workers(rt_router *rt);

/* an engine the router runs (router_command.c) */
#define RT_CMD_MAX_ARGS 64
/* Registers every worker reached over TLS or with a key (router_tls.h):
 * the key of its api-key-env read from the environment now (unset: an
 * error naming the worker), its ca-file loaded. At start and at reload;
 * 0 or the error. */
int rt__upstreams_register(const rt_config *c, sw_error *err);
/* A free loopback port, as address "http://127.0.0.1:PORT"; 0 or -1. */
int rt__pick_port(char *address, size_t cap);
/* Worker w's command as an argv (strings in buf, at most max - 1, NULL
 * after them) with {host} {port} {model_path} substituted, and the
 * program's path into exe; SW_EINVAL naming what is wrong. */
int rt__command_argv(const rt_worker *w, const char *model_path, char *buf, size_t cap,
                     const char **argv, int max, char *exe, size_t exe_cap, sw_error *err);

/* workers on demand (router_demand.c), with the pool's lock */
/* Once per supervision pass: idle ones stopped, stopped ones a waiting
 * request needs started (or room made for them). */
void rt__demand_pass_locked(rt_router *rt, double t);
/* Worker w answered its first ready /health since its spawn. */
void rt__demand_ready_locked(rt_router *rt, rt_worker *w);
/* After each /health: its idle footprint, when it is idle. */
void rt__demand_learn_locked(rt_worker *w);

/* events */
void rt__ev_record(rt_router *rt, json_t *ev);
/* GET /v1/spillway/events/stream: the recorded events, then each new one
 * as it is recorded, until the client leaves or the router stops
 * (router_events.c). The connection ends after it. */
void rt__handle_events_stream(rt_req *q);
/* Shutdown: wakes every event stream (they end). */
void rt__events_wake(rt_router *rt);

/* the activity ring and the snapshot routes (router_stats.c) */
/* One attempt ended on pool worker wi: ok (answered: 2xx or a 4xx the
 * worker gave), failed (oom or crash), tokens generated. */
void rt__stats_attempt(rt_router *rt, int wi, bool answered, bool failed, uint64_t tokens);
void rt__stats_failover(rt_router *rt);
/* An admission ended after waited_s in the queue (got a worker or timed
 * out: the queue-wait histogram's waits). */
void rt__stats_wait(rt_router *rt, double waited_s);
/* With rt->pool.mu held: worker w as /health and /v1/spillway/stats show it. */
json_t *rt__worker_json_locked(const rt_router *rt, const rt_worker *w);
/* What a worker runs on, as the start-up lines, /v1/spillway/stats and
 * the dashboard name it: its device, "remote" for a service that is not
 * on this machine (rt_config_worker_remote), else "cpu". */
const char *rt__worker_device(const rt_worker_config *c);
void rt__handle_stats(rt_req *q);
/* GET /v1/spillway/drill and /v1/spillway/drill/FILE */
void rt__handle_drill(rt_req *q);
/* GET /dashboard (router_dashboard.c) */
void rt__handle_dashboard(rt_req *q);
/* Slot wi takes a new worker: its columns of the activity ring are
 * cleared (takes rt->mu; may be called with the pool's lock held). */
void rt__stats_clear_worker(rt_router *rt, int wi);

/* reload (router_reload.c) */
/* Reads the configuration file again and applies it; origin names the
 * trigger in the log. 0 and *answer (the summary: workers added, removed,
 * restarted, unchanged; settings applied and those that need a restart),
 * or an error with err naming the file's line and key: then nothing
 * changed. */
int rt__reload(rt_router *rt, const char *origin, json_t **answer, sw_error *err);
/* POST /v1/spillway/reload */
void rt__handle_reload(rt_req *q);
/* At the end: every configuration a reload allocated. */
void rt__reload_free_retired(rt_router *rt);

/* responses */
void rt__send_response(rt_req *q, int status, const char *ctype, const char *extra,
                       const char *body, size_t len);
json_t *rt__error_obj(int status, const char *code, const char *msg, const char *param);
void rt__send_error(rt_req *q, int status, const char *code, const char *msg,
                    const char *param, const char *extra);
/* The longest request head a client may send. */
#define RT_HEAD_MAX 16384
/* Serves one client connection to its end (router_http.c). buf: the
 * calling thread's RT_HEAD_MAX + 1 bytes for the request heads, kept
 * from one connection to the next (NULL: one of its own for this one). */
void rt__conn_serve(rt_router *rt, int fd, char *buf);
/* Starts the connection threads, which accept on lfd themselves
 * (router_conns.c); 0, or -1 when none could be started. */
int rt__conns_start(rt_router *rt, int lfd);
/* Shutdown: no connection is accepted any more; returns once no thread
 * is in accept on the listening socket (at most 1 s). */
void rt__conns_close(rt_router *rt);
int rt__listen_on(const char *addr, char *actual, size_t cap);

/* Writes to the client (when fd >= 0); -1 when it is gone. */
int rt__sink_write(rt_req *q, const void *p, size_t n);

/* "keep-alive" or "close": the Connection header of q's response. */
const char *rt__conn_hdr(const rt_req *q);
/* Writes the head of a 200 SSE response (chunked; X-Request-Id, the
 * worker, attempts and admission headers) and starts the capture's
 * stream; -1 when the client is gone. */
int rt__stream_begin(rt_req *q);
/* A chunked response to the client began / ended with its last chunk
 * ("0\r\n\r\n" written): only an ended one lets the connection go on. */
void rt__chunked_begin(rt_req *q);
void rt__chunked_end(rt_req *q);

/* The "Retry-After: N\r\n" header line of a capacity answer, N from the
 * queue's drain rate (router_queue.h) */
void rt__retry_after(rt_router *rt, char *buf, size_t cap);
/* The reasons of a capacity fallback, as metrics and events name them:
 * queue_full, deadline, queue_timeout, no_capacity. */
extern const char *const rt__fallback_reasons[RT_FALLBACK_REASONS];
/* The model a request's "model" names (id or alias; absent or null: the
 * default), -1 when none (router_relay.c). */
int rt__model_find(const rt_router *rt, const char *id);
/* generation requests */
void rt__handle_generate(rt_req *q, bool chat);
/* A generation route: an agent run when the body asks for
 * "tool_execution": "server", else rt__handle_generate. */
void rt__dispatch_generate(rt_req *q, bool chat);
/* POST /tokenize, relayed to a ready worker of the model. */
void rt__handle_tokenize(rt_req *q);
/* router_embeddings.c: an embeddings body's tokens as the worker counts
 * them: the longest input's (what one sequence holds, the KV the books
 * take) returned, every input's together in *total (the prefill work);
 * -1 when the body will be refused (the worker says why). */
long rt__embeddings_tokens(const rt_model *m, json_t *body, long *total);
/* Runs body (JSON text) as a non-streaming request without a client
 * socket; the answer the client would have got is in out (status, body;
 * rt__capture_free). request_id is kept on every attempt. *ticket: its
 * place in the queue's arrival order, taken on the first call (0) and
 * kept by the caller for the next tries, so a job that tries again keeps
 * its place. */
void rt__generate_capture(rt_router *rt, const char *request_id, bool chat, const char *body,
                          size_t len, long long deadline_ms, uint64_t *ticket, rt_capture *out,
                          int *attempts);

/* POST /v1/responses, GET and DELETE /v1/responses/{id} (router_responses.c) */
void rt__handle_responses(rt_req *q);

/* agent runs (router_agent.c); body is the parsed request */
void rt__handle_agent(rt_req *q, json_t *body);

/* Anthropic's Messages API (router_messages.c) */
/* Whether path is /v1/messages or /v1/messages/count_tokens. */
bool rt__messages_path(const char *path);
/* POST /v1/messages (relayed as chat completions) or count_tokens. */
void rt__handle_messages(rt_req *q);
/* A JSON answer (status, body) to a Messages request in Anthropic's
 * shape (sw_free; its length into *out_len), NULL to send it as it is. */
char *rt__messages_body(int status, const char *body, size_t len, size_t *out_len);

/* Idempotency-Key around a handler (router_idem.c) */
void rt__with_idempotency(rt_req *q, void (*handler)(rt_req *q, bool chat), bool chat);
/* Keys whose final write (store, forget) failed because the ledger was
 * away stay running under this router's lease; they are marked abandoned
 * here once it is back (called by the lease keeper), so a retry runs them
 * again instead of being told 409 until they expire. */
void rt__idem_settle_pending(rt_router *rt);

/* the ledger's leases and its absence (router_lease.c) */
/* Retry-After (seconds) of a 503 ledger_unavailable: the ledger reconnects
 * on a later call, at most twice a second. */
#define RT_LEDGER_RETRY_AFTER_S 2
/* Starts the lease keeper (renews this router's leases every third of
 * the lease); 0, or -1 when the thread could not be started. */
int rt__lease_start(rt_router *rt);
void rt__lease_stop(rt_router *rt);
/* 503 ledger_unavailable with Retry-After, for a request that needs the
 * ledger (durability promised) when a ledger call failed with err (may
 * be NULL); msg says what could not be done. Logged at most every few
 * seconds when the ledger is unreachable. */
void rt__ledger_unavailable(rt_req *q, const char *msg, const sw_error *err);
/* Before a request whose answer is to be stored (a stored Response, an
 * agent run): whether the ledger answers now; when it does not, q got its
 * 503 and the caller stops. */
bool rt__ledger_ready(rt_req *q);
/* Records what a ledger call returned: SW_EUNAVAILABLE marks the ledger
 * unreachable, SW_OK reachable (/health shows it). */
void rt__ledger_seen(rt_router *rt, int rc);
/* For a best-effort ledger write that failed: true at most once every
 * few seconds, so a ledger that is away does not flood the log. */
bool rt__ledger_warn_due(rt_router *rt);
/* The ledger as /health and /v1/spillway/stats show it: {"backend",
 * "shared", "owner", "lease_s", "reachable"}; NULL without one. */
json_t *rt__ledger_json(rt_router *rt);
/* Retry-After of a 409 idempotency_conflict: 1 s with a ledger of its
 * own, else half the lease (the other router ends, or its lease does). */
int rt__idem_retry_after_s(const rt_router *rt);

/* jobs (router_jobs.c) */
int rt__jobs_start(rt_router *rt);
/* Shutdown, step 1: no job starts any more, and every running job's
 * worker request is aborted (the runner puts the job back to queued).
 * Returns at once; idempotent. */
void rt__jobs_cancel(rt_router *rt);
/* Shutdown, step 2: rt__jobs_cancel, then joins the runners for at most
 * 2 s after the cancel. false when one was left running (stuck in a
 * ledger write or a tool call): the ledger and the tokenizer must then
 * stay allocated until the process exits. */
bool rt__jobs_stop(rt_router *rt);
/* On a job runner thread: the read end of the runners' cancel pipe,
 * which the relay watches as the request's client connection (it hangs
 * up at rt__jobs_cancel); -1 on every other thread. */
extern _Thread_local int rt__job_cancel_fd;
void rt__handle_jobs(rt_req *q);
/* Stores request (a chat or completions body; endpoint "chat" or
 * "completions") as a queued job, committed, and queues it; its id into
 * id. 0, or -1 with err (nothing stored). */
int rt__jobs_submit(rt_router *rt, const char *endpoint, json_t *request, char *id, size_t cap,
                    sw_error *err);
/* The capacity fallback of a client request that sent Prefer:
 * respond-async: stores its body (stream, stream_options and timeout
 * removed) as a job, committed, and answers 202 with the job object,
 * Location and Preference-Applied. Returns 0 when the 202 was sent, -1
 * when the job could not be stored (nothing was sent: the caller answers
 * as it would have). */
int rt__jobs_accept_async(rt_req *q, bool chat);

/* sabotage and router faults, read once at start (router.c) */
void rt__read_switches(rt_router *rt);
/* The X-Spillway-Fault header line of q (its value): opens q's fault
 * scope when this process honours the header (SPILLWAY_FAULT
 * fault_header:1) and the value parses; else nothing. */
void rt__fault_scope_begin(rt_req *q, const char *value);
/* The end of q: its scope, if any, is closed and published. */
void rt__fault_scope_end(rt_req *q);

#endif
