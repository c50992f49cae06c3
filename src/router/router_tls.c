/* router_tls.c - TLS for the router's upstream connections and the table
 * of upstreams with a TLS context or a key (router_tls.h).
 *
 * The sockets are non-blocking once TLS is on them: every SSL_connect,
 * SSL_read and SSL_write that cannot go on says what it waits for
 * (SSL_ERROR_WANT_READ / WANT_WRITE) and the caller polls for that, so
 * the time-outs of router_net.c (per read, overall deadline, the watch on
 * the client) hold over TLS as over a plain socket. */
#include "router/router_tls.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define RN_UPSTREAMS_MAX 64

struct rn_upstream {
    char address[640];     /* as the worker's url: the table's key */
    char name[64];         /* the worker's, for the log */
    char host[256];        /* checked against the certificate, sent as SNI */
    char host_header[300]; /* HOST[:PORT] as the Host header */
    char auth[1100];       /* "Authorization: Bearer KEY\r\n" or "": never logged */
    SSL_CTX *ctx;          /* NULL: plain TCP (an http:// url with a key) */
    char last_error[256];  /* the last failure logged, so a worker that stays
                              down is not logged at every health check */
};

static struct {
    pthread_mutex_t mu;
    rn_upstream u[RN_UPSTREAMS_MAX];
    int n;
} rn_ups = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double tls_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* host and HOST[:PORT] of "http[s]://HOST[:PORT][/...]" ("[v6]" kept
 * whole in the header, without brackets in host). false when too long. */
static bool tls_split_url(const char *address, char *host, size_t host_cap, char *header,
                          size_t header_cap)
{
    const char *a = strstr(address, "://");
    a = a ? a + 3 : address;
    size_t n = strcspn(a, "/");
    if (n == 0 || n >= header_cap)
        return false;
    memcpy(header, a, n);
    header[n] = 0;
    const char *h = header;
    size_t hl;
    if (h[0] == '[') {
        const char *close = strchr(h, ']');
        if (!close)
            return false;
        h++;
        hl = (size_t)(close - h);
    } else {
        const char *colon = strchr(h, ':');
        hl = colon ? (size_t)(colon - h) : strlen(h);
    }
    if (hl == 0 || hl >= host_cap)
        return false;
    memcpy(host, h, hl);
    host[hl] = 0;
    return true;
}

/* The first error on OpenSSL's queue as text (and the queue emptied). */
static void tls_errors(char *out, size_t cap, const char *fallback)
{
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, out, cap);
    else
        snprintf(out, cap, "%s", fallback);
    ERR_clear_error();
}

int rn_upstream_add(const char *address, const char *name, const char *ca_file,
                    const char *api_key, sw_error *err)
{
    rn_upstream nu;
    memset(&nu, 0, sizeof nu);
    if (snprintf(nu.address, sizeof nu.address, "%s", address) >= (int)sizeof nu.address ||
        !tls_split_url(address, nu.host, sizeof nu.host, nu.host_header, sizeof nu.host_header))
        return sw_error_set(err, SW_EINVAL, "[worker %s]: url too long or without a host", name);
    snprintf(nu.name, sizeof nu.name, "%s", name);
    if (api_key && api_key[0]) {
        /* a key with a line break would let it write headers of its own */
        if (strpbrk(api_key, "\r\n") ||
            snprintf(nu.auth, sizeof nu.auth, "Authorization: Bearer %s\r\n", api_key) >=
                (int)sizeof nu.auth)
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: the api key is longer than 1000 bytes or holds a "
                                "line break",
                                name);
    }
    if (!strncmp(address, "https://", 8)) {
        nu.ctx = SSL_CTX_new(TLS_client_method());
        if (!nu.ctx)
            return sw_error_set(err, SW_ENOMEM, "[worker %s]: cannot make a TLS context", name);
        SSL_CTX_set_min_proto_version(nu.ctx, TLS1_2_VERSION);
        SSL_CTX_set_verify(nu.ctx, SSL_VERIFY_PEER, NULL);
        SSL_CTX_set_mode(nu.ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                                     SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
        /* many servers close without a close_notify: an end like a plain
         * socket's, where Content-Length and chunking catch a cut body */
        SSL_CTX_set_options(nu.ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
        char why[256];
        if (SSL_CTX_set_default_verify_paths(nu.ctx) != 1) {
            tls_errors(why, sizeof why, "no system trust store");
            SW_WARN("router", "worker %s: the system's CA certificates could not be loaded (%s)",
                    name, why);
        }
        if (ca_file && ca_file[0] && SSL_CTX_load_verify_locations(nu.ctx, ca_file, NULL) != 1) {
            tls_errors(why, sizeof why, "unreadable");
            SSL_CTX_free(nu.ctx);
            return sw_error_set(err, SW_EINVAL, "[worker %s]: ca-file = %s: %s", name, ca_file,
                                why);
        }
    }
    pthread_mutex_lock(&rn_ups.mu);
    rn_upstream *u = NULL;
    for (int i = 0; i < rn_ups.n && !u; i++)
        if (!strcmp(rn_ups.u[i].address, address))
            u = &rn_ups.u[i];
    if (!u && rn_ups.n < RN_UPSTREAMS_MAX)
        u = &rn_ups.u[rn_ups.n++];
    if (!u) {
        pthread_mutex_unlock(&rn_ups.mu);
        SSL_CTX_free(nu.ctx);
        return sw_error_set(err, SW_EINVAL, "[worker %s]: more than %d remote upstreams", name,
                            RN_UPSTREAMS_MAX);
    }
    /* connections open on the old context keep it: SSL_new took a
     * reference */
    SSL_CTX *old = u->ctx;
    *u = nu;
    pthread_mutex_unlock(&rn_ups.mu);
    SSL_CTX_free(old);
    memset(&nu, 0, sizeof nu); /* no second copy of the key on the stack */
    return 0;
}

const rn_upstream *rn_upstream_find(const char *address)
{
    const rn_upstream *found = NULL;
    pthread_mutex_lock(&rn_ups.mu);
    for (int i = 0; i < rn_ups.n && !found; i++)
        if (!strcmp(rn_ups.u[i].address, address))
            found = &rn_ups.u[i];
    pthread_mutex_unlock(&rn_ups.mu);
    return found;
}

bool rn_upstream_failure(const char *address, char *out, size_t cap)
{
    out[0] = 0;
    pthread_mutex_lock(&rn_ups.mu);
    for (int i = 0; i < rn_ups.n; i++)
        if (!strcmp(rn_ups.u[i].address, address))
            snprintf(out, cap, "%s", rn_ups.u[i].last_error);
    pthread_mutex_unlock(&rn_ups.mu);
    return out[0] != 0;
}

void rn_upstreams_free(void)
{
    pthread_mutex_lock(&rn_ups.mu);
    for (int i = 0; i < rn_ups.n; i++)
        SSL_CTX_free(rn_ups.u[i].ctx);
    memset(rn_ups.u, 0, sizeof rn_ups.u);
    rn_ups.n = 0;
    pthread_mutex_unlock(&rn_ups.mu);
}

int rn_upstream_headers(const rn_upstream *u, char *out, size_t cap)
{
    pthread_mutex_lock(&rn_ups.mu);
    int n = snprintf(out, cap, "Host: %s\r\n%s", u->host_header, u->auth);
    pthread_mutex_unlock(&rn_ups.mu);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int rn_upstream_tls(const rn_upstream *u)
{
    pthread_mutex_lock(&rn_ups.mu);
    int tls = u->ctx != NULL;
    pthread_mutex_unlock(&rn_ups.mu);
    return tls;
}

/* Logs a failure of u once until it changes (or a connection succeeds). */
static void tls_log_failure(const rn_upstream *cu, const char *why)
{
    rn_upstream *u = (rn_upstream *)cu; /* the table's own entry */
    pthread_mutex_lock(&rn_ups.mu);
    bool fresh = strcmp(u->last_error, why) != 0;
    if (fresh)
        snprintf(u->last_error, sizeof u->last_error, "%s", why);
    char name[64], host[300];
    snprintf(name, sizeof name, "%s", u->name);
    snprintf(host, sizeof host, "%s", u->host_header);
    pthread_mutex_unlock(&rn_ups.mu);
    if (fresh)
        SW_WARN("router", "worker %s: TLS to %s failed: %s", name, host, why);
}

/* Waits for events on fd until until_s; false on a time-out or error. */
static bool tls_wait(int fd, short events, double until_s)
{
    for (;;) {
        double left = until_s - tls_now_s();
        if (left <= 0)
            return false;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        return true;
    }
}

struct ssl_st *rn_tls_open(const rn_upstream *cu, int fd, int timeout_ms)
{
    rn_upstream *u = (rn_upstream *)cu;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return NULL;
    char host[256];
    pthread_mutex_lock(&rn_ups.mu);
    SSL *ssl = u->ctx ? SSL_new(u->ctx) : NULL;
    snprintf(host, sizeof host, "%s", u->host);
    pthread_mutex_unlock(&rn_ups.mu);
    char why[256];
    if (!ssl) {
        tls_errors(why, sizeof why, "cannot make a TLS connection");
        tls_log_failure(u, why);
        return NULL;
    }
    /* the name the certificate must carry: an IP address in its
     * subjectAltName IPs, else a DNS name (and then also sent as SNI,
     * which must not carry an address) */
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    bool ok;
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host) == 1) {
        ok = true;
    } else {
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        ok = SSL_set1_host(ssl, host) == 1 && SSL_set_tlsext_host_name(ssl, host) == 1;
    }
    if (!ok || SSL_set_fd(ssl, fd) != 1) {
        tls_errors(why, sizeof why, "cannot set the host to verify");
        goto fail;
    }
    double until = tls_now_s() + timeout_ms / 1000.0;
    for (;;) {
        ERR_clear_error();
        int r = SSL_connect(ssl);
        if (r == 1)
            break;
        int e = SSL_get_error(ssl, r);
        if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) &&
            tls_wait(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, until))
            continue;
        long verify = SSL_get_verify_result(ssl);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
            snprintf(why, sizeof why, "the handshake timed out after %d ms", timeout_ms);
        else if (verify != X509_V_OK)
            snprintf(why, sizeof why, "certificate verification failed: %s",
                     X509_verify_cert_error_string(verify));
        else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
            snprintf(why, sizeof why, "the connection closed during the handshake");
        else
            tls_errors(why, sizeof why, "handshake failed");
        goto fail;
    }
    ERR_clear_error();
    pthread_mutex_lock(&rn_ups.mu);
    bool was_failing = u->last_error[0] != 0;
    u->last_error[0] = 0;
    pthread_mutex_unlock(&rn_ups.mu);
    if (was_failing)
        SW_INFO("router", "worker %s: TLS to %s verified (%s)", u->name, u->host_header,
                SSL_get_version(ssl));
    return ssl;
fail:
    ERR_clear_error();
    tls_log_failure(u, why);
    SSL_free(ssl);
    return NULL;
}

int rn_tls_write(struct ssl_st *ssl, const void *buf, size_t len, int timeout_ms)
{
    double until = tls_now_s() + (timeout_ms > 0 ? timeout_ms : 30000) / 1000.0;
    const char *p = buf;
    while (len > 0) {
        size_t written = 0;
        ERR_clear_error();
        int r = SSL_write_ex(ssl, p, len, &written);
        if (r == 1) {
            p += written;
            len -= written;
            continue;
        }
        int e = SSL_get_error(ssl, r);
        if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) &&
            tls_wait(SSL_get_fd(ssl), e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, until))
            continue;
        ERR_clear_error();
        return -1;
    }
    return 0;
}

long rn_tls_read(struct ssl_st *ssl, void *buf, size_t cap, short *want_events)
{
    size_t got = 0;
    ERR_clear_error();
    int r = SSL_read_ex(ssl, buf, cap, &got);
    if (r == 1)
        return (long)got;
    int e = SSL_get_error(ssl, r);
    *want_events = POLLIN;
    if (e == SSL_ERROR_WANT_READ)
        return -4;
    if (e == SSL_ERROR_WANT_WRITE) {
        *want_events = POLLOUT;
        return -4;
    }
    ERR_clear_error();
    /* a close_notify, or the socket closed without one (allowed above):
     * the end of the connection */
    return e == SSL_ERROR_ZERO_RETURN ? 0 : -1;
}

int rn_tls_pending(struct ssl_st *ssl)
{
    return SSL_pending(ssl);
}

void rn_tls_free(struct ssl_st *ssl)
{
    if (!ssl)
        return;
    SSL_shutdown(ssl); /* non-blocking socket: sends close_notify if it can */
    ERR_clear_error();
    SSL_free(ssl);
}
