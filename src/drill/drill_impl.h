/* drill_impl.h - the pieces of `spillway drill` (cli_drill.c) shared by its
 * files: a small blocking HTTP client that parses what goes over the wire
 * (drill_http.c), the processes it runs — the router, a memory hog inside
 * the drill, a tool server (drill_proc.c) —, the scenarios (their list and
 * bookkeeping in drill_scenarios.c, s1-s4 in drill_failover.c, s5 and s6 in
 * drill_tools_jobs.c, s2 and s4 against a llama-server pair in
 * drill_llamaserver.c, the steps they share in drill_steps.c) and the report
 * (drill_report.c).
 *
 * The drill is a black-box client of the router on purpose: it sees what a
 * user's client sees (status, headers, SSE events), plus what the router
 * and the workers publish (/health, /metrics, /v1/spillway/events). It
 * uses no router internals, so a bug in the router cannot hide itself.
 * The drill room's interface: src/drill holds these files, and the cli
 * room's cli_drill.c and the bench profiles use them.
 */
#ifndef SPILLWAY_DRILL_DRILL_IMPL_H
#define SPILLWAY_DRILL_DRILL_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- HTTP client (drill_http.c) ------------------------------------------- */

#define DH_MAX_BODY (16u << 20) /* a larger response is cut (and marked incomplete) */

typedef struct dh_response {
    int status;        /* 0: no response head was read */
    char *headers;     /* raw header block (sw_free) */
    char *body;        /* de-chunked, NUL-terminated (sw_free) */
    size_t body_len;
    bool complete;     /* the body was read to its end */
    bool broken;       /* the connection ended or timed out before the end */
    bool stopped;      /* the caller's callback closed the connection */
    double t_headers;  /* wall-clock seconds when the head arrived (0: never) */
    double t_end;      /* when the exchange ended */
} dh_response;

/* Called with the whole de-chunked body so far after each read, and every
 * 20 ms while nothing arrives; returns true to stop reading and close the
 * connection (a client hanging up). */
typedef bool (*dh_body_fn)(void *user, const char *body, size_t len);

/* address: "unix:PATH", "http://HOST:PORT" or "HOST:PORT". -1 on failure. */
int dh_connect(const char *address, int timeout_ms);
/* One request on a fresh connection ("Connection: close"), read to its
 * end, the time-out (per read) or until on_body says stop. extra_headers:
 * "Name: value\r\n" lines or NULL; body NULL sends no body. Returns 0 when
 * the request was sent (out->status tells whether an answer came), -1 when
 * the connection could not be made. */
int dh_exchange(const char *address, const char *method, const char *path,
                const char *extra_headers, const char *body, int timeout_ms, dh_body_fn on_body,
                void *user, dh_response *out);
int dh_get(const char *address, const char *path, int timeout_ms, dh_response *out);
void dh_response_free(dh_response *r);
/* Value of a response header (case-insensitive) into buf; false if absent. */
bool dh_header(const dh_response *r, const char *name, char *buf, size_t cap);
/* GET path as JSON (NULL when unreachable or not JSON); *status_out
 * optional. */
json_t *dh_get_json(const char *address, const char *path, int timeout_ms, int *status_out);
/* The value of one Prometheus sample (the exact series text, e.g.
 * `x_total{outcome="ok"}`) in a /metrics body; missing = 0. */
double dh_metric(const char *text, const char *series);
/* The sum of every sample of a metric name (all label sets). */
double dh_metric_sum(const char *text, const char *name);
/* The SSE events of a body, strictly framed ("data: X\n\n" each): returns
 * their count and a new array of strings (dh_sse_free), or -1 when the
 * framing is wrong. A trailing incomplete event is not counted. */
int dh_sse_split(const char *body, size_t len, char ***events, bool *framing_ok);
void dh_sse_free(char **events, int n);
double dh_now(void); /* wall clock, seconds (the router's event times are too) */
void dh_sleep_ms(int ms);

/* ---- records -------------------------------------------------------------- */

#define DR_MAX_TOKENS 2048

typedef struct dr_request {
    char id[64];            /* the X-Request-Id sent */
    char scenario[8];       /* "s1" ... */
    char label[128];
    char path[32];          /* /v1/completions, /v1/spillway/jobs ... */
    bool stream;
    bool job;
    int max_tokens;
    /* client side, wall-clock seconds (0 = did not happen) */
    double t_send, t_headers, t_first_token, t_end;
    int status;
    char error_code[64];    /* the typed error (body or final SSE event) */
    char worker[32];        /* X-Spillway-Worker (the worker that started it) */
    int attempts;           /* X-Spillway-Attempts, 0 = absent */
    char rid_out[80];       /* X-Request-Id answered */
    char retry_after[16];   /* Retry-After answered */
    bool ids_match;         /* body id / every chunk's id == id */
    bool complete;          /* full JSON, or a stream ending in [DONE] */
    bool framing_ok;        /* strict SSE */
    bool connection_open;   /* the connection stayed open until the end */
    bool client_cancelled;  /* the drill hung up on purpose */
    int done_events;        /* [DONE] count (must be 1) */
    int n_tokens;
    int tokens[DR_MAX_TOKENS];
    char text[512];         /* the start of the output, for the report */
    char finish[24];
    int ref_match;          /* -1 no reference, 0 differs, 1 equal */
    /* the router's failover record for this id, if any */
    bool has_event;
    char fe_worker[32], fe_kind[32], fe_phase[32];
    double fe_time, cpu_start_time, completion_time;
    char decision[64], reason[160], replay_worker[32], outcome[16];
    int ev_attempts, ev_tokens;
    int ev_client_connected; /* -1 unknown */
    int tool_steps;         /* spillway.tool_steps of an agent run */
    int tool_steps_reused;
    int run_attempts;       /* spillway.run_attempts of an agent run */
    /* job */
    char job_id[80];
    char job_state[16];
    /* the drill's reading */
    char final_worker[32];  /* who produced the answer's end */
    bool ok;                /* ended as the scenario expects */
    bool timed_out;         /* no answer within the drill's limit: a hang */
} dr_request;

typedef struct dr_mark {
    double time;
    char scenario[8];
    char kind[24];          /* sigkill, hog, hog_release, cancel, tool_call, restart */
    char label[160];
} dr_mark;

typedef enum dr_verdict_id {
    DR_V_COMPLETED_ONCE = 0,
    DR_V_IDENTITY,
    DR_V_NO_DUP_TOOL,
    DR_V_GPU_RECOVERED,
    DR_V_COUNT,
    DR_V_NONE = -1,
} dr_verdict_id;

typedef struct dr_check {
    char name[96];
    bool passed;
    char detail[320];
    dr_verdict_id verdict;  /* the seed verdict it counts for, or DR_V_NONE */
} dr_check;

#define DR_MAX_CHECKS 48

typedef enum dr_state { DR_NOT_RUN = 0, DR_PASSED, DR_FAILED, DR_SKIPPED } dr_state;

typedef struct dr_scenario {
    char id[8];
    char title[128];
    char property[200];     /* what it proves */
    dr_state state;
    char skip_reason[512];
    dr_check checks[DR_MAX_CHECKS];
    int n_checks;
    double t_start, t_end;
} dr_scenario;

#define DR_N_SCENARIOS 6
#define DR_MAX_REQUESTS 160
#define DR_MAX_MARKS 64

/* ---- the drill's state ------------------------------------------------------ */

typedef struct dr_router {
    pid_t pid;              /* 0 when attached or stopped */
    char dir[512];          /* scenario directory */
    char cfg[600];
    char log[600];
    char state_dir[600];
    char address[300];      /* HOST:PORT (or the attached URL) */
    char gpu_sock[640];     /* managed workers' sockets; "" when attached */
    char cpu_sock[640];
} dr_router;

/* A simulated tool behind the router (scenario 5): counts every call. */
#define DR_MAX_TOOL_CALLS 64
typedef struct dr_tool_call {
    double time;
    char key[128];          /* Idempotency-Key */
    char request_id[80];
    char body[256];
} dr_tool_call;

typedef struct dr_tool_server {
    int listen_fd;
    int port;
    pthread_t thread;
    bool running;
    volatile bool stop;
    pthread_mutex_t lock;
    dr_tool_call calls[DR_MAX_TOOL_CALLS];
    int n_calls;
    int n_answered;         /* calls answered so far */
    int answer_delay_ms;    /* the tool "works" this long before answering */
} dr_tool_server;

typedef struct drill {
    /* options */
    const char *out_dir;
    const char *config_path;     /* --config */
    const char *router_url;      /* --router */
    char model[600];
    bool quick;
    bool attached;
    bool color;                  /* stderr is a tty */
    /* the two workers of the generated configurations */
    char gpu_device[128];        /* sim-gpu:NAME or cuda:N */
    char gpu_extra[512];         /* extra worker keys from --config (gpu-layers ...) */
    char cpu_extra[512];
    char pool[64];               /* sim-gpu pool name, "" for a real device */
    char sim_capacity[32];
    bool gpu_simulated;
    /* a llama-server pair (drill_llamaserver.c): the configuration's two
     * kind = llama-server workers, the first in preference order as the
     * GPU tier; their commands, the keys carried over, the ports the
     * drill gives them */
    bool ls_pair;
    char ls_gpu_command[1024], ls_cpu_command[1024];
    char ls_gpu_extra[1024], ls_cpu_extra[1024];
    int ls_gpu_port, ls_cpu_port;
    char sabotage[256];          /* SPILLWAY_SABOTAGE passed to the router */
    char router_sabotage[256];   /* the switches a router's /health says are on */
    bool router_sabotage_seen;   /* a router answered with the "sabotage" field */
    /* results */
    dr_scenario scenarios[DR_N_SCENARIOS];
    dr_request *requests;        /* DR_MAX_REQUESTS */
    int n_requests;
    dr_mark marks[DR_MAX_MARKS];
    int n_marks;
    pthread_mutex_t lock;        /* requests and marks from threads */
    double t_start, t_end;
    /* what runs now */
    dr_router router;
    struct dev_device *hog_dev;  /* the in-drill "second model" */
    void *hog_ptr[4];            /* its allocations */
    size_t hog_bytes[4];
    int n_hog;
    dr_tool_server tools;
    char progress_scenario[8];
} drill;

extern volatile sig_atomic_t dr_interrupted;

/* drill_proc.c */
int dr_router_start(drill *d, dr_router *r, const char *name, const char *server_extra,
                    const char *workers, char *why, size_t why_cap);
int dr_router_stop(drill *d, dr_router *r); /* exit status, -1 when none */
void dr_signals_install(void);
void dr_cleanup(drill *d);                   /* everything still running */
/* Takes bytes more of the GPU worker's device (at most 4 at once);
 * dr_hog_release gives all back. */
int dr_hog_take(drill *d, uint64_t bytes, char *why, size_t why_cap);
void dr_hog_release(drill *d);
uint64_t dr_hog_held(const drill *d);
void dr_hog_close(drill *d); /* releases and closes the device handle */
int dr_tool_server_start(dr_tool_server *t);
void dr_tool_server_stop(dr_tool_server *t);
int dr_tool_calls(dr_tool_server *t, dr_tool_call *copy, int cap);
int dr_pool_used(drill *d, uint64_t *used_excluding_hog);

/* drill_scenarios.c */
void dr_scenarios_init(drill *d);
void dr_run_all(drill *d);
/* Notes the SPILLWAY_SABOTAGE switches the router's /health reports
 * (drill_steps.c). */
void dr_note_sabotage(drill *d);

/* helpers shared by the scenario code and the report (drill_scenarios.c) */
dr_request *dr_request_new(drill *d, const char *scenario, const char *id, const char *label);
void dr_mark_add(drill *d, const char *scenario, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dr_check_add(drill *d, dr_scenario *s, dr_verdict_id v, bool passed, const char *name,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void dr_progress(drill *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *dr_verdict_name(dr_verdict_id v);
const char *dr_state_name(dr_state s);
/* The four seed verdicts from the checks: passed, failed or not_tested. */
const char *dr_verdict_status(const drill *d, dr_verdict_id v);
bool dr_all_passed(const drill *d);

/* ---- what the scenario files share (dr__: the scenarios only) ------------------ */

#define DR_TIMEOUT_MS 120000
#define DR_BIG_TOKENS 300  /* needs more KV than the GPU keeps free */
#define DR_FREE_TOKENS 256 /* what the second model leaves free on the GPU */

/* drill_scenarios.c: a scenario's life */
void dr__skip(drill *d, dr_scenario *s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void dr__begin(drill *d, dr_scenario *s);
void dr__finish(drill *d, dr_scenario *s);

/* the scenarios: drill_failover.c (s1-s4), drill_tools_jobs.c (s5, s6) */
void dr__s1_run(drill *d, dr_scenario *s);
void dr__s2_run(drill *d, dr_scenario *s);
void dr__s3_run(drill *d, dr_scenario *s);
void dr__s4_run(drill *d, dr_scenario *s);
void dr__s5_run(drill *d, dr_scenario *s);
void dr__s6_run(drill *d, dr_scenario *s);
/* drill_llamaserver.c: the same against a llama-server pair (s2, s4), and
 * the others reported as not applicable, with the reason */
void dr__ls_s2_run(drill *d, dr_scenario *s);
void dr__ls_s4_run(drill *d, dr_scenario *s);
void dr__ls_not_applicable(drill *d, dr_scenario *s);
/* A free loopback TCP port, -1 none. */
int dr__ls_pick_port(void);

/* drill_steps.c: requests as a client sends them */
/* Called as a response's body arrives; true hangs up (a client leaving). */
typedef bool (*dr__hangup_fn)(void *user, dr_request *r, int tokens_seen);
/* A completion body for the drill's prompt, greedy, ignoring EOS. */
void dr__request_body(char *buf, size_t cap, int max_tokens, bool stream);
/* Sends one request as a client would and records everything it sees. */
void dr__send_request(drill *d, const char *address, dr_request *r, const char *path,
                      const char *body, const char *extra_headers, dr__hangup_fn hangup,
                      void *user);
void dr__append_tokens(dr_request *r, json_t *ids);
void dr__append_text(dr_request *r, const char *t);
/* The reference: the same body, uninterrupted, straight to the CPU worker;
 * 0 when it gave max_tokens tokens. */
int dr__reference(const char *cpu_sock, int max_tokens, int *tokens, int *n_out);
/* Sets r->ref_match where the run is comparable with the reference. */
void dr__compare_ref(drill *d, dr_request *r, const int *ref, int n_ref);
/* Attaches the router's failover record to each request of a scenario. */
void dr__attach_events(drill *d, const char *address, const char *scenario);
/* The same, waiting until at least min_matched requests have theirs and
 * the count holds still (5 s at most). */
void dr__attach_events_wait(drill *d, const char *address, const char *scenario,
                            int min_matched);

/* Non-stream request in a thread (the drill acts while it runs). */
typedef struct dr__async_req {
    drill *d;
    const char *address;
    dr_request *r;
    char body[512];
    char headers[256];
    dr__hangup_fn hangup;
    void *user;
    pthread_t th;
    bool started;
} dr__async_req;
bool dr__async_start(dr__async_req *a);
void dr__async_join(dr__async_req *a);

/* drill_steps.c: what the workers and the router publish */
char *dr__metrics_text(const char *address); /* GET /metrics, "" if none (sw_free) */
double dr__worker_ok(const char *sock);      /* requests completed ok */
double dr__worker_metric(const char *sock, const char *series);
double dr__worker_requests_all(const char *sock); /* every outcome, refusals too */
json_t *dr__worker_health(const char *sock);
long long dr__health_int(json_t *h, const char *obj, const char *key);
long long dr__kv_used(const char *sock);      /* -1 when unreachable */
/* The router's /health entry of worker `name` (a new reference), or NULL. */
json_t *dr__router_worker(const char *address, const char *name);
/* Waits until the router reports the worker ready with >= min_restarts;
 * state_out (optional, 16 bytes) receives the last state seen. */
bool dr__wait_restarted(const char *address, const char *name, int min_restarts,
                        int timeout_s, int *restarts_out, char *state_out);
pid_t dr__gpu_pid(const char *address);

/* drill_steps.c: a scenario's router and the GPU's memory */
/* Writes the two worker sections of a generated configuration. */
void dr__workers_ini(drill *d, char *buf, size_t cap, const char *policy, const char *gpu_fault,
                     const char *cpu_fault);
bool dr__start_router(drill *d, dr_scenario *s, const char *name, const char *server_extra,
                      const char *workers);
void dr__stop_router(drill *d, dr_scenario *s);
/* A worker's KV figures (its /health, docs/api.md) and what they make of
 * a sequence: tokens x per_token, or for a sliding-window model (gemma3)
 * whole blocks of which the local layers' share counts at most
 * sliding_max times; the most tokens whose KV fits in bytes. */
typedef struct dr_kv_figures {
    long long per_token, block_tokens, block_bytes, sliding_bytes, sliding_max;
} dr_kv_figures;
bool dr__kv_sliding(const dr_kv_figures *k);
long long dr__kv_bytes_for_tokens(const dr_kv_figures *k, long long tokens);
long long dr__kv_tokens_fitting(const dr_kv_figures *k, long long bytes);
/* Takes GPU memory so that about `tokens` tokens of KV stay free there
 * (by dr__kv_bytes_for_tokens), then waits until the router has seen it;
 * 0 or -1. */
int dr__leave_free_tokens(drill *d, dr_router *rt, const char *scenario, int tokens);
/* Waits until the GPU worker holds KV memory (a request runs there). */
bool dr__wait_gpu_busy(const char *gpu_sock, long long base_kv, int timeout_ms);
/* Takes every byte the GPU worker could still allocate; 0 or -1. */
int dr__take_gpu_free(drill *d, const char *gpu_sock, const char *scenario);

/* drill_steps.c: checks several scenarios make */
void dr__check_identity(drill *d, dr_scenario *s, dr_request *r);
/* A failed-over request, checked against the seed's criteria. */
void dr__check_failover(drill *d, dr_scenario *s, dr_request *r, const char *want_decision,
                        const char *want_kind, double cpu_ok_delta, int n_ref);

/* drill_report.c */
int dr_write_reports(drill *d);

#endif
