/* router_harness.h - a real `spillway serve` for end-to-end tests: its
 * configuration written into a directory of its own under the test tmp
 * directory (listening on a unix socket there, state in <dir>/state), the
 * process started from SPILLWAY_BIN, requests over its socket, and the
 * checks every router test makes at its end (a clean exit, no sanitizer
 * report in its log).
 *
 * A router started here dies with the test process (PR_SET_PDEATHSIG), and
 * rh_stop_all in a group teardown stops those a failed test left running.
 */
#ifndef SPILLWAY_TESTS_ROUTER_HARNESS_H
#define SPILLWAY_TESTS_ROUTER_HARNESS_H

#include "worker_client.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct rh_router {
    pid_t pid;          /* 0 when not running */
    char dir[512];
    char sock[600];
    char cfg[600];
    char log[600];
    int exit_status;    /* of a router that exited while rh_run waited; else -1 */
} rh_router;

/* Monotonic seconds. */
double tu_now_s(void);
/* Removes a directory tree (quietly; missing is fine). */
void tu_rm_tree(const char *dir);

/* Writes the small synthetic model the router tests serve (vocabulary
 * 1024, the given seed, otherwise eng_model_make's defaults) to
 * tu_tmp_path(file), its path into out. 0, or -1 when it could not be made
 * or SPILLWAY_BIN is not set (for a group setup to return). */
int rh_make_model(char *out, size_t cap, const char *file, uint64_t seed);
/* The same for a small gemma3 file whose sliding layers have a window:
 * width 64, 4 layers (0-2 slide with a window of 16 tokens, 3 is global),
 * 4 heads of 32 over 2 KV heads (1 KiB of F16 KV per token), FFN 128,
 * vocabulary 1024, Q8_0. */
int rh_make_sliding_model(char *out, size_t cap, const char *file, uint64_t seed);

/* Creates the directory and writes router.ini: a [server] section (unix
 * socket, state dir, health every 100 ms, ready-timeout 30, then
 * server_extra), [model] path = model, then rest (worker and tool
 * sections). Does not start it. */
void rh_init(rh_router *r, const char *name, const char *model, const char *server_extra,
             const char *rest);
/* Writes router.ini again, as rh_init does (for a reload). */
void rh_write_config(const rh_router *r, const char *model, const char *server_extra,
                     const char *rest);
/* Starts (or restarts, same directory) the router; env: one extra "K=V"
 * or NULL (SPILLWAY_FAULT and SPILLWAY_SABOTAGE are cleared first). Waits
 * up to 40 s for /health 200; 0, or -1 when it exited (its status then in
 * r->exit_status) or never answered. */
int rh_run(rh_router *r, const char *env);
/* rh_init + rh_run. */
int rh_start(rh_router *r, const char *name, const char *model, const char *server_extra,
             const char *rest);
/* SIGTERM (SIGKILL after 15 s); the exit status, -1 when not running. */
int rh_stop(rh_router *r);
/* Waits for the router to exit by itself: its status, -1 on time-out. */
int rh_wait_exit(rh_router *r, int timeout_s);
/* SIGKILL, then a moment for its workers to die with it. */
void rh_kill9(rh_router *r);
/* The end of a passing test: exit status 0, no sanitizer report in the
 * log, the directory removed (a failing test leaves it to read). */
void rh_finish(rh_router *r);
/* rh_finish for a group teardown, where an assertion cannot be made: 0
 * when the exit and the log were clean (the directory is then removed),
 * else -1 with a line on stderr naming the log. */
int rh_finish_quiet(rh_router *r);
/* Stops every router still running (for teardown). */
void rh_stop_all(void);

/* One request on its own connection, with extra header lines
 * ("Name: v\r\n"...); body may be NULL. 0 or -1. */
int rh_req(const rh_router *r, const char *method, const char *path, const char *headers,
           const char *body, wc_response *out);
/* The response body as JSON (NULL when it is not). */
json_t *rh_body_json(const wc_response *w);
/* Fails the test unless header name is present (and equal to want, when
 * want is not NULL). */
void rh_assert_header(const wc_response *w, const char *name, const char *want);
/* Header name as a whole number: -1 when absent, -2 when not an integer
 * (trailing blanks allowed). */
long long rh_header_ll(const wc_response *w, const char *name);
/* error.code of an error response into buf ("" when none). */
const char *rh_error_code(const wc_response *w, char *buf, size_t cap);
/* GET /v1/spillway/events: the "data" array (asserted). */
json_t *rh_events(const rh_router *r);
/* The router's /health entry of worker name (asserted present). */
json_t *rh_worker_health(const rh_router *r, const char *name);
/* Waits up to 30 s until worker name is ready with at least min_restarts
 * restarts; fails the test otherwise. */
void rh_wait_restarted(const rh_router *r, const char *name, int min_restarts);

/* The socket of managed worker name: <dir>/state/<name>.sock, into buf. */
const char *rh_worker_sock(const rh_router *r, const char *name, char *buf, size_t cap);
/* The pid the router's /health gives for worker name (asserted > 0). */
pid_t rh_worker_pid(const rh_router *r, const char *name);
/* A counter or gauge "name value" from the /metrics of the spillway
 * process (worker or router) at sock; asserted present. */
long long rh_metric(const char *sock, const char *name);
/* The series name{labels} (labels as written between the braces, e.g.
 * "worker=\"gpu\",reason=\"memory\"") of the /metrics at sock, as
 * rh_metric: asserted present. */
long long rh_metric_labeled(const char *sock, const char *name, const char *labels);
/* One series ("name" or "name{labels}", written exactly as in the text)
 * of the /metrics at sock into *value (a float: histogram sums too).
 * false when /metrics could not be read or the series is absent. Asserts
 * nothing, so a helper thread may call it. */
bool rh_metric_get(const char *sock, const char *series, double *value);
/* Every series of metric name at sock ("name value" and "name{...} value";
 * not name_bucket and the like): how many there are, their sum into *sum
 * (may be NULL); -1 when /metrics could not be read. Asserts nothing. */
int rh_metric_sum(const char *sock, const char *name, double *sum);
/* The pid the router's /health gives for worker name now (0 while it has
 * none or when /health cannot be read) and, into *ready (may be NULL),
 * whether its state is ready. Asserts nothing: a helper thread may call
 * it, for instance one that kills the worker over and over. */
pid_t rh_worker_pid_now(const rh_router *r, const char *name, bool *ready);
/* GET /v1/spillway/jobs/<id>: the job (asserted 200 and JSON). */
json_t *rh_job_get(const rh_router *r, const char *id);
/* Polls the job every 100 ms until it is succeeded or failed and returns
 * it; fails the test after timeout_s. */
json_t *rh_job_wait_end(const rh_router *r, const char *id, int timeout_s);
/* Whether the worker at sock answers a forced tool_choice with
 * tool_calls (constrained decoding); prints "SKIP: " and why when not, for
 * the caller to skip. */
bool rh_worker_calls_tools(const char *sock, const char *why);

/* The router's ledger (<dir>/state/ledger.db) opened beside it, read-only
 * or read-write, waiting up to 10 s on its locks (asserted). */
struct sqlite3;
struct sqlite3 *rh_ledger_open(const rh_router *r, bool writable);

/* A raw client connection, for what rh_req cannot show: several requests
 * on one connection, partial sends, what arrives when. buf holds what was
 * read beyond the last response. */
typedef struct rh_conn {
    int fd;
    char *buf;
    size_t len, cap;
} rh_conn;

/* Connects to a unix socket (asserted). */
void rh_conn_open(rh_conn *c, const char *sock);
void rh_conn_close(rh_conn *c);
/* Sends all n bytes (asserted). */
void rh_conn_send(rh_conn *c, const char *p, size_t n);
/* Reads what arrives within timeout_s into buf; false on time-out or EOF. */
bool rh_conn_read_more(rh_conn *c, double timeout_s);
/* Opens a connection and POSTs body to /v1/completions on it (a stream),
 * then reads until its first "data: " event (20 s at most, asserted): a
 * stream in progress, its head and first events in c->buf. */
void rh_stream_start(rh_conn *c, const rh_router *r, const char *body);
/* Reads until needle is in c->buf (timeout_s at most, asserted). */
void rh_conn_read_until(rh_conn *c, const char *needle, double timeout_s);
/* Reads exactly one response (Content-Length or chunked framing, within
 * 60 s, the connection staying open until it is whole) and keeps any bytes
 * after it in buf. */
void rh_conn_read_response(rh_conn *c, wc_response *out);

#endif
