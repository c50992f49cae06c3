/* router_tls.h - TLS for the router's upstream connections (a kind =
 * openai worker at an https:// url: a remote OpenAI-compatible service),
 * and the table of upstreams that need more than a socket: a TLS context
 * (system trust store plus an optional ca-file, hostname checked), the
 * Host header to send, and the Authorization header made from the key of
 * api-key-env. Private to src/router; router_net.c is its only caller
 * apart from the registration at start.
 *
 * OpenSSL, not libcurl: router_net.c owns its sockets, its pool of idle
 * connections, its poll-based time-outs and its streaming reads; only the
 * transport needs TLS. docs/router.md, Remote services over TLS.
 *
 * The key is kept here only, never in the configuration structs that
 * /health, the events or the log print, and no function here logs it. */
#ifndef SPILLWAY_ROUTER_TLS_H
#define SPILLWAY_ROUTER_TLS_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>

struct ssl_st;
typedef struct rn_upstream rn_upstream;

/* Registers address (the worker's url, as later given to rn_request*):
 * name is the worker's (for the log), ca_file "" or a PEM file of CAs
 * trusted besides the system's, api_key "" or the key sent as
 * Authorization: Bearer. An https:// address gets a TLS context; an
 * address registered again gets the new settings. 0, or SW_EINVAL with
 * a message naming the worker (a ca-file that cannot be read). */
int rn_upstream_add(const char *address, const char *name, const char *ca_file,
                    const char *api_key, sw_error *err);
/* The entry of address, or NULL (a plain worker). Entries live until
 * rn_upstreams_free, at shutdown. */
const rn_upstream *rn_upstream_find(const char *address);
void rn_upstreams_free(void);
/* The last TLS failure of the upstream at address into out ("" when its
 * last connection succeeded, or it has none): true when there is one. */
bool rn_upstream_failure(const char *address, char *out, size_t cap);
/* Header lines ("Host: ...\r\n" and, with a key, "Authorization: ...\r\n")
 * for a request to u, written into out (cap bytes); the length, or -1
 * when they do not fit. */
int rn_upstream_headers(const rn_upstream *u, char *out, size_t cap);
/* Whether u is reached over TLS. */
int rn_upstream_tls(const rn_upstream *u);

/* TLS over the connected socket fd (made non-blocking here), the
 * handshake bounded by timeout_ms. NULL on failure, logged once per
 * distinct error per upstream with the worker's name and the
 * verification error; the caller closes fd. */
struct ssl_st *rn_tls_open(const rn_upstream *u, int fd, int timeout_ms);
/* Writes len bytes whole, polling on WANT_READ/WANT_WRITE for at most
 * timeout_ms in all. 0, or -1. */
int rn_tls_write(struct ssl_st *ssl, const void *buf, size_t len, int timeout_ms);
/* One non-blocking read: > 0 bytes, 0 at the peer's end, -1 on an
 * error, -4 when nothing is there yet (poll the socket for want_events:
 * POLLIN, or POLLOUT during a renegotiation). */
long rn_tls_read(struct ssl_st *ssl, void *buf, size_t cap, short *want_events);
/* Bytes already decrypted and waiting in the TLS layer. */
int rn_tls_pending(struct ssl_st *ssl);
/* Sends close_notify (best effort, never waits) and frees ssl; the
 * socket stays the caller's. */
void rn_tls_free(struct ssl_st *ssl);

#endif
