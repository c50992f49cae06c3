/* router_harness.c - see router_harness.h. */
#include "router_harness.h"

#include "api/http1.h"

#include "testutil.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#define RH_MAX_LIVE 8

static rh_router *live[RH_MAX_LIVE];

double tu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(path);
    return 0;
}

int rh_make_model(char *out, size_t cap, const char *file, uint64_t seed)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = seed;
    snprintf(out, cap, "%s", tu_tmp_path(file));
    return eng_model_make(&p, out, NULL) == 0 && tu_spillway_bin() ? 0 : -1;
}

int rh_make_sliding_model(char *out, size_t cap, const char *file, uint64_t seed)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.architecture = "gemma3";
    p.n_embd = 64;
    p.n_layer = 4;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32;
    p.n_ff = 128;
    p.n_vocab = 1024;
    p.weight_type = ENG_TYPE_Q8_0;
    p.sliding_window = 16;
    p.sliding_window_pattern = 4; /* layers 0-2 slide, 3 is global */
    p.seed = seed;
    snprintf(out, cap, "%s", tu_tmp_path(file));
    return eng_model_make(&p, out, NULL) == 0 && tu_spillway_bin() ? 0 : -1;
}

void tu_rm_tree(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void rh_init(rh_router *r, const char *name, const char *model, const char *server_extra,
             const char *rest)
{
    static int counter;
    memset(r, 0, sizeof *r);
    char d[128];
    snprintf(d, sizeof d, "rt-%d-%d-%s", (int)getpid(), ++counter, name);
    snprintf(r->dir, sizeof r->dir, "%s", tu_tmp_path(d));
    mkdir(r->dir, 0700);
    snprintf(r->sock, sizeof r->sock, "%s/router.sock", r->dir);
    snprintf(r->cfg, sizeof r->cfg, "%s/router.ini", r->dir);
    snprintf(r->log, sizeof r->log, "%s/router.log", r->dir);
    rh_write_config(r, model, server_extra, rest);
}

void rh_write_config(const rh_router *r, const char *model, const char *server_extra,
                     const char *rest)
{
    /* written whole under another name, then renamed: a reload never
     * reads half a file */
    char tmp[640];
    snprintf(tmp, sizeof tmp, "%s.tmp", r->cfg);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fprintf(f,
            "[server]\nlisten = unix:%s\nstate-dir = %s/state\nhealth-interval-ms = 100\n"
            "ready-timeout = 30\n%s\n[model]\npath = %s\n%s",
            r->sock, r->dir, server_extra ? server_extra : "", model, rest ? rest : "");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, r->cfg), 0);
}

static int exit_status(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int rh_run(rh_router *r, const char *env)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(r->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        unsetenv("SPILLWAY_FAULT");
        unsetenv("SPILLWAY_SABOTAGE");
        if (env)
            putenv((char *)env);
        execl(tu_spillway_bin(), "spillway", "serve", "--config", r->cfg, (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    r->pid = pid;
    r->exit_status = -1;
    for (int i = 0; i < RH_MAX_LIVE; i++)
        if (!live[i] || live[i] == r) {
            live[i] = r;
            break;
        }
    double t0 = tu_now_s();
    while (tu_now_s() - t0 < 40) {
        wc_response h;
        if (wc_request(r->sock, "GET", "/health", NULL, 2000, &h) == 0 && h.status == 200) {
            wc_response_free(&h);
            return 0;
        }
        wc_response_free(&h);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->pid = 0;
            r->exit_status = exit_status(st);
            return -1;
        }
        usleep(50 * 1000);
    }
    return -1;
}

int rh_start(rh_router *r, const char *name, const char *model, const char *server_extra,
             const char *rest)
{
    rh_init(r, name, model, server_extra, rest);
    return rh_run(r, NULL);
}

static void forget(rh_router *r)
{
    for (int i = 0; i < RH_MAX_LIVE; i++)
        if (live[i] == r)
            live[i] = NULL;
}


int rh_stop(rh_router *r)
{
    forget(r);
    if (r->pid <= 0)
        return -1;
    kill(r->pid, SIGTERM);
    double t0 = tu_now_s();
    int st = 0;
    while (waitpid(r->pid, &st, WNOHANG) != r->pid) {
        if (tu_now_s() - t0 > 15) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &st, 0);
            break;
        }
        usleep(20 * 1000);
    }
    r->pid = 0;
    return exit_status(st);
}

int rh_wait_exit(rh_router *r, int timeout_s)
{
    double t0 = tu_now_s();
    int st;
    while (tu_now_s() - t0 < timeout_s) {
        if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
            r->pid = 0;
            return exit_status(st);
        }
        usleep(20 * 1000);
    }
    return -1;
}

void rh_kill9(rh_router *r)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, SIGKILL);
    int st;
    waitpid(r->pid, &st, 0);
    r->pid = 0;
    /* its workers die with it (PR_SET_PDEATHSIG); give them a moment */
    usleep(300 * 1000);
}

void rh_finish(rh_router *r)
{
    assert_int_equal(rh_stop(r), 0);
    char *log = tu_read_file(r->log, NULL);
    assert_non_null(log);
    if (strstr(log, "Sanitizer") || strstr(log, "runtime error"))
        fail_msg("sanitizer report in %s", r->log);
    sw_free(log);
    tu_rm_tree(r->dir);
}

int rh_finish_quiet(rh_router *r)
{
    int st = rh_stop(r);
    char *log = tu_read_file(r->log, NULL);
    bool clean = st == 0 && log && !strstr(log, "Sanitizer") && !strstr(log, "runtime error");
    sw_free(log);
    if (clean)
        tu_rm_tree(r->dir);
    else
        fprintf(stderr, "router exit %d or log not clean: see %s\n", st, r->log);
    return clean ? 0 : -1;
}

void rh_stop_all(void)
{
    for (int i = 0; i < RH_MAX_LIVE; i++)
        if (live[i])
            rh_stop(live[i]);
}

int rh_req(const rh_router *r, const char *method, const char *path, const char *headers,
           const char *body, wc_response *out)
{
    size_t blen = body ? strlen(body) : 0;
    size_t cap = blen + 2048;
    char *raw = sw_malloc(cap);
    assert_non_null(raw);
    int n = snprintf(raw, cap,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, headers ? headers : "", blen, body ? body : "");
    double t0 = tu_now_s();
    int rc = wc_raw(r->sock, raw, (size_t)n, 120000, out);
    sw_free(raw);
    if (rc != 0 && tu_now_s() - t0 > 10.0) { /* no answer: what the router was doing */
        fprintf(stderr, "rh_req: %s %s on %s failed after %.1f s; the end of %s:\n", method, path,
                r->sock, tu_now_s() - t0, r->log);
        size_t len = 0;
        char *log = tu_read_file(r->log, &len);
        if (log)
            fprintf(stderr, "%s\n", len > 6000 ? log + len - 6000 : log);
        sw_free(log);
    }
    return rc;
}

json_t *rh_body_json(const wc_response *w)
{
    return json_loads(w->body ? w->body : "", 0, NULL);
}

void rh_assert_header(const wc_response *w, const char *name, const char *want)
{
    char buf[256];
    if (!wc_header(w, name, buf, sizeof buf))
        fail_msg("header %s missing", name);
    if (want && strcmp(buf, want))
        fail_msg("header %s is '%s', want '%s'", name, buf, want);
}

long long rh_header_ll(const wc_response *w, const char *name)
{
    char v[64];
    if (!wc_header(w, name, v, sizeof v))
        return -1;
    char *end;
    long long x = strtoll(v, &end, 10);
    while (*end == ' ' || *end == '\t')
        end++;
    return end == v || *end ? -2 : x;
}

const char *rh_error_code(const wc_response *w, char *buf, size_t cap)
{
    json_t *j = rh_body_json(w);
    const char *code = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    snprintf(buf, cap, "%s", code ? code : "");
    json_decref(j);
    return buf;
}

json_t *rh_events(const rh_router *r)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/v1/spillway/events", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    json_t *d = json_incref(json_object_get(j, "data"));
    json_decref(j);
    assert_true(json_is_array(d));
    return d;
}

json_t *rh_worker_health(const rh_router *r, const char *name)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/health", NULL, NULL, &w), 0);
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    json_t *ws = json_object_get(j, "workers"), *found = NULL;
    for (size_t i = 0; i < json_array_size(ws); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(ws, i), "name"));
        if (n && !strcmp(n, name))
            found = json_incref(json_array_get(ws, i));
    }
    json_decref(j);
    if (!found)
        fail_msg("the router's /health has no worker '%s'", name);
    return found;
}

void rh_wait_restarted(const rh_router *r, const char *name, int min_restarts)
{
    double t0 = tu_now_s();
    while (tu_now_s() - t0 < 30) {
        json_t *h = rh_worker_health(r, name);
        const char *state = json_string_value(json_object_get(h, "state"));
        bool ok = state && !strcmp(state, "ready") &&
                  json_integer_value(json_object_get(h, "restarts")) >= min_restarts;
        json_decref(h);
        if (ok)
            return;
        usleep(100 * 1000);
    }
    fail_msg("worker %s was not restarted", name);
}

void rh_conn_open(rh_conn *c, const char *sock)
{
    memset(c, 0, sizeof *c);
    c->fd = wc_connect(sock, 20000);
    assert_true(c->fd >= 0);
}

void rh_conn_close(rh_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    sw_free(c->buf);
    c->buf = NULL;
    c->fd = -1;
}

void rh_conn_send(rh_conn *c, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

bool rh_conn_read_more(rh_conn *c, double timeout_s)
{
    struct pollfd p = {c->fd, POLLIN, 0};
    if (poll(&p, 1, (int)(timeout_s * 1000)) <= 0)
        return false;
    if (c->len + 4096 > c->cap) {
        c->cap = (c->len + 4096) * 2;
        c->buf = sw_realloc(c->buf, c->cap + 1);
        assert_non_null(c->buf);
    }
    ssize_t r;
    do
        r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0)
        return false;
    c->len += (size_t)r;
    c->buf[c->len] = 0;
    return true;
}

/* Length of the whole response at the start of p (n bytes), 0 when more
 * bytes are needed. Framed by Content-Length or chunked encoding, read by
 * the tree's own framing (api/http1.h). */
static size_t response_length(const char *p, size_t n)
{
    api_http_response r;
    char *body;
    size_t body_len, used;
    int rc = api_http_decode(p, n, false, &r, &body, &body_len, &used);
    if (rc < 0)
        fail_msg("a malformed response: %.200s", p);
    if (rc == 0) {
        if (api_http_response_head(p, n, (size_t)64 << 10, &r) == 1 && !r.chunked &&
            !r.has_length)
            fail_msg("a response without Content-Length or chunked framing");
        return 0;
    }
    sw_free(body);
    return used;
}

void rh_conn_read_response(rh_conn *c, wc_response *out)
{
    memset(out, 0, sizeof *out);
    double t0 = tu_now_s();
    size_t len;
    while (!(len = c->len ? response_length(c->buf, c->len) : 0)) {
        assert_true(tu_now_s() - t0 < 60);
        if (!rh_conn_read_more(c, 60))
            fail_msg("the connection ended before a whole response (%zu bytes read)", c->len);
    }
    assert_int_equal(wc_response_parse(c->buf, len, out), 0);
    memmove(c->buf, c->buf + len, c->len - len);
    c->len -= len;
}

const char *rh_worker_sock(const rh_router *r, const char *name, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s/state/%s.sock", r->dir, name);
    assert_true(n > 0 && (size_t)n < cap);
    return buf;
}

pid_t rh_worker_pid(const rh_router *r, const char *name)
{
    json_t *h = rh_worker_health(r, name);
    pid_t pid = (pid_t)json_integer_value(json_object_get(h, "pid"));
    json_decref(h);
    assert_true(pid > 0);
    return pid;
}

long long rh_metric(const char *sock, const char *name)
{
    wc_response w;
    assert_int_equal(wc_request(sock, "GET", "/metrics", NULL, 5000, &w), 0);
    assert_int_equal(w.status, 200);
    size_t n = strlen(name);
    const char *p = w.body;
    while (p && !(strncmp(p, name, n) == 0 && p[n] == ' ')) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (!p) {
        wc_response_free(&w);
        fail_msg("no %s in the /metrics of %s", name, sock);
    }
    long long v = strtoll(p + n + 1, NULL, 10);
    wc_response_free(&w);
    return v;
}

long long rh_metric_labeled(const char *sock, const char *name, const char *labels)
{
    char series[512];
    int n = snprintf(series, sizeof series, "%s{%s}", name, labels);
    assert_true(n > 0 && (size_t)n < sizeof series);
    return rh_metric(sock, series);
}

/* GET /metrics at sock, without assertions: the body (sw_free) or NULL. */
static char *metrics_text(const char *sock)
{
    wc_response w;
    if (wc_request(sock, "GET", "/metrics", NULL, 5000, &w) != 0 || w.status != 200 || !w.body) {
        wc_response_free(&w);
        return NULL;
    }
    char *body = w.body;
    w.body = NULL;
    wc_response_free(&w);
    return body;
}

/* The line after the one at p, NULL after the last. */
static const char *next_line(const char *p)
{
    p = strchr(p, '\n');
    return p ? p + 1 : NULL;
}

bool rh_metric_get(const char *sock, const char *series, double *value)
{
    char *text = metrics_text(sock);
    if (!text)
        return false;
    size_t n = strlen(series);
    bool found = false;
    for (const char *p = text; p && *p; p = next_line(p))
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            *value = strtod(p + n + 1, NULL);
            found = true;
            break;
        }
    sw_free(text);
    return found;
}

int rh_metric_sum(const char *sock, const char *name, double *sum)
{
    char *text = metrics_text(sock);
    if (!text)
        return -1;
    size_t n = strlen(name);
    int count = 0;
    double total = 0;
    for (const char *p = text; p && *p; p = next_line(p)) {
        if (strncmp(p, name, n) != 0 || (p[n] != ' ' && p[n] != '{'))
            continue;
        const char *v = p + n;
        if (*v == '{') {
            /* label values may hold '}' only inside quotes */
            bool quoted = false;
            for (v++; *v && *v != '\n' && (quoted || *v != '}'); v++) {
                if (*v == '\\' && quoted && v[1])
                    v++;
                else if (*v == '"')
                    quoted = !quoted;
            }
            if (*v != '}')
                continue;
            v++;
        }
        if (*v != ' ')
            continue;
        total += strtod(v + 1, NULL);
        count++;
    }
    sw_free(text);
    if (sum)
        *sum = total;
    return count;
}

pid_t rh_worker_pid_now(const rh_router *r, const char *name, bool *ready)
{
    if (ready)
        *ready = false;
    wc_response w;
    if (wc_request(r->sock, "GET", "/health", NULL, 5000, &w) != 0) {
        wc_response_free(&w);
        return 0;
    }
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    pid_t pid = 0;
    json_t *ws = json_object_get(j, "workers");
    for (size_t i = 0; i < json_array_size(ws); i++) {
        json_t *e = json_array_get(ws, i);
        const char *n = json_string_value(json_object_get(e, "name"));
        if (!n || strcmp(n, name))
            continue;
        pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
        const char *st = json_string_value(json_object_get(e, "state"));
        if (ready)
            *ready = st && !strcmp(st, "ready");
    }
    json_decref(j);
    return pid;
}

json_t *rh_job_get(const rh_router *r, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/spillway/jobs/%s", id);
    wc_response w;
    assert_int_equal(rh_req(r, "GET", path, NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    assert_non_null(j);
    return j;
}

json_t *rh_job_wait_end(const rh_router *r, const char *id, int timeout_s)
{
    double t0 = tu_now_s();
    for (;;) {
        json_t *j = rh_job_get(r, id);
        const char *s = json_string_value(json_object_get(j, "state"));
        if (s && (!strcmp(s, "succeeded") || !strcmp(s, "failed")))
            return j;
        json_decref(j);
        if (tu_now_s() - t0 > timeout_s)
            fail_msg("job %s did not finish in %d s", id, timeout_s);
        usleep(100 * 1000);
    }
}

bool rh_worker_calls_tools(const char *sock, const char *why)
{
    static const char body[] =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":64,\"temperature\":0,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4}},\"required\":[\"a\"]}}}],"
        "\"tool_choice\":\"required\"}";
    wc_response w;
    bool ok = wc_request(sock, "POST", "/v1/chat/completions", body, 30000, &w) == 0 &&
              w.status == 200 && w.body && strstr(w.body, "\"tool_calls\"");
    wc_response_free(&w);
    if (!ok)
        printf("SKIP: %s\n", why);
    return ok;
}

sqlite3 *rh_ledger_open(const rh_router *r, bool writable)
{
    char path[700];
    snprintf(path, sizeof path, "%s/state/ledger.db", r->dir);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, writable ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY,
                                     NULL),
                     SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    return db;
}

void rh_conn_read_until(rh_conn *c, const char *needle, double timeout_s)
{
    double t0 = tu_now_s();
    while (!(c->buf && strstr(c->buf, needle))) {
        double left = timeout_s - (tu_now_s() - t0);
        if (left <= 0 || !rh_conn_read_more(c, left))
            fail_msg("'%s' did not arrive; so far: %.300s", needle, c->buf ? c->buf : "");
    }
}

void rh_stream_start(rh_conn *c, const rh_router *r, const char *body)
{
    rh_conn_open(c, r->sock);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     strlen(body));
    rh_conn_send(c, head, (size_t)n);
    rh_conn_send(c, body, strlen(body));
    rh_conn_read_until(c, "data: ", 20);
}
