/* worker_client.h - what the worker's end-to-end tests need to talk to a
 * real `spillway worker` process: start and stop it, a tiny HTTP/1.1 client
 * over a unix socket (or TCP), and a strict SSE parser.
 *
 * Independent of the worker's code on purpose: it parses what goes over the
 * wire, so a framing mistake in the worker fails the tests.
 */
#ifndef SPILLWAY_TESTS_WORKER_CLIENT_H
#define SPILLWAY_TESTS_WORKER_CLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct wc_worker {
    pid_t pid;
    char socket_path[512];
    char log_path[512];
} wc_worker;

/* Starts `spillway worker --model model --listen unix:<tmp> args...` with
 * extra environment entries env ("K=V", NULL-terminated; may be NULL) and
 * waits (up to timeout_s) until GET /health answers 200. Returns 0, or -1
 * (the process is then gone) when it did not become ready; *exit_status
 * (may be NULL) receives its exit status if it exited. */
int wc_worker_start(wc_worker *w, const char *model, const char *const *args,
                    const char *const *env, int timeout_s, int *exit_status);
/* Starts `spillway worker --model model --listen 127.0.0.1:0 --threads 1`
 * with its output in log_path and waits (up to timeout_s) until it prints
 * the port it listens on (the log's "listening on 127.0.0.1:PORT"). The
 * pid, or -1 (the process is then gone); the port into *port. */
pid_t wc_worker_start_tcp(const char *model, const char *log_path, int timeout_s, int *port);
/* SIGTERM, wait up to 10 s, then SIGKILL. Returns the exit status (or
 * 128 + signal). */
int wc_worker_stop(wc_worker *w);
/* Kills (SIGKILL) and reaps every worker this process started that is still
 * running: for group teardowns, after an assertion left a test early.
 * (Workers also get SIGKILL when the test process dies.) */
void wc_worker_kill_all(void);
/* The worker tests' usual set-up: a made test model (vocabulary 1024, this
 * seed) at tu_tmp_path(file) (its path into model_path, cap bytes), served
 * with --max-seqs 2 --threads 1 --ctx-limit ctx_limit. 0, or -1 when the
 * model or the worker could not be made. */
int wc_worker_start_made(wc_worker *w, const char *file, uint64_t seed, int ctx_limit,
                         char *model_path, size_t cap);
/* Its teardown: stops the worker, removes the model, kills any other
 * worker left; 0 when the worker exited cleanly. */
int wc_worker_stop_made(wc_worker *w, const char *model_path);
/* Waits up to timeout_s for the process to exit by itself; returns its
 * exit status, or -1 on time-out (the process is still there). */
int wc_worker_wait(wc_worker *w, int timeout_s);

typedef struct wc_response {
    int status;             /* HTTP status, 0 when none was read */
    char *headers;          /* raw header block (sw_free) */
    char *body;             /* de-chunked body, NUL-terminated (sw_free) */
    size_t body_len;
    bool chunked;
} wc_response;

void wc_response_free(wc_response *r);
/* Value of a header (case-insensitive name) into buf; false if absent. */
bool wc_header(const wc_response *r, const char *name, char *buf, size_t cap);

/* Connects to the worker's socket; -1 on failure. Time-outs on the fd. */
int wc_connect(const char *socket_path, int timeout_ms);

/* One request with "Connection: close"; reads the whole response. body may
 * be NULL. Returns 0 when a response was read. */
int wc_request(const char *socket_path, const char *method, const char *path, const char *body,
               int timeout_ms, wc_response *out);
/* Sends raw bytes and reads the response until EOF (for malformed input). */
int wc_raw(const char *socket_path, const char *raw, size_t len, int timeout_ms,
           wc_response *out);

/* Writes one request ("Connection: close") on a connected socket. */
int wc_send(int fd, const char *method, const char *path, const char *body);
/* Parses a raw HTTP response (status line, headers, body; de-chunks). */
int wc_response_parse(const char *raw, size_t len, wc_response *out);

/* Strict SSE: the body must be a sequence of events, each exactly one
 * "data: <payload>" line followed by an empty line ("\n" line ends), and
 * nothing else. Returns the number of events and sets *events (sw_free each
 * and the array), or -1 when the framing is wrong. */
int wc_sse_parse(const char *body, size_t len, char ***events);
void wc_sse_free(char **events, int n);

/* `spillway run --json` with the given extra options: its generated token
 * ids into tokens (at most cap); returns the count or -1. */
int wc_run_tokens(const char *model, const char *prompt, const char *const *args,
                  int *tokens, int cap);

/* Token ids (the spillway.token_ids extension), the text and the
 * finish_reason of a completion response, non-stream or stream (every SSE
 * chunk, strictly parsed, ending with [DONE]). Returns the token count, or
 * -1 when the response is malformed or carries an error. *text_out
 * (optional; sw_free) receives the text. */
int wc_tokens_of(const wc_response *r, bool stream, int *tokens, int cap, char **text_out,
                 char *finish, size_t finish_cap);

/* Text and token ids of a completions stream (choices[0].text), chunk by
 * chunk: texts[i] (sw_free each) is all the text the client had after
 * chunk i, ids[i] the last token id chunk i carried (-1: none). Returns
 * the number of chunks filled (at most cap). */
int wc_stream_chunks(const wc_response *r, char **texts, int *ids, int cap);

#endif
