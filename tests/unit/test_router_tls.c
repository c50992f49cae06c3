/* test_router_tls.c - end-to-end: a remote tier, a `kind = openai` worker
 * at an https:// url, with a real `spillway serve` and a small HTTPS
 * upstream (OpenSSL) in a thread of this test.
 *
 * The certificates are made at test time with the openssl CLI: a CA, a
 * server certificate it signs for 127.0.0.1 and localhost, and a second
 * CA that signed nothing here (the wrong one). Without the CLI the tests
 * print SKIP and are skipped.
 *
 * - The right CA in ca-file: the worker becomes ready through GET /health
 *   over TLS, a completion is answered through it (twice, the second on
 *   the pooled TLS connection), the upstream saw Authorization: Bearer
 *   with the key of api-key-env and its own Host, and the key appears
 *   nowhere in the router's log, /health, /metrics or events.
 * - The wrong CA: the worker never becomes ready, the log names the
 *   worker and the verification error, the upstream saw no request, and
 *   requests go to the managed CPU worker beside it.
 * - A certificate from the right CA for another name: refused too (IP
 *   address mismatch), the CPU worker answers.
 * - A refused worker is down in /health with the reason and its
 *   configured ctx_limit; a request only it could take is answered 503 at
 *   once, naming it and why.
 * - remote = never on the model: the remote worker, ready and first in
 *   preference, gets nothing; alone, a typed 503.
 * - Route labels: routine for a model only the remote worker serves,
 *   capacity for a prompt past the CPU worker's context (events, /metrics
 *   and the answer's X-Spillway-Remote-Route); the event stream names them
 *   remote_route, and `spillway status` shows them as remote routes and
 *   the worker's device as remote.
 * - api-key-env naming a variable that is not set: serve refuses to
 *   start with exit status 2 (a bad configuration), saying which.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#define TEST_KEY "sk-spillway-test-5f3a9c1e7d2b"

static char g_model[512];
static char g_dir[512];     /* the certificates */
static bool g_have_certs;

static int sh(const char *cmd)
{
    int rc = system(cmd);
    return rc == 0 ? 0 : -1;
}

/* ca.pem/ca.key, srv.pem/srv.key (signed by ca, for 127.0.0.1 and
 * localhost), other.pem (the same key, signed by ca, for another name
 * only) and wrong.pem (another CA) in g_dir. */
static bool make_certs(void)
{
    if (sh("command -v openssl >/dev/null 2>&1"))
        return false;
    snprintf(g_dir, sizeof g_dir, "%s", tu_tmp_path("tls-certs"));
    mkdir(g_dir, 0700);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && "
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout ca.key -out ca.pem -days 2 -subj /CN=spillway-test-ca "
             "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign,cRLSign && "
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout wrong.key -out wrong.pem -days 2 -subj /CN=spillway-wrong-ca "
             "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign,cRLSign && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout srv.key -out srv.csr -subj /CN=localhost && "
             "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nbasicConstraints=CA:FALSE\\n' "
             "> ext.cnf && "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out srv.pem -days 2 -extfile ext.cnf && "
             "printf 'subjectAltName=DNS:other.example\\nbasicConstraints=CA:FALSE\\n' "
             "> other.cnf && "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out other.pem -days 2 -extfile other.cnf",
             g_dir);
    char full[4200];
    snprintf(full, sizeof full, "(%s) >/dev/null 2>&1", cmd);
    return sh(full) == 0;
}

static int setup(void **state)
{
    (void)state;
    g_have_certs = make_certs();
    if (!g_have_certs)
        printf("SKIP: test_router_tls needs the openssl command to make its certificates\n");
    return rh_make_model(g_model, sizeof g_model, "router-tls.gguf", 13);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    remove(g_model);
    if (g_have_certs)
        tu_rm_tree(g_dir);
    return 0;
}

/* ---- the HTTPS upstream ---------------------------------------------------
 * A thread accepts on 127.0.0.1:PORT; each connection gets a thread of its
 * own (the router keeps idle connections open while it health-checks on
 * new ones), which serves keep-alive requests until the peer closes or
 * the server stops. */

typedef struct tls_server {
    int lfd;
    int port;
    SSL_CTX *ctx;
    pthread_t th;
    atomic_bool stop;
    atomic_int n_conns;        /* connection threads running */
    pthread_mutex_t mu;
    int n_requests;            /* requests answered (any path) */
    int n_completions;
    int n_handshakes;
    char auth[256];            /* the last Authorization header seen */
    char host[128];            /* the last Host header seen */
} tls_server;

/* One server at a time, static: a test that failed with it running leaves
 * its threads on this, not on a stack gone, and the next start stops it. */
static tls_server g_srv;
static bool g_srv_running;

typedef struct tls_conn {
    tls_server *s;
    int fd;
} tls_conn;

/* Waits for input on fd (or bytes pending in ssl) while the server runs. */
static bool conn_wait(tls_server *s, SSL *ssl, int fd)
{
    while (!atomic_load(&s->stop)) {
        if (ssl && SSL_pending(ssl) > 0)
            return true;
        struct pollfd p = {fd, POLLIN, 0};
        int n = poll(&p, 1, 100);
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
    return false;
}

static void header_value(const char *head, const char *name, char *out, size_t cap)
{
    out[0] = 0;
    size_t nl = strlen(name);
    for (const char *p = head; p && *p; p = strstr(p, "\r\n"), p = p ? p + 2 : NULL) {
        if (!strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t n = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)n, v);
            return;
        }
    }
}

static void conn_reply(SSL *ssl, int status, const char *body)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: keep-alive\r\n\r\n%s",
                     status, status == 200 ? "OK" : "Not Found", strlen(body), body);
    SSL_write(ssl, buf, n);
}

/* A stream as an OpenAI server sends it: SSE events in chunks, [DONE]. */
static void conn_stream(SSL *ssl)
{
    static const char *events[] = {
        "data: {\"id\":\"cmpl-remote\",\"object\":\"text_completion\",\"created\":1,"
        "\"model\":\"remote\",\"choices\":[{\"index\":0,\"text\":\" streamed\","
        "\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"cmpl-remote\",\"object\":\"text_completion\",\"created\":1,"
        "\"model\":\"remote\",\"choices\":[{\"index\":0,\"text\":\" over TLS\","
        "\"finish_reason\":\"length\"}]}\n\n",
        "data: [DONE]\n\n",
    };
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n";
    SSL_write(ssl, head, (int)strlen(head));
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++) {
        char chunk[1024];
        int n = snprintf(chunk, sizeof chunk, "%zx\r\n%s\r\n", strlen(events[i]), events[i]);
        SSL_write(ssl, chunk, n);
        usleep(20 * 1000); /* separate records, separate reads */
    }
    SSL_write(ssl, "0\r\n\r\n", 5);
}

static void *conn_main(void *arg)
{
    tls_conn *tc = arg;
    tls_server *s = tc->s;
    int fd = tc->fd;
    free(tc);
    SSL *ssl = SSL_new(s->ctx);
    SSL_set_fd(ssl, fd);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (SSL_accept(ssl) != 1)
        goto out; /* the wrong-CA case: the client refuses our certificate */
    pthread_mutex_lock(&s->mu);
    s->n_handshakes++;
    pthread_mutex_unlock(&s->mu);
    char req[16384];
    size_t len = 0;
    for (;;) {
        char *end = len ? memmem(req, len, "\r\n\r\n", 4) : NULL;
        if (!end) {
            if (len == sizeof req - 1 || !conn_wait(s, ssl, fd))
                break;
            int r = SSL_read(ssl, req + len, (int)(sizeof req - 1 - len));
            if (r <= 0)
                break;
            len += (size_t)r;
            continue;
        }
        size_t head_len = (size_t)(end - req) + 4;
        req[len] = 0;
        char cl[32], auth[256], host[128];
        header_value(req, "Content-Length", cl, sizeof cl);
        size_t body_len = (size_t)atol(cl);
        if (head_len + body_len >= sizeof req)
            break;
        while (len < head_len + body_len) {
            if (!conn_wait(s, ssl, fd))
                goto out;
            int r = SSL_read(ssl, req + len, (int)(sizeof req - 1 - len));
            if (r <= 0)
                goto out;
            len += (size_t)r;
        }
        header_value(req, "Authorization", auth, sizeof auth);
        header_value(req, "Host", host, sizeof host);
        bool completion = !strncmp(req, "POST /v1/completions ", 21);
        pthread_mutex_lock(&s->mu);
        s->n_requests++;
        s->n_completions += completion;
        snprintf(s->auth, sizeof s->auth, "%s", auth);
        snprintf(s->host, sizeof s->host, "%s", host);
        pthread_mutex_unlock(&s->mu);
        if (!strncmp(req, "GET /health ", 12))
            conn_reply(ssl, 200, "{\"status\":\"ok\"}");
        else if (!strncmp(req, "GET /v1/models ", 15))
            conn_reply(ssl, 200, "{\"object\":\"list\",\"data\":[{\"id\":\"remote\","
                                 "\"object\":\"model\"}]}");
        else if (completion && strstr(req + head_len, "\"stream\":true"))
            conn_stream(ssl);
        else if (completion)
            conn_reply(ssl, 200,
                       "{\"id\":\"cmpl-remote\",\"object\":\"text_completion\",\"created\":1,"
                       "\"model\":\"remote\",\"choices\":[{\"index\":0,\"text\":\" from the "
                       "remote tier\",\"finish_reason\":\"length\",\"logprobs\":null}],"
                       "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":4,"
                       "\"total_tokens\":8}}");
        else
            conn_reply(ssl, 404, "{\"error\":{\"message\":\"not found\"}}");
        memmove(req, req + head_len + body_len, len - head_len - body_len);
        len -= head_len + body_len;
    }
out:
    SSL_shutdown(ssl);
    SSL_free(ssl);
    close(fd);
    atomic_fetch_sub(&s->n_conns, 1);
    return NULL;
}

static void *accept_main(void *arg)
{
    tls_server *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd p = {s->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        tls_conn *tc = malloc(sizeof *tc);
        assert_non_null(tc);
        tc->s = s;
        tc->fd = fd;
        atomic_fetch_add(&s->n_conns, 1);
        pthread_t th;
        if (pthread_create(&th, NULL, conn_main, tc) != 0) {
            atomic_fetch_sub(&s->n_conns, 1);
            close(fd);
            free(tc);
            continue;
        }
        pthread_detach(th);
    }
    return NULL;
}

static void tls_server_stop(tls_server *s);

static const char *g_srv_cert = "srv.pem"; /* what the next server shows */

static void tls_server_start(tls_server *s)
{
    if (g_srv_running)
        tls_server_stop(&g_srv);
    g_srv_running = true;
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->ctx = SSL_CTX_new(TLS_server_method());
    assert_non_null(s->ctx);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", g_dir, g_srv_cert);
    assert_int_equal(SSL_CTX_use_certificate_chain_file(s->ctx, path), 1);
    snprintf(path, sizeof path, "%s/srv.key", g_dir);
    assert_int_equal(SSL_CTX_use_PrivateKey_file(s->ctx, path, SSL_FILETYPE_PEM), 1);
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->lfd, 16), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s->th, NULL, accept_main, s), 0);
}

static void tls_server_stop(tls_server *s)
{
    g_srv_running = false;
    atomic_store(&s->stop, true);
    pthread_join(s->th, NULL);
    close(s->lfd);
    for (int i = 0; i < 100 && atomic_load(&s->n_conns) > 0; i++)
        usleep(50 * 1000);
    assert_int_equal(atomic_load(&s->n_conns), 0);
    SSL_CTX_free(s->ctx);
    pthread_mutex_destroy(&s->mu);
}

/* ---- checks ---------------------------------------------------------------- */

static const char *BODY = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}";

static const char *worker_state(const rh_router *r, const char *name, char *out, size_t cap)
{
    json_t *h = rh_worker_health(r, name);
    snprintf(out, cap, "%s", json_string_value(json_object_get(h, "state")) ?: "");
    json_decref(h);
    return out;
}

static void wait_ready(const rh_router *r, const char *name)
{
    char st[32];
    for (double t0 = tu_now_s(); tu_now_s() - t0 < 30; usleep(50 * 1000))
        if (!strcmp(worker_state(r, name, st, sizeof st), "ready"))
            return;
    fail_msg("worker %s never became ready", name);
}

/* Fails when the key is in the text of GET path. */
static void assert_no_key_in(const rh_router *r, const char *path)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", path, NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    assert_non_null(w.body);
    if (memmem(w.body, w.body_len, TEST_KEY, strlen(TEST_KEY)))
        fail_msg("the api key appears in %s", path);
    wc_response_free(&w);
}

/* Fails when the key is in any file of the router's directory (its
 * state: the ledger, the logs). */
static void assert_no_key_in_files(const rh_router *r)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "grep -rqaF '%s' '%s'", TEST_KEY, r->dir);
    if (system(cmd) == 0)
        fail_msg("the api key appears in a file under %s", r->dir);
}

/* POST /v1/completions body: 200, answered by worker. */
static void expect_served_by(const rh_router *r, const char *body, const char *worker)
{
    wc_response a;
    char v[64];
    assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL, body, &a), 0);
    assert_int_equal(a.status, 200);
    assert_true(wc_header(&a, "X-Spillway-Worker", v, sizeof v));
    assert_string_equal(v, worker);
    wc_response_free(&a);
}

/* The completions the upstream answered (read under its lock, asserted
 * outside it). */
static int upstream_completions(tls_server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_completions;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* How many remote_route events for worker say route. */
static int count_routes(const rh_router *r, const char *worker, const char *route)
{
    json_t *evs = rh_events(r);
    int n = 0;
    for (size_t i = 0; i < json_array_size(evs); i++) {
        json_t *e = json_array_get(evs, i);
        n += !strcmp(json_string_value(json_object_get(e, "type")) ?: "", "remote_route") &&
             !strcmp(json_string_value(json_object_get(e, "worker")) ?: "", worker) &&
             !strcmp(json_string_value(json_object_get(e, "route")) ?: "", route);
    }
    json_decref(evs);
    return n;
}

static long long route_metric(const rh_router *r, const char *worker, const char *route)
{
    char labels[128];
    snprintf(labels, sizeof labels, "worker=\"%s\",route=\"%s\"", worker, route);
    return rh_metric_labeled(r->sock, "spillway_router_remote_requests_total", labels);
}

static char *read_log(const rh_router *r)
{
    size_t n = 0;
    char *log = tu_read_file(r->log, &n);
    assert_non_null(log);
    return log;
}

/* Routine remote routing as the operator sees it: the event stream
 * names the events remote_route (not failover), the stats and `spillway
 * status` give the worker's device as remote and its memory as a remote
 * service's, and status lists the routes as remote routes. */
static void expect_remote_views(const rh_router *r)
{
    rh_conn c;
    rh_conn_open(&c, r->sock);
    static const char req[] = "GET /v1/spillway/events/stream HTTP/1.1\r\nHost: t\r\n\r\n";
    rh_conn_send(&c, req, sizeof req - 1);
    rh_conn_read_until(&c, "\"route\":\"routine\"", 20);
    assert_non_null(strstr(c.buf, "event: remote_route\ndata: {"));
    assert_null(strstr(c.buf, "event: failover"));
    rh_conn_close(&c);

    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/v1/spillway/stats", NULL, NULL, &w), 0);
    json_t *stats = rh_body_json(&w);
    wc_response_free(&w);
    assert_non_null(stats);
    json_t *ws = json_object_get(stats, "workers");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ws, 0), "device")),
                        "remote");
    json_decref(stats);

    char url[700];
    snprintf(url, sizeof url, "unix:%s", r->sock);
    char *argv[] = {(char *)tu_spillway_bin(), "status", "--router", url, NULL};
    char *out = NULL;
    int st = -1;
    assert_int_equal(tu_run_capture(argv, 60, &out, &st), 0);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "remote service (not counted)"));
    assert_non_null(strstr(out, "remote route"));
    assert_non_null(strstr(out, "to remote (routine)"));
    assert_null(strstr(out, "failover "));
    sw_free(out);
}

/* The upstream, then a router whose [worker remote] is at its https://
 * url with ca-file = g_dir/ca and the key in TEST_KEY_VAR; model: more
 * lines of the [model] section; more: the rest of the worker's section
 * and further sections. */
static void start_both(tls_server *s, rh_router *r, const char *name, const char *model,
                       const char *ca, const char *more)
{
    tls_server_start(s);
    char workers[2048];
    snprintf(workers, sizeof workers,
             "%s[worker remote]\nkind = openai\nurl = https://127.0.0.1:%d\n"
             "ca-file = %s/%s\napi-key-env = TEST_KEY_VAR\nctx-limit = 1024\n%s",
             model, s->port, g_dir, ca, more);
    rh_init(r, name, g_model, NULL, workers);
    assert_int_equal(rh_run(r, "TEST_KEY_VAR=" TEST_KEY), 0);
}

static void test_tls_remote_serves(void **state)
{
    (void)state;
    if (!g_have_certs)
        skip();
    tls_server *s = &g_srv;
    rh_router r;
    start_both(s, &r, "tls-serve", "", "ca.pem", "");
    wait_ready(&r, "remote");
    for (int i = 0; i < 2; i++) {
        wc_response a;
        assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, BODY, &a), 0);
        assert_int_equal(a.status, 200);
        char v[64];
        assert_true(wc_header(&a, "X-Spillway-Worker", v, sizeof v));
        assert_string_equal(v, "remote");
        rh_assert_header(&a, "X-Spillway-Remote-Route", "routine");
        assert_non_null(strstr(a.body, "from the remote tier"));
        wc_response_free(&a);
    }
    /* a stream: chunked SSE read over TLS, relayed */
    wc_response st;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,"
                            "\"stream\":true}",
                            &st),
                     0);
    assert_int_equal(st.status, 200);
    rh_assert_header(&st, "X-Spillway-Remote-Route", "routine");
    assert_non_null(strstr(st.body, " streamed"));
    assert_non_null(strstr(st.body, " over TLS"));
    assert_non_null(strstr(st.body, "[DONE]"));
    wc_response_free(&st);

    /* the model lives only there: routine, each attempt */
    assert_int_equal(count_routes(&r, "remote", "routine"), 3);
    assert_int_equal(count_routes(&r, "remote", "capacity"), 0);
    assert_int_equal(route_metric(&r, "remote", "routine"), 3);
    assert_int_equal(route_metric(&r, "remote", "capacity"), 0);
    expect_remote_views(&r);

    /* what it saw, copied out: no assertion fails with its lock held */
    pthread_mutex_lock(&s->mu);
    int n_completions = s->n_completions;
    char auth[sizeof s->auth], host[sizeof s->host];
    memcpy(auth, s->auth, sizeof auth);
    memcpy(host, s->host, sizeof host);
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(n_completions, 3);
    assert_string_equal(auth, "Bearer " TEST_KEY);
    char want_host[64];
    snprintf(want_host, sizeof want_host, "127.0.0.1:%d", s->port);
    assert_string_equal(host, want_host);

    assert_no_key_in(&r, "/health");
    assert_no_key_in(&r, "/metrics");
    assert_no_key_in(&r, "/v1/spillway/events");
    char *log = read_log(&r);
    assert_null(strstr(log, TEST_KEY));
    sw_free(log);
    assert_no_key_in_files(&r);
    rh_finish(&r);
    tls_server_stop(s);
}

static void test_tls_wrong_ca_refused(void **state)
{
    (void)state;
    if (!g_have_certs)
        skip();
    tls_server *s = &g_srv;
    rh_router r;
    start_both(s, &r, "tls-wrong", "", "wrong.pem",
               "preference = -1\n[worker cpu]\nthreads = 1\nctx-limit = 1024\n");
    wait_ready(&r, "cpu");
    /* the log says why, naming the worker, within a few health checks */
    bool logged = false;
    for (double t0 = tu_now_s(); !logged && tu_now_s() - t0 < 10; usleep(100 * 1000)) {
        char *log = read_log(&r);
        logged = strstr(log, "worker remote: TLS to 127.0.0.1:") &&
                 strstr(log, "certificate verification failed");
        sw_free(log);
    }
    assert_true(logged);
    char st[32];
    assert_string_not_equal(worker_state(&r, "remote", st, sizeof st), "ready");
    expect_served_by(&r, BODY, "cpu");
    assert_string_not_equal(worker_state(&r, "remote", st, sizeof st), "ready");
    pthread_mutex_lock(&s->mu);
    int n_handshakes = s->n_handshakes, n_requests = s->n_requests;
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(n_handshakes, 0);
    assert_int_equal(n_requests, 0);
    /* logged once, not at every health check */
    char *log = read_log(&r);
    int times = 0;
    for (const char *p = log; (p = strstr(p, "certificate verification failed")); p++)
        times++;
    assert_int_equal(times, 1);
    assert_null(strstr(log, TEST_KEY));
    sw_free(log);
    assert_no_key_in(&r, "/health");
    assert_no_key_in(&r, "/metrics");
    assert_no_key_in(&r, "/v1/spillway/events");
    rh_finish(&r);
    tls_server_stop(s);
}

/* A worker refused for its certificate: /health says it is down and why,
 * with its configured ctx_limit; a request only it could take (the CPU
 * worker's context is too small) gets its 503 at once, naming the worker
 * and the reason, though the queue would let it wait a minute. */
static void test_tls_refused_reason(void **state)
{
    (void)state;
    if (!g_have_certs)
        skip();
    tls_server *s = &g_srv;
    tls_server_start(s);
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker remote]\nkind = openai\nurl = https://127.0.0.1:%d\n"
             "ca-file = %s/wrong.pem\napi-key-env = TEST_KEY_VAR\nctx-limit = 1024\n"
             "preference = 10\n[worker cpu]\nthreads = 1\nctx-limit = 32\n",
             s->port, g_dir);
    rh_router r;
    rh_init(&r, "tls-reason", g_model, "queue-timeout-ms = 60000\n", workers);
    assert_int_equal(rh_run(&r, "TEST_KEY_VAR=" TEST_KEY), 0);
    wait_ready(&r, "cpu");
    json_t *h = NULL;
    const char *reason = NULL;
    for (double t0 = tu_now_s(); tu_now_s() - t0 < 10; usleep(100 * 1000)) {
        json_decref(h);
        h = rh_worker_health(&r, "remote");
        reason = json_string_value(json_object_get(h, "reason"));
        if (reason && strstr(reason, "certificate verification failed"))
            break;
    }
    assert_non_null(reason);
    assert_non_null(strstr(reason, "TLS: certificate verification failed"));
    assert_string_equal(json_string_value(json_object_get(h, "state")), "down");
    assert_int_equal(json_integer_value(json_object_get(h, "ctx_limit")), 1024);
    json_decref(h);

    char big[4096];
    int n = snprintf(big, sizeof big, "{\"prompt\":\"");
    for (int i = 0; i < 40; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "once upon a time ");
    snprintf(big + n, sizeof big - (size_t)n, "\",\"max_tokens\":4}");
    wc_response a;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, big, &a), 0);
    assert_int_equal(a.status, 503);
    char code[64];
    assert_string_equal(rh_error_code(&a, code, sizeof code), "capacity_exceeded");
    if (!strstr(a.body, "worker remote is down (TLS: certificate verification failed") ||
        !strstr(a.body, "does not pass by itself"))
        fail_msg("the 503 does not say why: %s", a.body);
    wc_response_free(&a);
    /* what the CPU worker can take still runs there */
    expect_served_by(&r, BODY, "cpu");
    assert_int_equal(upstream_completions(s), 0);
    rh_finish(&r);

    /* alone, it never becomes ready: the router gives up after its
     * ready-timeout, saying why (not a log path: it has none) */
    snprintf(workers, sizeof workers,
             "[worker remote]\nkind = openai\nurl = https://127.0.0.1:%d\n"
             "ca-file = %s/wrong.pem\napi-key-env = TEST_KEY_VAR\nctx-limit = 1024\n",
             s->port, g_dir);
    rh_init(&r, "tls-reason-alone", g_model, "ready-timeout = 2\n", workers);
    assert_int_equal(rh_run(&r, "TEST_KEY_VAR=" TEST_KEY), -1);
    assert_int_equal(r.exit_status, 1);
    char *log = read_log(&r);
    char want[200];
    snprintf(want, sizeof want,
             "worker remote at https://127.0.0.1:%d did not become ready: TLS: certificate "
             "verification failed", s->port);
    if (!strstr(log, want))
        fail_msg("the log lacks '%s':\n%s", want, log);
    assert_null(strstr(log, "log: https"));
    sw_free(log);
    rh_stop(&r);
    tu_rm_tree(r.dir);
    tls_server_stop(s);
}

/* remote = never on the model: with a CPU worker beside it, the remote
 * worker (tried first, and ready) gets nothing; alone, a typed 503. */
static void test_tls_remote_never(void **state)
{
    (void)state;
    if (!g_have_certs)
        skip();
    tls_server *s = &g_srv;
    rh_router r;
    start_both(s, &r, "tls-never", "remote = never\n", "ca.pem",
               "preference = -1\n[worker cpu]\nthreads = 1\nctx-limit = 1024\n");
    wait_ready(&r, "remote");
    wait_ready(&r, "cpu");
    for (int i = 0; i < 2; i++)
        expect_served_by(&r, BODY, "cpu");
    assert_int_equal(upstream_completions(s), 0);
    rh_finish(&r);
    tls_server_stop(s);

    start_both(s, &r, "tls-never-alone", "remote = never\n", "ca.pem", "");
    wait_ready(&r, "remote");
    wc_response a;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, BODY, &a), 0);
    assert_int_equal(a.status, 503);
    char code[64];
    assert_string_equal(rh_error_code(&a, code, sizeof code), "capacity_exceeded");
    assert_non_null(strstr(a.body, "remote = never"));
    wc_response_free(&a);
    rh_finish(&r);
    assert_int_equal(upstream_completions(s), 0);
    tls_server_stop(s);
}

/* route labels: a local CPU worker first, the remote one after it. A
 * request the CPU worker takes sends nothing remote; one whose prompt
 * exceeds the CPU worker's context goes remote as capacity. */
static void test_tls_route_capacity(void **state)
{
    (void)state;
    if (!g_have_certs)
        skip();
    tls_server *s = &g_srv;
    rh_router r;
    start_both(s, &r, "tls-route", "", "ca.pem",
               "preference = 10\n[worker cpu]\nthreads = 1\nctx-limit = 32\n");
    wait_ready(&r, "remote");
    wait_ready(&r, "cpu");
    expect_served_by(&r, BODY, "cpu");
    char big[4096];
    int n = snprintf(big, sizeof big, "{\"prompt\":\"");
    for (int i = 0; i < 40; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "once upon a time ");
    snprintf(big + n, sizeof big - (size_t)n, "\",\"max_tokens\":4}");
    expect_served_by(&r, big, "remote");
    wc_response a;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, big, &a), 0);
    rh_assert_header(&a, "X-Spillway-Remote-Route", "capacity");
    wc_response_free(&a);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, BODY, &a), 0);
    char route[32];
    assert_false(wc_header(&a, "X-Spillway-Remote-Route", route, sizeof route)); /* cpu's */
    wc_response_free(&a);
    assert_int_equal(count_routes(&r, "remote", "capacity"), 2);
    assert_int_equal(count_routes(&r, "remote", "routine"), 0);
    assert_int_equal(route_metric(&r, "remote", "capacity"), 2);
    assert_int_equal(route_metric(&r, "remote", "routine"), 0);
    rh_finish(&r);
    tls_server_stop(s);
}

/* A certificate from the right CA for another name: refused (the host
 * is checked, not only the chain); the CPU worker beside it answers. */
static void test_tls_wrong_host_refused(void **state)
{
    (void)state;
    if (!g_have_certs)
        skip();
    tls_server *s = &g_srv;
    rh_router r;
    g_srv_cert = "other.pem";
    start_both(s, &r, "tls-host", "", "ca.pem",
               "preference = -1\n[worker cpu]\nthreads = 1\nctx-limit = 1024\n");
    g_srv_cert = "srv.pem";
    wait_ready(&r, "cpu");
    bool logged = false;
    for (double t0 = tu_now_s(); !logged && tu_now_s() - t0 < 10; usleep(100 * 1000)) {
        char *log = read_log(&r);
        logged = strstr(log, "worker remote: TLS to 127.0.0.1:") &&
                 strstr(log, "IP address mismatch");
        sw_free(log);
    }
    assert_true(logged);
    char st[32];
    assert_string_not_equal(worker_state(&r, "remote", st, sizeof st), "ready");
    expect_served_by(&r, BODY, "cpu");
    assert_int_equal(upstream_completions(s), 0);
    rh_finish(&r);
    tls_server_stop(s);
}

static void test_tls_missing_key_variable(void **state)
{
    (void)state;
    rh_router r;
    rh_init(&r, "tls-nokey", g_model, NULL,
            "[worker remote]\nkind = openai\nurl = https://127.0.0.1:9\n"
            "api-key-env = SPILLWAY_TEST_UNSET_KEY\n");
    assert_int_equal(rh_run(&r, NULL), -1);
    assert_int_equal(r.exit_status, 2); /* a bad configuration */
    char *log = read_log(&r);
    assert_non_null(strstr(log, "[worker remote]: api-key-env = SPILLWAY_TEST_UNSET_KEY, but "
                                "SPILLWAY_TEST_UNSET_KEY is not set"));
    sw_free(log);
    rh_stop(&r); /* already exited: only forgets it */
    tu_rm_tree(r.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls_remote_serves),
        cmocka_unit_test(test_tls_wrong_ca_refused),
        cmocka_unit_test(test_tls_wrong_host_refused),
        cmocka_unit_test(test_tls_remote_never),
        cmocka_unit_test(test_tls_refused_reason),
        cmocka_unit_test(test_tls_route_capacity),
        cmocka_unit_test(test_tls_missing_key_variable),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
