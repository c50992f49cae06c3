/* router_net.h - the router's small blocking HTTP/1.1 pieces: a client for
 * the workers (unix socket or TCP, Content-Length or chunked bodies, a
 * watch on the downstream client's connection while waiting) and socket
 * helpers for the downstream side. Private to src/router.
 *
 * Blocking I/O on one thread per client connection keeps the relay, the
 * failover decisions and the stream resume in straight-line code; every
 * read has a time-out, and the number of connections is capped.
 *
 * Connections to the workers are kept between requests (rn_request_pooled,
 * rn_release): a small pool of idle ones per worker address, keyed by the
 * generation of the process behind it, so that a request skips the
 * connect (and the worker its accept). docs/router.md, Worker connections.
 */
#ifndef SPILLWAY_ROUTER_NET_H
#define SPILLWAY_ROUTER_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ssl_st;
struct rn_upstream;

typedef struct rn_conn {
    int fd;
    struct ssl_st *tls;  /* TLS on fd (an https:// upstream), or NULL */
    const struct rn_upstream *up; /* its entry in router_tls.h's table, or NULL */
    int watch_fd;        /* client connection to watch for a hang-up, or -1 */
    int timeout_ms;      /* per read */
    double deadline_s;   /* > 0: no read past this CLOCK_MONOTONIC time */
    size_t len, pos;
    int status;
    bool chunked;
    bool chunk_data_read; /* a chunk's data began: its CRLF comes before the next size */
    int64_t remaining;   /* content-length left, or bytes left in the chunk */
    bool has_length;
    bool body_done;
    bool client_gone;    /* watch_fd hung up */
    char retry_after[16];
    char content_type[64];
    /* connection reuse (rn_request_pooled / rn_release) */
    bool keep_alive;     /* the response lets the connection carry another */
    bool reused;         /* it came from the pool */
    bool timed_out;      /* a read waited timeout_ms */
    size_t received;     /* bytes read in this exchange */
    int pool_slot;       /* where rn_release may put it back; -1 never */
    uint64_t pool_epoch; /* the slot's epoch when it was taken or opened */
    int max_idle;
    /* last, and never cleared: only buf[pos..len) holds anything (16 KiB
     * of memset per exchange was a sixth of the router's instructions) */
    char buf[16384];
} rn_conn;

/* Where a pooled request goes. generation names the process behind the
 * address and grows with each new one (a managed worker's restart count
 * and pid; 0 for one the router does not start): an idle connection of
 * another generation is never used, so none outlives the process it was
 * opened to. pool false: a connection of its own, as rn_request. */
typedef struct rn_target {
    const char *address;
    uint64_t generation;
    int max_idle;        /* idle connections kept for this address (1..32) */
    bool pool;
} rn_target;

/* How long an idle connection is kept (the workers' own idle time-out,
 * http-timeout, is 30 s by default). */
#define RN_POOL_IDLE_MS 4000

typedef struct rn_pool_counts {
    uint64_t opened;        /* new connections of pooled requests */
    uint64_t reused;        /* requests sent on an idle connection */
    uint64_t stale_retries; /* reused ones the worker had closed: sent again */
    uint64_t discarded;     /* idle ones found closed, expired or dropped */
    int idle;               /* idle now */
} rn_pool_counts;

/* address: "unix:PATH", "http://HOST:PORT", "https://HOST[:PORT]" (443 by
 * default) or "HOST:PORT". The TCP connection only: rn_request* add TLS
 * for an address registered with rn_upstream_add (router_tls.h). -1 on
 * failure. */
int rn_connect(const char *address, int timeout_ms);
/* Sends the iovecs whole (empty ones skipped; they are updated as bytes
 * go). timeout_ms < 0: blocking sends (the socket's own SO_SNDTIMEO
 * bounds them); else non-blocking sends with a poll while the socket is
 * full, at most timeout_ms in all (the router's client sockets, which
 * carry no time-outs of their own). 0, or -1. */
struct iovec;
int rn_sendv(int fd, struct iovec *iov, int n_iov, int timeout_ms);
/* Sends a request and reads the status line and headers. Returns 0, -1
 * when the worker could not be reached, -3 when it was reached but gave no
 * response head (a crash, or a time-out), -2 when watch_fd hung up. */
/* rn_request with an overall bound as well: no read waits past deadline_s
 * (CLOCK_MONOTONIC seconds; <= 0: none), so a peer sending its head a
 * byte at a time cannot stretch the per-read time-out (a tool call within
 * an agent run's deadline). The bound stays on c for the body reads. */
int rn_request_until(rn_conn *c, const char *address, const char *method, const char *path,
                     const char *extra_headers, const char *body, size_t body_len, int watch_fd,
                     int timeout_ms, double deadline_s);
int rn_request(rn_conn *c, const char *address, const char *method, const char *path,
               const char *extra_headers, const char *body, size_t body_len, int watch_fd,
               int timeout_ms);
/* Next de-chunked body bytes: > 0 bytes, 0 at the body's end, -1 when the
 * connection broke or timed out before the end, -2 when watch_fd hung up. */
long rn_body(rn_conn *c, char *out, size_t cap);
/* Reads the whole body (at most max bytes) into *out (sw_free). 0 or as
 * rn_body. */
int rn_body_all(rn_conn *c, char **out, size_t *len, size_t max);
void rn_close(rn_conn *c);

/* rn_request on an idle connection to t->address when the pool has one
 * (else a new one, sent with keep-alive). A request sent on a reused
 * connection that the worker had closed (the write fails, or the
 * connection ends before the first response byte) is sent once more on a
 * new connection; see rn_request_pooled in router_net.c for why that
 * cannot run a request twice. Same returns as rn_request. */
int rn_request_pooled(rn_conn *c, const rn_target *t, const char *method, const char *path,
                      const char *extra_headers, const char *body, size_t body_len,
                      int watch_fd, int timeout_ms);
/* Reads and discards the rest of a response body (a stream after its
 * last event) for at most wait_ms, so that the connection can be reused;
 * 0 when the end was reached. */
int rn_body_drain(rn_conn *c, int wait_ms);
/* Ends an exchange: the connection goes back to its pool when the whole
 * response was read (Content-Length or the last chunk), the worker did
 * not say Connection: close, nothing failed and its slot was not dropped
 * meanwhile; otherwise it is closed (which also cancels a request still
 * running on the worker). Safe on any rn_conn rn_request* filled. */
void rn_release(rn_conn *c);
/* Closes every idle connection to address, and makes those now in use
 * close at their rn_release: its process exited, is being replaced, or
 * stopped answering. */
void rn_pool_drop(const char *address);
/* Closes idle connections older than RN_POOL_IDLE_MS. */
void rn_pool_sweep(void);
/* Closes every idle connection (shutdown). */
void rn_pool_close_all(void);
void rn_pool_get_counts(rn_pool_counts *out);

/* Simple GET with a short time-out: status, body (sw_free). -1 on failure. */
int rn_get(const char *address, const char *path, int timeout_ms, char **body);

#endif
