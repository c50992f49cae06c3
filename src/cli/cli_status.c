/* cli_status.c - `spillway status`: the dashboard's picture in a terminal
 * table. One GET /v1/spillway/stats (the workers, their memory, the queue,
 * the last 10 minutes' activity) and one GET /v1/spillway/events (the
 * latest events, each shown as its kind says) per refresh, over the router's own HTTP client
 * (router_net.h): a router at http://HOST:PORT or unix:PATH, the API key
 * sent as a Bearer token. --json prints the snapshot as JSON instead
 * (the stats object plus "events" and "failovers"), --watch redraws it every
 * --interval seconds until Ctrl-C. docs/router.md, Status.
 */
#include "cli/cli.h"

#include "common/alloc.h"
#include "router/router_net.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STATUS_BODY_MAX ((size_t)8 << 20)
#define STATUS_EVENTS_SHOWN 8

static volatile sig_atomic_t status_stop;

static void on_sigint(int sig)
{
    (void)sig;
    status_stop = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway status [--router URL] [--key KEY] [--json] [--watch [--interval S]]\n"
            "  The router's workers, memory, queue, recent activity and latest events.\n"
            "  --router URL   http://HOST:PORT, HOST:PORT or unix:PATH (default\n"
            "                 http://127.0.0.1:8080)\n"
            "  --key KEY      an API key of the router's [server] api-keys (default\n"
            "                 $SPILLWAY_API_KEY)\n"
            "  --json         the snapshot as JSON (/v1/spillway/stats plus \"events\" and\n"
            "                 \"failovers\", the failover records among them)\n"
            "  --watch        redraw until Ctrl-C (with --json: one JSON line per refresh)\n"
            "  --interval S   seconds between refreshes with --watch (default 2)\n"
            "Exit status: 0 when the router answered and a worker is ready, 1 when it is\n"
            "unavailable or cannot be read, 2 for bad options.\n");
}

/* GET path with the key: the status, the body as JSON into *out (NULL when
 * it is not JSON); -1 when the router could not be reached. */
static int status_get(const char *router, const char *key, const char *path, json_t **out)
{
    char hdr[512] = "";
    if (key && *key)
        snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", key);
    rn_conn c;
    *out = NULL;
    if (rn_request(&c, router, "GET", path, hdr, NULL, 0, -1, 5000) != 0) {
        rn_close(&c);
        return -1;
    }
    int st = c.status;
    char *body = NULL;
    size_t len = 0;
    if (rn_body_all(&c, &body, &len, STATUS_BODY_MAX) != 0)
        st = -1;
    rn_close(&c);
    if (body)
        *out = json_loadb(body, len, 0, NULL);
    sw_free(body);
    return st;
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static long long num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : (long long)json_number_value(v);
}

static long long series_sum(json_t *arr)
{
    long long s = 0;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) s += (long long)json_integer_value(v);
    return s;
}

static void fmt_bytes(long long n, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = n > 0 ? (double)n : 0;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%.0f %s", v, units[u]);
    else
        snprintf(buf, cap, "%.1f %s", v, units[u]);
}

/* The memory bar, 20 cells: '#' this worker's context (weights,
 * workspace, KV in use), 'c' KV its prefix cache keeps (evictable), 'o'
 * other use, '.' free, 'r' the reserve. */
static void mem_bar(json_t *m, const char *device, char *buf, size_t cap)
{
    if (!json_is_true(json_object_get(m, "counted"))) {
        /* a remote service's memory is not this machine's */
        snprintf(buf, cap, "%s", !strcmp(device, "remote") ? "remote service (not counted)"
                                                            : "host memory (not counted)");
        return;
    }
    double total = (double)num(m, "total_bytes");
    double part[5] = {(double)(num(m, "weights_bytes") + num(m, "kv_used_bytes")),
                      (double)num(m, "kv_cached_bytes"), (double)num(m, "other_bytes"),
                      (double)num(m, "free_bytes"), (double)num(m, "reserve_bytes")};
    const char marks[5] = {'#', 'c', 'o', '.', 'r'};
    char bar[21];
    int at = 0;
    double acc = 0;
    for (int p = 0; p < 5; p++) {
        acc += part[p];
        int upto = total > 0 ? (int)(acc / total * 20 + 0.5) : 0;
        if (upto > 20)
            upto = 20;
        while (at < upto)
            bar[at++] = marks[p];
    }
    while (at < 20)
        bar[at++] = '.';
    bar[20] = 0;
    char used[32], tot[32];
    fmt_bytes((long long)(total - part[3] - part[4]), used, sizeof used);
    fmt_bytes((long long)total, tot, sizeof tot);
    snprintf(buf, cap, "[%s] %s/%s", bar, used, tot);
}

/* A record's kind: its "type"; a record without one (from a router that
 * did not name failovers) is a failover. */
static const char *event_type(json_t *e)
{
    const char *t = str(e, "type");
    return *t ? t : "failover";
}

/* One event record as one line of the table: its time, its kind, then
 * what that kind says (a routine remote route is not a failure, and a
 * worker started on demand has no request). */
static void print_event(json_t *e, char *line, size_t cap)
{
    const char *type = event_type(e);
    json_t *when_v = json_object_get(e, "received_time");
    if (!json_is_number(when_v))
        when_v = json_object_get(e, "time");
    time_t t = (time_t)json_number_value(when_v);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", localtime(&t));
    if (!strcmp(type, "failover")) {
        json_t *fe = json_object_get(e, "first_error");
        const char *rw = str(e, "replay_worker");
        snprintf(line, cap, "%s  %-17s  %s  %s on %s, %s on %s: %s", when, "failover",
                 str(e, "request_id"), str(fe, "kind"), str(fe, "worker"), str(e, "decision"),
                 *rw ? rw : "none", str(e, "outcome"));
    } else if (!strcmp(type, "remote_route")) {
        snprintf(line, cap, "%s  %-17s  %s  model %s to %s (%s)", when, "remote route",
                 str(e, "request_id"), str(e, "model"), str(e, "worker"), str(e, "route"));
    } else if (!strcmp(type, "capacity_fallback")) {
        snprintf(line, cap, "%s  %-17s  %s  model %s to model %s: %s", when, "capacity fallback",
                 str(e, "request_id"), str(e, "from_model"), str(e, "to_model"),
                 str(e, "reason"));
    } else if (!strncmp(type, "worker_", 7)) {
        /* worker_starting, worker_ready, worker_stopped: on demand */
        const char *fw = str(e, "for_worker");
        char extra[96] = "";
        if (!strcmp(type, "worker_ready"))
            snprintf(extra, sizeof extra, " after %.1f s",
                     json_number_value(json_object_get(e, "start_seconds")));
        else if (*fw)
            snprintf(extra, sizeof extra, " for %s", fw);
        char head[32];
        snprintf(head, sizeof head, "worker %s", type + 7);
        snprintf(line, cap, "%s  %-17s  %s (model %s)%s: %s", when, head, str(e, "worker"),
                 str(e, "model"), extra, str(e, "reason"));
    } else {
        const char *w = str(e, "worker"), *id = str(e, "request_id");
        snprintf(line, cap, "%s  %-17s  %s%s%s", when, type, id, *id && *w ? " " : "", w);
    }
}

static void print_table(FILE *out, const char *router, json_t *stats, json_t *events)
{
    json_t *queue = json_object_get(stats, "queue"), *series = json_object_get(stats, "series");
    fprintf(out, "router %s  %s  up %.0f s  connections %lld  event streams %lld\n", router,
            str(stats, "status"), json_number_value(json_object_get(stats, "uptime_seconds")),
            num(stats, "connections"), num(stats, "event_streams"));
    json_t *ledger = json_object_get(stats, "ledger");
    if (json_is_object(ledger))
        fprintf(out, "ledger %s%s  owner %s  lease %.0f s  %s\n", str(ledger, "backend"),
                json_is_true(json_object_get(ledger, "shared")) ? " (shared)" : "",
                str(ledger, "owner"), json_number_value(json_object_get(ledger, "lease_s")),
                json_is_true(json_object_get(ledger, "reachable")) ? "reachable"
                                                                    : "UNREACHABLE");
    fprintf(out, "queue %lld (peak %lld)  mean wait %.1f ms  last %lld min: %lld requests, "
            "%lld tokens, %lld failovers, %lld failed attempts\n",
            num(queue, "depth"), num(queue, "peak_depth"),
            json_number_value(json_object_get(queue, "wait_seconds_mean")) * 1000,
            num(stats, "slots") * num(stats, "slot_seconds") / 60,
            series_sum(json_object_get(series, "requests")),
            series_sum(json_object_get(series, "tokens")),
            series_sum(json_object_get(series, "failovers")),
            series_sum(json_object_get(series, "failed")));
    json_t *workers = json_object_get(stats, "workers");
    int name_w = 6, model_w = 5, dev_w = 6;
    size_t i;
    json_t *w;
    json_array_foreach(workers, i, w) {
        int n = (int)strlen(str(w, "name")), d = (int)strlen(str(w, "device"));
        int m = (int)strlen(str(w, "model"));
        name_w = n > name_w ? n : name_w;
        model_w = m > model_w ? m : model_w;
        dev_w = d > dev_w ? d : dev_w;
    }
    fprintf(out, "\n%-*s  %-*s  %-8s  %-*s  %-7s  %-40s  %-27s  %8s  %8s  %8s\n", name_w,
            "WORKER", model_w, "MODEL", "STATE", dev_w, "DEVICE", "SEQS", "MEMORY",
            "KV USED/ADMITTED +CACHED", "REQ/10M", "TOK/10M", "RESTARTS");
    json_array_foreach(workers, i, w) {
        json_t *books = json_object_get(w, "books"), *m = json_object_get(w, "memory");
        json_t *ws = json_object_get(w, "series");
        char seqs[24], bar[96], kv[80];
        long long max = num(books, "max_seqs");
        if (max > 0)
            snprintf(seqs, sizeof seqs, "%lld/%lld", num(books, "seqs"), max);
        else
            snprintf(seqs, sizeof seqs, "%lld", num(books, "seqs"));
        mem_bar(m, str(w, "device"), bar, sizeof bar);
        if (json_is_true(json_object_get(m, "counted"))) {
            char a[24], b[24], c[24];
            fmt_bytes(num(m, "kv_used_bytes"), a, sizeof a);
            fmt_bytes(num(m, "kv_admitted_bytes"), b, sizeof b);
            fmt_bytes(num(m, "kv_cached_bytes"), c, sizeof c);
            snprintf(kv, sizeof kv, "%s/%s +%s", a, b, c);
        } else {
            snprintf(kv, sizeof kv, "-");
        }
        fprintf(out, "%-*s  %-*s  %-8s  %-*s  %-7s  %-40s  %-27s  %8lld  %8lld  %8lld\n", name_w,
                str(w, "name"), model_w, str(w, "model"), str(w, "state"), dev_w,
                str(w, "device"), seqs, bar, kv,
                series_sum(json_object_get(ws, "requests")),
                series_sum(json_object_get(ws, "tokens")), num(w, "restarts"));
    }
    json_t *drill = json_object_get(stats, "drill_report");
    if (json_is_object(drill)) {
        time_t t = (time_t)json_number_value(json_object_get(drill, "modified_time"));
        char when[64];
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
        fprintf(out, "\ndrill report: %s (%s)\n", str(drill, "path"), when);
    }
    size_t n = json_array_size(events);
    fprintf(out, "\nevents: %lld since the start", num(stats, "events_total"));
    if (n == 0) {
        fprintf(out, "\n");
        return;
    }
    fprintf(out, "; the latest:\n");
    for (size_t k = 0; k < n && k < STATUS_EVENTS_SHOWN; k++) {
        char line[512];
        print_event(json_array_get(events, n - 1 - k), line, sizeof line);
        fprintf(out, "  %s\n", line);
    }
}

/* One refresh; 0 when a worker is ready, 1 otherwise. */
static int status_once(const char *router, const char *key, bool as_json, bool clear)
{
    json_t *stats = NULL, *events = NULL;
    int st = status_get(router, key, "/v1/spillway/stats", &stats);
    if (st != 200 || !json_is_object(stats)) {
        const char *msg = json_string_value(
            json_object_get(json_object_get(stats, "error"), "message"));
        if (st < 0)
            fprintf(stderr, "spillway status: cannot reach the router at %s\n", router);
        else if (st == 401)
            fprintf(stderr, "spillway status: the router wants an API key (--key or "
                    "SPILLWAY_API_KEY): %s\n", msg ? msg : "unauthorized");
        else
            fprintf(stderr, "spillway status: %s/v1/spillway/stats answered %d%s%s\n", router, st,
                    msg ? ": " : "", msg ? msg : "");
        json_decref(stats);
        return 1;
    }
    if (status_get(router, key, "/v1/spillway/events", &events) != 200) {
        json_decref(events); /* the table goes without its failovers */
        events = NULL;
    }
    json_t *list = json_object_get(events, "data");
    int rc = strcmp(str(stats, "status"), "ready") ? 1 : 0;
    if (as_json) {
        json_t *all = json_is_array(list) ? json_incref(list) : json_array();
        json_t *failovers = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(all, i, e)
            if (!strcmp(event_type(e), "failover"))
                json_array_append(failovers, e);
        json_object_set_new(stats, "events", all);
        json_object_set_new(stats, "failovers", failovers);
        char *s = json_dumps(stats, JSON_COMPACT);
        if (s)
            printf("%s\n", s);
        sw_free(s);
    } else {
        if (clear)
            fputs("\033[H\033[2J", stdout);
        print_table(stdout, router, stats, list);
    }
    fflush(stdout);
    json_decref(events);
    json_decref(stats);
    return rc;
}

int cli_status_main(int argc, char **argv)
{
    char router[512] = "http://127.0.0.1:8080";
    const char *key = getenv("SPILLWAY_API_KEY");
    bool as_json = false, watch = false;
    double interval_s = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--router") && has_value) {
            snprintf(router, sizeof router, "%s", argv[++i]);
        } else if (!strcmp(a, "--key") && has_value) {
            key = argv[++i];
        } else if (!strcmp(a, "--json")) {
            as_json = true;
        } else if (!strcmp(a, "--watch")) {
            watch = true;
        } else if (!strcmp(a, "--interval") && has_value) {
            char *end = NULL;
            interval_s = strtod(argv[++i], &end);
            if (!end || *end || !(interval_s >= 0.1 && interval_s <= 3600)) {
                fprintf(stderr, "spillway status: --interval wants seconds from 0.1 to 3600\n");
                return 2;
            }
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "spillway status: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    /* http://HOST:PORT/ and http://HOST:PORT name the same router */
    size_t n = strlen(router);
    while (n > 0 && router[n - 1] == '/' && strncmp(router, "unix:", 5))
        router[--n] = 0;
    if (!watch)
        return status_once(router, key, as_json, false);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    bool clear = !as_json && isatty(STDOUT_FILENO);
    int rc = 0;
    while (!status_stop) {
        rc = status_once(router, key, as_json, clear);
        /* nanosleep returns early on the signal: Ctrl-C ends at once */
        struct timespec ts = {(time_t)interval_s,
                              (long)((interval_s - (double)(time_t)interval_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return rc;
}
