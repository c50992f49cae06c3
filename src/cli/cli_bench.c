/* cli_bench.c - `spillway bench engine`: prefill and decode speed of the
 * engine on one model, the way bench/engine.sh's reference figures were
 * taken (a prompt of P tokens prefilled in one batch, then G tokens decoded
 * one at a time), plus the decode read bandwidth it implies.
 * `spillway bench memory`: main-memory read bandwidth.
 * `spillway bench http`: request latency against a worker or the router
 * (N client threads, one connection per request), so the router's added
 * latency can be measured without external load generators.
 *
 * Figures, not a test: nothing here asserts on speed. The prompt is a fixed
 * pseudo-random token sequence, so runs are comparable. A warm-up pass
 * faults the mapped weights in first, and each figure is the best of --reps
 * repetitions.
 */
#include "cli/cli.h"

#include "api/http1.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "device/cpu/threadpool.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "quant/quant.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct bench_result {
    double prefill_tps;
    double decode_tps;
} bench_result;

static int32_t argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static int bench_once(eng_context *ctx, const int32_t *prompt, int32_t n_prompt, int32_t n_gen,
                      float *logits, bench_result *out, sw_error *err)
{
    int32_t n_vocab = eng_model_hparams(eng_context_model(ctx))->n_vocab;
    int rc;
    eng_seq_clear(ctx, 0);
    double t0 = eng_now_seconds();
    if ((rc = eng_decode(ctx, 0, prompt, n_prompt, logits, err)))
        return rc;
    double t1 = eng_now_seconds();
    for (int32_t i = 0; i < n_gen; i++) {
        int32_t next = argmax(logits, n_vocab);
        if ((rc = eng_decode(ctx, 0, &next, 1, logits, err)))
            return rc;
    }
    double t2 = eng_now_seconds();
    eng_seq_clear(ctx, 0);
    out->prefill_tps = n_prompt / (t1 - t0);
    out->decode_tps = n_gen / (t2 - t1);
    return SW_OK;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: spillway bench engine -m FILE [--prompt N] [--gen N] [--threads N]\n"
                 "                             [--reps N] [--json]\n"
                 "       spillway bench memory [--threads N] [--bytes SIZE]\n"
                 "       spillway bench http --target unix:PATH|HOST:PORT [--clients N]\n"
                 "                           [--requests M] [--body JSON] [--path P] [--json]\n"
                 "                           [--keepalive]\n"
                 "       spillway bench profiles [--model FILE] [--device SPEC] [--gpu-layers N]\n"
                 "                               [--out DIR] (see spillway bench profiles --help)\n"
                 "  prefill N prompt tokens in one batch (default 128), then decode --gen\n"
                 "  tokens one at a time (default 32); best of --reps runs (default 2).\n"
                 "  http: N client threads (default 1) send M requests in all (default 100),\n"
                 "  each a POST of --body to --path (default /v1/completions; --body ''\n"
                 "  sends a GET) on its own connection, read to the end; latency\n"
                 "  percentiles of the 2xx answers, the others counted as errors.\n"
                 "  --keepalive: each client keeps one HTTP/1.1 connection for its requests\n"
                 "  (reconnecting when the server closes it).\n");
}

static int bench_engine(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"gen", required_argument, 0, 'g'},   {"threads", required_argument, 0, 't'},
        {"reps", required_argument, 0, 'r'},  {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *path = NULL;
    int32_t n_prompt = 128, n_gen = 32, n_threads = 0, reps = 2;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:g:t:r:jh", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'p': n_prompt = atoi(optarg); break;
        case 'g': n_gen = atoi(optarg); break;
        case 't': n_threads = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'j': json = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!path || n_prompt < 1 || n_gen < 1 || reps < 1 || n_threads < 0 || n_prompt > 65536 ||
        n_gen > 65536) {
        usage(stderr);
        return 2;
    }

    eng_model *model = NULL;
    eng_context *ctx = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    sw_error err;
    int status = 1;
    if (eng_model_load(path, &model, &err))
        goto fail;
    const eng_hparams *hp = eng_model_hparams(model);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = n_prompt + n_gen;
    cp.n_batch = n_prompt;
    cp.n_threads = n_threads;
    if (eng_context_create(model, &cp, &ctx, &err))
        goto fail;
    prompt = sw_malloc(sizeof(int32_t) * (size_t)n_prompt);
    logits = sw_malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (!prompt || !logits) {
        sw_error_set(&err, SW_ENOMEM, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < n_prompt; i++)
        prompt[i] = 3 + (int32_t)(((uint64_t)i * 2654435761u) % (uint64_t)(hp->n_vocab - 3));

    bench_result best = {0, 0}, r;
    /* Warm-up: faults the mapped weights in and settles the threads. It
     * stays within the measured run's tokens, which is all the context
     * holds (--prompt 8 --gen 1 on a model of that context must run). */
    if (bench_once(ctx, prompt, n_prompt < 16 ? n_prompt : 16, n_gen < 4 ? n_gen : 4, logits, &r,
                   &err))
        goto fail;
    for (int32_t i = 0; i < reps; i++) {
        if (bench_once(ctx, prompt, n_prompt, n_gen, logits, &r, &err))
            goto fail;
        if (r.prefill_tps > best.prefill_tps)
            best.prefill_tps = r.prefill_tps;
        if (r.decode_tps > best.decode_tps)
            best.decode_tps = r.decode_tps;
    }
    double weights_gb = (double)eng_model_weights_bytes(model) / 1e9;
    double read_gb = (double)eng_model_decode_read_bytes(model) / 1e9; /* per token */
    int threads = eng_context_params_get(ctx)->n_threads;
    const char *type = "mixed";
    {
        const eng_gguf_tensor *t = eng_gguf_find_tensor(eng_model_gguf(model), "blk.0.ffn_up.weight");
        if (!t) /* a mixture of experts */
            t = eng_gguf_find_tensor(eng_model_gguf(model), "blk.0.ffn_up_exps.weight");
        const eng_type_traits *tr = t ? eng_type_traits_get(t->type) : NULL;
        if (tr)
            type = tr->name;
    }
    if (json) {
        json_t *rec = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:s}", "model",
                                path, "type", type, "threads", threads, "prompt_tokens", n_prompt,
                                "generated_tokens", n_gen, "layers", hp->n_layer,
                                "weights_gb", weights_gb, "prefill_tokens_per_second",
                                best.prefill_tps, "decode_tokens_per_second", best.decode_tps,
                                "decode_read_gb_per_second", read_gb * best.decode_tps, "isa",
                                cpu_isa_name(cpu_kernels_isa()));
        char *text = json_dumps(rec, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
        json_decref(rec);
    } else {
        printf("model %s (%s, %.2f GB of weights), %d threads, kernels %s\n", path, type,
               weights_gb, threads, cpu_isa_name(cpu_kernels_isa()));
        printf("  prefill %4d tokens: %8.1f tok/s\n", n_prompt, best.prefill_tps);
        printf("  decode  %4d tokens: %8.1f tok/s  (%.1f GB/s of weights read)\n", n_gen,
               best.decode_tps, read_gb * best.decode_tps);
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "spillway bench: %s\n", err.message);
done:
    sw_free(prompt);
    sw_free(logits);
    eng_context_free(ctx);
    eng_model_free(model);
    return status;
}

/* ---- memory bandwidth ----------------------------------------------------- */

typedef struct read_job {
    const float *data;
    float sums[64];
} read_job;

static void read_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    read_job *job = arg;
    float sum = 0.0f;
    /* cpu_dot_f32 of the buffer with itself streams it through the same
     * SIMD loads the kernels use; chunks keep the second operand in cache. */
    const int64_t chunk = 1 << 14;
    for (int64_t i = begin; i < end; i += chunk) {
        int64_t n = end - i < chunk ? end - i : chunk;
        sum += cpu_dot_f32(job->data + i, job->data + begin, n);
    }
    job->sums[thread_index & 63] += sum;
}

/* Read bandwidth of main memory with n threads: the physical limit that a
 * memory-bound decode runs against. */
static double measure_read_bandwidth(int n_threads, size_t bytes)
{
    int64_t n = (int64_t)(bytes / sizeof(float));
    float *data = sw_aligned_alloc(64, bytes);
    cpu_threadpool *pool = cpu_threadpool_create(n_threads);
    double best = 0.0;
    if (!data || !pool)
        goto done;
    for (int64_t i = 0; i < n; i++)
        data[i] = (float)(i & 7);
    read_job job = {.data = data};
    for (int rep = 0; rep < 5; rep++) {
        double t0 = eng_now_seconds();
        cpu_threadpool_run(pool, n, 1 << 14, read_task, &job);
        double gbps = (double)bytes / (eng_now_seconds() - t0) / 1e9;
        if (gbps > best)
            best = gbps;
    }
done:
    cpu_threadpool_free(pool);
    sw_free(data);
    return best;
}

static int bench_memory(int argc, char **argv)
{
    int threads = 0;
    unsigned long long bytes = 1ull << 30;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc &&
                 cli_parse_bytes(argv[i + 1], &bytes) == 0)
            i++;
        else {
            fprintf(stderr, "usage: spillway bench memory [--threads N] [--bytes SIZE]\n");
            return 2;
        }
    }
    if (threads <= 0)
        threads = cpu_core_count();
    double gbps = measure_read_bandwidth(threads, (size_t)bytes);
    if (gbps <= 0.0) {
        fprintf(stderr, "spillway bench memory: out of memory\n");
        return 1;
    }
    printf("memory read bandwidth: %.1f GB/s (%d threads, %llu MiB buffer)\n", gbps, threads,
           bytes >> 20);
    return 0;
}


/* ---- HTTP latency ----------------------------------------------------------- */

typedef struct http_bench {
    const char *target; /* unix:PATH or HOST:PORT */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char *request; /* the whole request, sent as is each time */
    size_t request_len;
    int32_t n_requests;
    atomic_int next;    /* next request index to take */
    atomic_int errors;  /* connection failures and non-2xx answers */
    double *latency_ms; /* per request; NAN for a failed one */
    bool keepalive;     /* --keepalive: one connection per client thread */
} http_bench;

/* Resolves the target once, so name lookups are not in the measured time. */
static int http_resolve(http_bench *b)
{
    memset(&b->addr, 0, sizeof b->addr);
    if (strncmp(b->target, "unix:", 5) == 0) {
        struct sockaddr_un *un = (struct sockaddr_un *)&b->addr;
        const char *path = b->target + 5;
        if (!*path || strlen(path) >= sizeof un->sun_path)
            return -1;
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, path, strlen(path) + 1);
        b->addr_len = (socklen_t)sizeof *un;
        return 0;
    }
    const char *colon = strrchr(b->target, ':');
    if (!colon || colon == b->target || !colon[1])
        return -1;
    char host[256];
    size_t hl = (size_t)(colon - b->target);
    if (hl >= sizeof host)
        return -1;
    memcpy(host, b->target, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') { /* [::1]:8080 */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &res) || !res)
        return -1;
    /* "localhost" may give ::1 first while the server listens on 127.0.0.1:
     * keep the first address that accepts a connection (else the first). */
    const struct addrinfo *pick = res;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        if (fd >= 0)
            close(fd);
        if (ok) {
            pick = ai;
            break;
        }
    }
    if (pick->ai_addrlen > sizeof b->addr) {
        freeaddrinfo(res);
        return -1;
    }
    memcpy(&b->addr, pick->ai_addr, pick->ai_addrlen);
    b->addr_len = pick->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* One request on a fresh connection, read to EOF. Returns the HTTP status,
 * or -1 when the connection failed or the answer was not HTTP. */
static int http_once(const http_bench *b)
{
    int fd = socket(b->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int status = -1;
    if (fd < 0)
        return -1;
    /* A hung server fails the request instead of hanging the benchmark. */
    struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (const struct sockaddr *)&b->addr, b->addr_len) < 0)
        goto done;
    for (size_t off = 0; off < b->request_len;) {
        ssize_t n = send(fd, b->request + off, b->request_len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            goto done;
        off += (size_t)n;
    }
    char buf[16384], head[16];
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto done;
        if (n == 0)
            break;
        for (ssize_t i = 0; i < n && got < sizeof head - 1; i++)
            head[got++] = buf[i];
    }
    head[got] = '\0';
    const char *eol = strstr(head, "\r\n");
    int code, minor;
    if (api_http_status_line(head, eol ? (size_t)(eol - head) : got, &code, &minor))
        status = code;
done:
    close(fd);
    return status;
}

/* Length of the whole response at the start of p (n bytes), 0 while
 * incomplete, (size_t)-1 when malformed; *status, and *close when the
 * server ends the connection after it (api/http1's framing). */
static size_t http_framed_length(const char *p, size_t n, bool *close_after, int *status)
{
    api_http_response r;
    int h = api_http_response_head(p, n, (size_t)64 << 10, &r);
    if (h <= 0)
        return h < 0 ? (size_t)-1 : 0;
    *close_after = r.close;
    *status = r.status;
    if (!r.chunked && !r.has_length)
        return r.head_len; /* the body runs to the close: not waited for */
    api_http_body body;
    api_http_body_init(&body, &r);
    size_t at = r.head_len;
    while (!body.done) {
        const char *d;
        size_t dn;
        long k = api_http_body_next(&body, p + at, n - at, &d, &dn);
        if (k < 0)
            return (size_t)-1;
        if (k == 0)
            return 0;
        at += (size_t)k;
    }
    return at;
}

/* --keepalive: one request on the thread's connection (opened when there
 * is none), read to the end of its framing; the connection is kept
 * unless the server closes it. Returns the HTTP status or -1. */
static int http_keepalive_once(const http_bench *b, int *fd, char **buf, size_t *cap)
{
    if (*fd < 0) {
        *fd = socket(b->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (*fd < 0)
            return -1;
        struct timeval tv = {.tv_sec = 120};
        setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(*fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(*fd, (const struct sockaddr *)&b->addr, b->addr_len) < 0)
            goto drop;
    }
    for (size_t off = 0; off < b->request_len;) {
        ssize_t n = send(*fd, b->request + off, b->request_len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            goto drop;
        off += (size_t)n;
    }
    size_t got = 0, len = 0;
    bool close_after = false;
    int code = -1;
    while (!(len = http_framed_length(*buf, got, &close_after, &code))) {
        if (*cap - got < 16385) {
            if (*cap > ((size_t)1 << 30))
                goto drop;
            size_t nc = *cap * 2 + 32768;
            char *nb = sw_realloc(*buf, nc);
            if (!nb)
                goto drop;
            *buf = nb;
            *cap = nc;
        }
        ssize_t n = recv(*fd, *buf + got, *cap - got - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            goto drop;
        got += (size_t)n;
        (*buf)[got] = '\0';
    }
    if (len == (size_t)-1)
        goto drop;
    if (close_after || got != len) { /* closed by the server, or extra bytes */
        close(*fd);
        *fd = -1;
    }
    return code;
drop:
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
    return -1;
}

static void *http_client(void *arg)
{
    http_bench *b = arg;
    int fd = -1;
    size_t cap = 32768;
    char *buf = b->keepalive ? sw_malloc(cap) : NULL;
    if (b->keepalive && !buf)
        return NULL;
    if (buf)
        buf[0] = '\0';
    for (;;) {
        int i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n_requests)
            break;
        double t0 = eng_now_seconds();
        int status = b->keepalive ? http_keepalive_once(b, &fd, &buf, &cap) : http_once(b);
        double ms = (eng_now_seconds() - t0) * 1000.0;
        if (status >= 200 && status < 300) {
            b->latency_ms[i] = ms;
        } else {
            b->latency_ms[i] = NAN;
            atomic_fetch_add(&b->errors, 1);
        }
    }
    if (fd >= 0)
        close(fd);
    sw_free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted values. */
static double percentile(const double *v, int32_t n, double p)
{
    if (n <= 0)
        return NAN;
    int32_t rank = (int32_t)ceil(p * n);
    return v[rank < 1 ? 0 : rank - 1];
}

static int bench_http(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"target", required_argument, 0, 'T'}, {"clients", required_argument, 0, 'c'},
        {"requests", required_argument, 0, 'n'}, {"body", required_argument, 0, 'b'},
        {"path", required_argument, 0, 'P'},   {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},         {"keepalive", no_argument, 0, 'k'},
        {0, 0, 0, 0},
    };
    http_bench b = {.n_requests = 100};
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":1}";
    const char *path = "/v1/completions";
    int clients = 1;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "T:c:n:b:P:jhk", longopts, NULL)) != -1) {
        switch (c) {
        case 'T': b.target = optarg; break;
        case 'c': clients = atoi(optarg); break;
        case 'n': b.n_requests = atoi(optarg); break;
        case 'b': body = optarg; break;
        case 'P': path = optarg; break;
        case 'j': json = true; break;
        case 'k': b.keepalive = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!b.target || clients < 1 || clients > 1024 || b.n_requests < 1 ||
        b.n_requests > 10000000 || path[0] != '/' || strpbrk(path, " \r\n")) {
        usage(stderr);
        return 2;
    }
    if (http_resolve(&b)) {
        fprintf(stderr, "spillway bench http: cannot resolve target '%s'\n", b.target);
        return 2;
    }
    if (clients > b.n_requests)
        clients = b.n_requests;

    int status = 1, started = 0;
    pthread_t *th = sw_calloc((size_t)clients, sizeof *th);
    double *ok = NULL;
    size_t body_len = strlen(body);
    size_t cap = body_len + strlen(path) + 256;
    b.request = sw_malloc(cap);
    b.latency_ms = sw_calloc((size_t)b.n_requests, sizeof(double));
    if (!th || !b.request || !b.latency_ms) {
        fprintf(stderr, "spillway bench http: out of memory\n");
        goto fail;
    }
    /* An empty body makes it a GET (/health, /v1/models). */
    const char *conn = b.keepalive ? "keep-alive" : "close";
    int hl = body_len ? snprintf(b.request, cap,
                                 "POST %s HTTP/1.1\r\nHost: localhost\r\nConnection: %s\r\n"
                                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                                 path, conn, body_len)
                      : snprintf(b.request, cap,
                                 "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: %s\r\n\r\n",
                                 path, conn);
    if (hl < 0 || (size_t)hl + body_len >= cap)
        goto fail;
    memcpy(b.request + hl, body, body_len);
    b.request_len = (size_t)hl + body_len;

    double t0 = eng_now_seconds();
    for (; started < clients; started++)
        if (pthread_create(&th[started], NULL, http_client, &b)) {
            fprintf(stderr, "spillway bench http: cannot start a client thread\n");
            break;
        }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    double wall = eng_now_seconds() - t0;
    if (started < clients)
        goto fail;

    ok = sw_malloc(sizeof(double) * (size_t)b.n_requests);
    if (!ok)
        goto fail;
    int32_t n_ok = 0;
    double sum = 0.0;
    for (int32_t i = 0; i < b.n_requests; i++)
        if (!isnan(b.latency_ms[i])) {
            ok[n_ok++] = b.latency_ms[i];
            sum += b.latency_ms[i];
        }
    qsort(ok, (size_t)n_ok, sizeof *ok, cmp_double);
    int errors = atomic_load(&b.errors);
    double p50 = percentile(ok, n_ok, 0.50), p99 = percentile(ok, n_ok, 0.99);
    double mean = n_ok ? sum / n_ok : NAN, rps = b.n_requests / wall;
    if (json) {
        /* NaN is not JSON: no successful request gives nulls. */
        json_t *rec = json_pack("{s:s, s:s, s:i, s:i, s:i, s:f}", "target", b.target, "path",
                                path, "clients", clients, "count", (int)n_ok, "errors", errors,
                                "requests_per_second", rps);
        json_object_set_new(rec, "p50_ms", n_ok ? json_real(p50) : json_null());
        json_object_set_new(rec, "p99_ms", n_ok ? json_real(p99) : json_null());
        json_object_set_new(rec, "mean_ms", n_ok ? json_real(mean) : json_null());
        char *text = json_dumps(rec, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
        json_decref(rec);
    } else if (n_ok) {
        printf("%s %s, %d clients: %d ok, %d errors, p50 %.3f ms, p99 %.3f ms, mean %.3f ms, "
               "%.1f requests/s\n",
               b.target, path, clients, (int)n_ok, errors, p50, p99, mean, rps);
    } else {
        printf("%s %s, %d clients: no successful request (%d errors)\n", b.target, path, clients,
               errors);
    }
    status = errors ? 1 : 0;
fail:
    sw_free(ok);
    sw_free(b.latency_ms);
    sw_free(b.request);
    sw_free(th);
    return status;
}

int cli_bench_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "engine") == 0)
        return bench_engine(argc - 1, argv + 1);
    if (strcmp(argv[1], "memory") == 0)
        return bench_memory(argc - 1, argv + 1);
    if (strcmp(argv[1], "http") == 0)
        return bench_http(argc - 1, argv + 1);
    fprintf(stderr, "spillway bench: unknown benchmark '%s' (known: engine, memory, http)\n",
            argv[1]);
    return 2;
}
