/* alloc.h - every heap allocation of spillway goes through these functions.
 *
 * One hook lets tests make the Nth allocation fail (SQLite-style fault
 * simulation), so out-of-memory paths are exercised, not just written.
 * sw_free() accepts memory from every function here, including the aligned
 * one. The counters are atomic: the hook works with threads.
 *
 * jansson allocates through this hook once sw_alloc_hook_jansson has run,
 * and SQLite once ldg_alloc_hook (ledger.h) has: both are installed at the
 * start of the `spillway` binary (src/cli/main.c), so a failure injected
 * here reaches JSON parsing and building and the ledger too. libevent
 * (event_set_mem_functions with sw_malloc, sw_realloc, sw_free) is set in
 * wk_serve (worker_http.c) before its first libevent call: the worker is
 * the only part of spillway that uses libevent (the router runs its own
 * sockets and threads), and a libevent block allocated before would still
 * be freed right, sw_free being free. libevent ignores some failed
 * allocations of its own writes (a reply's status line and headers, a
 * chunk's framing); worker_http.c prepares the output so that they need
 * none (out_reserve).
 */
#ifndef SPILLWAY_COMMON_ALLOC_H
#define SPILLWAY_COMMON_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

void *sw_malloc(size_t size);
void *sw_calloc(size_t count, size_t size); /* NULL on count*size overflow */
void *sw_realloc(void *ptr, size_t size);
void *sw_aligned_alloc(size_t alignment, size_t size); /* power-of-2 alignment */
char *sw_strdup(const char *s);
char *sw_strndup(const char *s, size_t n);
void sw_free(void *ptr);

/* Fault injection: the allocation `n` calls from now fails (0 = the next
 * one), and every later one succeeds again. A negative n disarms it. */
void sw_alloc_fail_after(long n);

/* Number of allocation calls (successful or not) since the process began. */
long sw_alloc_count(void);

/* Makes jansson allocate through the hook (and free with sw_free). An
 * injected failure of one of jansson's allocations is counted (the
 * scope, sw_alloc_thread_failures) but jansson gets the memory anyway,
 * because jansson 2.14 corrupts its heap on some NULLs (alloc.c); a real
 * NULL from malloc is counted alike and the block taken from a reserve
 * mapped here (64 MiB of address space, untouched until needed). The
 * sw_json_* wrappers below and the servers' checks of
 * sw_alloc_thread_failures turn either into a failed call. Once per
 * process, before the first JSON value exists (a value allocated by
 * malloc and freed here would still work, sw_free taking both, but would
 * go uncounted); calling it again does nothing. */
void sw_alloc_hook_jansson(void);
/* Blocks jansson has been given from the reserve since the process began. */
long sw_alloc_json_reserve_blocks(void);
/* Of those, the ones not yet freed. */
long sw_alloc_json_reserve_live(void);
/* Tests only: the system allocation n jansson allocations from now (0 =
 * the next) is taken as malloc's NULL, as when memory really runs out;
 * a negative n disarms it. It is not a spillway failure injection: the
 * reserve is what answers it. */
void sw_alloc_test_refuse_system(long n);

/* Allocations that failed on the calling thread since it began (injected
 * or real). A caller that cannot tell from a library's result whether it
 * lost memory compares this before and after: jansson, for one, drops a
 * byte it cannot append to a token and parses on, and json_object_set_new
 * with a NULL value leaves the key out. */
long sw_alloc_thread_failures(void);

/* jansson's json_loads, json_loadb and json_dumps, except that a call
 * during which an allocation of this thread failed fails as a whole,
 * whatever jansson made of it: on a lost allocation jansson may report a
 * syntax error, parse a token with a byte missing, or write a key of an
 * object as "" (it drops bytes it cannot append). A load that fails so
 * returns NULL with error (when given) set to json_error_out_of_memory,
 * "out of memory"; sw_json_error_oom says which failure it was. The
 * servers use these on every request path. */
struct json_t;
struct json_error_t;
struct json_t *sw_json_loads(const char *text, size_t flags, struct json_error_t *error);
struct json_t *sw_json_loadb(const char *buffer, size_t len, size_t flags,
                             struct json_error_t *error);
char *sw_json_dumps(const struct json_t *json, size_t flags); /* free() (never a reserve block) */
bool sw_json_error_oom(const struct json_error_t *error);
/* The load failed on a number jansson cannot hold: an integer outside
 * int64 or a real beyond a double's range. Request bodies answer it with
 * a typed 400 that says so (never a value silently rounded). */
bool sw_json_error_number_range(const struct json_error_t *error);

/* ---- fault scopes: one request's allocations ----------------------------
 *
 * sw_alloc_fail_after counts every thread of the process, which suits a
 * unit test; a server has background threads (health polls, timers) whose
 * allocations would move the count from run to run. A scope counts only
 * the allocations made while it is the calling thread's current scope,
 * and fails the one numbered fail_at (0: the first) of those: a
 * deterministic "fail the Nth allocation of this request".
 *
 * The servers open one for a request that carries the test-only header
 *   X-Spillway-Fault: alloc_fail_after:N      (N = -1: count, fail none)
 * and only when the process was started with SPILLWAY_FAULT naming
 * fault_header:1 (device/fault.h); without it the header is ignored, so a
 * client cannot fail a production server's allocations.
 *
 * A scope belongs to one thread at a time (no locking); a request whose
 * work moves between callbacks of one thread (the worker's event loop)
 * makes its scope current again in each (sw_alloc_scope_swap).
 *
 * Work a request hands to another thread is counted in a scope of its
 * own, one per thread kind (sw_alloc_thread), so that "the Nth
 * allocation" is the same one in every run however the threads
 * interleave; the header names the kind:
 *   X-Spillway-Fault: alloc_fail_after:engine:N
 * fails the Nth allocation the worker's engine thread makes for the
 * request (admission, sampling, the held text, the final event), and the
 * request thread's scope then counts without failing (and the other way
 * round). The engine's batched decode allocates for the whole step, not
 * for one request, and is not counted. The router's supervisor thread
 * (spawn, reap, health polls) does no work for any one request, and a
 * job's runner thread works after the 202 has answered the request that
 * queued it, so neither is a request's scope (docs/operations.md,
 * Testing). */
typedef enum sw_alloc_thread {
    SW_ALLOC_THREAD_REQUEST = 0, /* the thread that serves the request */
    SW_ALLOC_THREAD_ENGINE = 1,  /* the worker's engine thread, for its sequence */
    SW_ALLOC_THREAD_KINDS
} sw_alloc_thread;

typedef struct sw_alloc_scope {
    long calls;   /* allocations counted so far */
    long fail_at; /* the one that fails; -1: none */
    bool failed;  /* it did */
    sw_alloc_thread thread;
} sw_alloc_scope;

/* A scope of the request thread (sw_alloc_scope_init_on: of another). */
void sw_alloc_scope_init(sw_alloc_scope *scope, long fail_at);
void sw_alloc_scope_init_on(sw_alloc_scope *scope, sw_alloc_thread thread, long fail_at);
/* Makes scope (NULL: none) the calling thread's current scope; returns
 * the previous one, to restore. */
sw_alloc_scope *sw_alloc_scope_swap(sw_alloc_scope *scope);
/* The end of a scope's work: its count becomes the process's "last
 * scope" figure (sw_alloc_scope_metrics). */
void sw_alloc_scope_publish(const sw_alloc_scope *scope);
/* Whether this process honours X-Spillway-Fault (SPILLWAY_FAULT has
 * fault_header:1; read once). */
bool sw_alloc_fault_header_enabled(void);
/* The header's value: "alloc_fail_after:N", N >= -1. false when it is
 * anything else. */
bool sw_alloc_scope_parse(const char *value, long *fail_at);
/* The same, and "alloc_fail_after:engine:N" (*thread says which). */
bool sw_alloc_scope_parse_on(const char *value, sw_alloc_thread *thread, long *fail_at);
/* Prometheus lines for /metrics, into buf (NUL-terminated; cut at cap):
 *   spillway_fault_scope_allocations  gauge, allocations of the last
 *                                     scope published (request thread)
 *   spillway_fault_scope_allocations{thread="engine"}  the same for the
 *                                     engine's scopes, once one was
 *   spillway_fault_allocations_failed_total  counter, failures injected
 *                                     by scopes
 * Nothing (returns 0) in a process that never opened a scope. Returns
 * the length written. */
size_t sw_alloc_scope_metrics(char *buf, size_t cap);

#endif
