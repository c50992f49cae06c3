/* router_net.h - the router's small blocking HTTP/1.1 pieces: a client for
 * the workers (unix socket or TCP, Content-Length or chunked bodies, a
 * watch on the downstream client's connection while waiting) and socket
 * helpers for the downstream side. Private to src/router.
 *
 * Blocking I/O on one thread per client connection keeps the relay, the
 * failover decisions and the stream resume in straight-line code; every
 * read has a time-out, and the number of connections is capped.
 */
#ifndef SPILLWAY_ROUTER_NET_H
#define SPILLWAY_ROUTER_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rn_conn {
    int fd;
    int watch_fd;        /* client connection to watch for a hang-up, or -1 */
    int timeout_ms;      /* per read */
    char buf[16384];
    size_t len, pos;
    int status;
    bool chunked;
    int64_t remaining;   /* content-length left, or bytes left in the chunk */
    bool has_length;
    bool body_done;
    bool client_gone;    /* watch_fd hung up */
    char retry_after[16];
    char content_type[64];
} rn_conn;

/* address: "unix:PATH", "http://HOST:PORT" or "HOST:PORT". -1 on failure. */
int rn_connect(const char *address, int timeout_ms);
int rn_write_all(int fd, const void *p, size_t n);
/* Sends a request and reads the status line and headers. Returns 0, -1
 * when the worker could not be reached, -3 when it was reached but gave no
 * response head (a crash, or a time-out), -2 when watch_fd hung up. */
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

/* Simple GET with a short time-out: status, body (sw_free). -1 on failure. */
int rn_get(const char *address, const char *path, int timeout_ms, char **body);

#endif
