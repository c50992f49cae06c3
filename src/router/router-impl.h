/* router-impl.h - what the router's files share: the worker table, the
 * one mutex-guarded state, the request being served, and the helpers each
 * part offers the others. Private to src/router.
 *
 *   router.c            rt_serve: start-up, the accept loop, shutdown; events
 *   router_supervisor.c spawn, reap, restart, /health polling
 *   router_relay.c      admission, routing, relay, failover and resume
 *   router_http.c       the client side: request parsing, limits, keys,
 *                       responses, /health, /metrics, /v1/models, events
 */
#ifndef SPILLWAY_ROUTER_IMPL_H
#define SPILLWAY_ROUTER_IMPL_H

#include "router/router.h"

#include "engine/chat_template.h"
#include "engine/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum { WS_STARTING, WS_READY, WS_DOWN, WS_SUSPECT };

typedef struct rt_worker {
    rt_worker_config cfg;
    char address[640];          /* unix:PATH or http://HOST:PORT */
    char log_path[600];
    pid_t pid;
    int state;
    double next_start;
    double backoff;
    double started_at;
    double last_health;
    double last_ok;             /* last /health 200 (or the spawn) */
    bool ready_once;            /* ready since the last spawn */
    bool restart_requested;
    int restarts;
    int last_exit;              /* exit status of the last exit, -1 none */
    /* from /health */
    bool on_device;
    int64_t mem_total, mem_used, mem_reserved, mem_free;
    int64_t kv_bpt;
    int32_t ctx_limit;
    double prefill_rate, decode_rate;
    /* metrics */
    uint64_t req_ok, req_client_error, req_failed, tokens;
} rt_worker;

#define RT_EVENTS 128

typedef struct rt__state {
    const rt_config *cfg;
    pthread_mutex_t mu;
    rt_worker w[RT_MAX_WORKERS];
    int order[RT_MAX_WORKERS];  /* preference order */
    int n;
    eng_tokenizer *tok;
    eng_chat_family family;
    volatile sig_atomic_t stop;
    int active_conns;
    uint64_t seq;
    char *events[RT_EVENTS];
    int n_events, next_event;
    uint64_t failovers_oom, failovers_crash, rejected_capacity, rejected_auth, rejected_bad;
    uint64_t requests_total;
    int queued;                 /* requests waiting for a worker now */
    uint64_t lat_buckets[12], ttft_buckets[12];
    uint64_t lat_count, ttft_count;
    double lat_sum, ttft_sum;
} rt__state;

extern rt__state rt__g;

/* One client request (one connection: Connection: close). */
typedef struct rt_req {
    int fd;
    char method[16];
    char path[256];
    char request_id[80];
    char auth[256];
    long long deadline_ms;   /* -1 none */
    char *body;
    size_t body_len;
    char worker[64];
    int attempts;
} rt_req;

const char *rt__ws_name(int state);
double rt__now_s(void);  /* monotonic */
double rt__wall_s(void); /* Unix time */
/* Histogram bucket bounds (seconds); the 12th bucket is +Inf. */
extern const double rt__hist_le[11];

/* supervisor */
void rt__sup_pass(bool force_health);
void *rt__sup_thread(void *arg);
void rt__stop_workers(void);

/* events */
void rt__ev_record(json_t *ev);

/* responses */
void rt__send_response(rt_req *q, int status, const char *ctype, const char *extra,
                       const char *body, size_t len);
json_t *rt__error_obj(int status, const char *code, const char *msg, const char *param);
void rt__send_error(rt_req *q, int status, const char *code, const char *msg,
                    const char *param, const char *extra);
void *rt__conn_thread(void *arg);
int rt__listen_on(const char *addr, char *actual, size_t cap);

/* generation requests */
void rt__handle_generate(rt_req *q, bool chat);

#endif
