/* cli_bench_profiles.c - `spillway bench profiles`: the seed's placement
 * comparison. The same prompt set runs on three workers started here, one
 * after the other: full GPU (every layer on the device), split (the first
 * N layers on the device, the rest on the CPU) and CPU only. For each:
 * time to first token at the client, prefill and decode tokens/s (the
 * worker's own measurement, from /health, and decode as the client sees
 * it), device memory (/health: what this worker holds on the device) and
 * host memory (/proc/PID/status: VmRSS and VmHWM).
 *
 *   spillway bench profiles [--model PATH] [--gpu-layers N] [--out DIR]
 *                           [--device D] [--sim-capacity B] [--gen N] [--threads T]
 *
 * Writes a table on stdout, DIR/profiles.json and DIR/profiles.svg (a bar
 * chart, written by hand). The device defaults to a sim-gpu pool of its
 * own; `--device cuda:0` runs the same on a real GPU (passed to the
 * workers as is). Figures, not a test: nothing here judges speed.
 *
 * `--llama-server PATH` runs the three profiles on llama.cpp's
 * llama-server instead (-ngl 99, -ngl N, -ngl 0, for a model spillway's
 * engine may not run): TTFT and the client's decode rate as above, the
 * prefill and decode rates from its own "timings", host memory from
 * /proc; device memory is not reported by llama-server (shown as n/a).
 */
#include "cli/cli.h"
#include "drill/drill_impl.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/device.h"
#include "engine/model.h"
#include "modelgen/model_make.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_PROMPTS 3

/* Short, medium and long: TTFT grows with the prompt, decode does not. */
static const char *const g_prompts[N_PROMPTS] = {
    "Once upon a time",
    "Once upon a time there was a little dog who lived in a small house near the river. "
    "Every morning the dog ran to the water and looked for fish.",
    "Once upon a time there was a little dog who lived in a small house near the river. "
    "Every morning the dog ran to the water and looked for fish. One day a big storm came "
    "and the river grew and grew until it reached the garden of the house. The dog barked "
    "and the family woke up, and together they carried the chairs and the books up the "
    "stairs, while the rain kept falling on the roof all through the long night.",
};

typedef struct profile {
    const char *name;       /* full-gpu, split, cpu */
    int gpu_layers;         /* -1 all, N, or 0 for cpu (no device) */
    bool on_device;
    /* results */
    bool ok;
    char error[800];
    double ttft_ms[N_PROMPTS];
    int prompt_tokens[N_PROMPTS];
    double client_decode_tps[N_PROMPTS];
    double ttft_ms_median;
    double prefill_tps, decode_tps;  /* the worker's measurement */
    double client_decode_tps_median;
    long long device_bytes;          /* /health memory.self_bytes */
    long long kv_bytes_per_token;
    long long host_rss_bytes, host_hwm_bytes;
    int device_layers;               /* /health device.gpu_layers */
} profile;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway bench profiles [--model PATH] [--gpu-layers N] [--out DIR]\n"
            "                               [--device D] [--sim-capacity B] [--gen N]\n"
            "                               [--threads T] [--llama-server PATH]\n"
            "  The same %d prompts on full-GPU, split (N layers on the device; default half)\n"
            "  and CPU-only workers: time to first token, prefill and decode tokens/s,\n"
            "  device and host memory. Writes a table, DIR/profiles.json and\n"
            "  DIR/profiles.svg (default DIR: bench-profiles). --device: sim-gpu:NAME\n"
            "  (default: a pool of its own, --sim-capacity 2GiB) or cuda:N. --gen: tokens\n"
            "  per prompt (default 32). --model: default a small synthetic model.\n"
            "  --llama-server PATH: the same on llama.cpp's llama-server (-ngl 99, -ngl N,\n"
            "  -ngl 0) for a model of any architecture it runs; its device memory is not\n"
            "  reported (n/a).\n",
            N_PROMPTS);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[N_PROMPTS];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > 0)
            s[k++] = v[i];
    if (!k)
        return 0;
    qsort(s, (size_t)k, sizeof *s, cmp_double);
    return k % 2 ? s[k / 2] : (s[k / 2 - 1] + s[k / 2]) / 2;
}

static long long proc_status_kib(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (!f)
        return -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = atoll(line + kl + 1);
            break;
        }
    fclose(f);
    return v;
}

static pid_t start_worker(const char *model, const char *sock, const char *log, const char *device,
                          const char *sim_capacity, int gpu_layers, int threads)
{
    char exe[1024];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0)
        return -1;
    exe[el] = '\0';
    char listen[620], layers[16], th[16];
    snprintf(listen, sizeof listen, "unix:%s", sock);
    snprintf(layers, sizeof layers, "%d", gpu_layers);
    snprintf(th, sizeof th, "%d", threads);
    const char *argv[24];
    int n = 0;
    argv[n++] = "spillway";
    argv[n++] = "worker";
    argv[n++] = "--model";
    argv[n++] = model;
    argv[n++] = "--listen";
    argv[n++] = listen;
    argv[n++] = "--max-seqs";
    argv[n++] = "1";
    argv[n++] = "--ctx-limit";
    argv[n++] = "1024";
    if (threads > 0) {
        argv[n++] = "--threads";
        argv[n++] = th;
    }
    if (device) {
        argv[n++] = "--device";
        argv[n++] = device;
        argv[n++] = "--gpu-layers";
        argv[n++] = layers;
        if (sim_capacity) {
            argv[n++] = "--sim-capacity";
            argv[n++] = sim_capacity;
        }
    }
    argv[n] = NULL;
    pid_t me = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != me)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* llama-server (--llama-server) on 127.0.0.1:port with gpu_layers on the
 * device (-ngl; -1 all). */
static pid_t start_llama_server(const char *server, const char *model, int port, const char *log,
                                int gpu_layers, int threads)
{
    char ports[16], ngl[16], th[16];
    snprintf(ports, sizeof ports, "%d", port);
    snprintf(ngl, sizeof ngl, "%d", gpu_layers < 0 ? 999 : gpu_layers);
    snprintf(th, sizeof th, "%d", threads > 0 ? threads : 1);
    const char *argv[] = {server, "-m", model, "--host", "127.0.0.1", "--port", ports, "-ngl", ngl,
                          "-c", "1024", "-np", "1", "--threads", th, "--metrics", "--no-webui",
                          NULL};
    pid_t me = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != me)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(server, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void stop_worker(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    double t0 = dh_now();
    int st;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (dh_now() - t0 > 15) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return;
        }
        dh_sleep_ms(20);
    }
}

typedef struct stream_times {
    double t_first, t_last;
    int tokens;
} stream_times;

static bool on_stream(void *user, const char *body, size_t len)
{
    (void)len;
    stream_times *t = user;
    int n = 0;
    /* a spillway worker's chunks carry "token_ids", llama-server's native
     * events "tokens" (return_tokens) */
    for (const char *p = body; (p = strstr(p, "\"token_ids\":[")); p += 13)
        if (p[13] != ']')
            n++;
    for (const char *p = body; (p = strstr(p, "\"tokens\":[")); p += 10)
        if (p[10] != ']')
            n++;
    if (n > t->tokens) {
        double now = dh_now();
        if (!t->tokens)
            t->t_first = now;
        t->t_last = now;
        t->tokens = n;
    }
    return false;
}

/* The rates llama-server measured for its last request: the final
 * event's "timings" (prompt_per_second, predicted_per_second). */
static void ls_timings(const char *body, profile *p)
{
    const char *t = body ? strstr(body, "\"timings\":") : NULL;
    const char *pp = t ? strstr(t, "\"prompt_per_second\":") : NULL;
    const char *dp = t ? strstr(t, "\"predicted_per_second\":") : NULL;
    if (pp)
        p->prefill_tps = strtod(pp + 20, NULL);
    if (dp)
        p->decode_tps = strtod(dp + 23, NULL);
}

static void run_profile(profile *p, const char *model, const char *out_dir, const char *device,
                        const char *sim_capacity, int gen, int threads, const char *server)
{
    char sock[600], log[600], address[620];
    snprintf(sock, sizeof sock, "%s/%s.sock", out_dir, p->name);
    snprintf(log, sizeof log, "%s/%s.log", out_dir, p->name);
    snprintf(address, sizeof address, "unix:%s", sock);
    unlink(sock);
    fprintf(stderr, "bench profiles: %s: starting the %s\n", p->name,
            server ? "llama-server" : "worker");
    pid_t pid;
    if (server) {
        int port = dr__ls_pick_port();
        snprintf(address, sizeof address, "127.0.0.1:%d", port);
        pid = port > 0 ? start_llama_server(server, model, port, log,
                                            p->on_device ? p->gpu_layers : 0, threads)
                       : -1;
    } else {
        pid = start_worker(model, sock, log, p->on_device ? device : NULL, sim_capacity,
                           p->gpu_layers, threads);
    }
    if (pid <= 0) {
        snprintf(p->error, sizeof p->error, "cannot start the worker");
        return;
    }
    double t0 = dh_now();
    json_t *h = NULL;
    for (;;) {
        int st = 0;
        h = dh_get_json(address, "/health", 2000, &st);
        if (st == 200)
            break;
        json_decref(h);
        h = NULL;
        int ws;
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            snprintf(p->error, sizeof p->error, "the worker exited (status %d; log %s)",
                     WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws), log);
            return;
        }
        if (dh_now() - t0 > 120 || dr_interrupted) {
            snprintf(p->error, sizeof p->error, "the worker was not ready in 120 s (log %s)", log);
            stop_worker(pid);
            return;
        }
        dh_sleep_ms(50);
    }
    json_decref(h);
    /* warm-up: faults the weights in */
    dh_response w;
    dh_exchange(address, "POST", server ? "/completion" : "/v1/completions", NULL,
                server ? "{\"prompt\":\"Hello\",\"n_predict\":2,\"temperature\":0}"
                       : "{\"prompt\":\"Hello\",\"max_tokens\":2,\"temperature\":0}",
                120000, NULL, NULL, &w);
    dh_response_free(&w);
    bool all_ok = true;
    for (int i = 0; i < N_PROMPTS && !dr_interrupted; i++) {
        /* llama-server: its native /completion, whose events carry the
         * ids (return_tokens) and whose last one its timings */
        json_t *req = server ? json_pack("{s:s, s:i, s:i, s:b, s:b, s:b, s:b}", "prompt",
                                         g_prompts[i], "n_predict", gen, "temperature", 0,
                                         "ignore_eos", 1, "stream", 1, "return_tokens", 1,
                                         "cache_prompt", 0)
                             : json_pack("{s:s, s:i, s:i, s:b, s:b, s:{s:b}}", "prompt",
                                         g_prompts[i], "max_tokens", gen, "temperature", 0,
                                         "ignore_eos", 1, "stream", 1, "stream_options",
                                         "include_usage", 1);
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        stream_times st = {0};
        double ts = dh_now();
        dh_exchange(address, "POST", server ? "/completion" : "/v1/completions", NULL, body,
                    300000, on_stream, &st, &w);
        double t_end = dh_now();
        sw_free(body);
        const char *usage = w.body ? strstr(w.body, "\"prompt_tokens\":") : NULL;
        p->prompt_tokens[i] = usage ? atoi(usage + 16) : 0;
        if (server) {
            const char *ev = w.body ? strstr(w.body, "\"tokens_evaluated\":") : NULL;
            p->prompt_tokens[i] = ev ? atoi(ev + 19) : 0;
            ls_timings(w.body, p);
        }
        if (w.status != 200 || st.tokens < gen) {
            all_ok = false;
            snprintf(p->error, sizeof p->error, "prompt %d: status %d, %d tokens", i + 1, w.status,
                     st.tokens);
        } else {
            p->ttft_ms[i] = (st.t_first - ts) * 1000.0;
            if (st.tokens > 1 && st.t_last > st.t_first)
                p->client_decode_tps[i] = (st.tokens - 1) / (st.t_last - st.t_first);
            else if (t_end > ts)
                /* the whole stream came in one read (a tiny model, a busy
                 * machine): the end-to-end rate is all the client saw */
                p->client_decode_tps[i] = st.tokens / (t_end - ts);
        }
        dh_response_free(&w);
    }
    h = server ? NULL : dh_get_json(address, "/health", 5000, NULL);
    if (server) {
        p->device_bytes = -1; /* llama-server does not report it */
        p->device_layers = p->on_device ? p->gpu_layers : 0;
        goto host;
    }
    p->prefill_tps = json_number_value(json_object_get(h, "prefill_tokens_per_second"));
    p->decode_tps = json_number_value(json_object_get(h, "decode_tokens_per_second"));
    p->device_bytes = json_integer_value(json_object_get(json_object_get(h, "memory"), "self_bytes"));
    p->kv_bytes_per_token = json_integer_value(json_object_get(h, "kv_bytes_per_token"));
    json_t *dl = json_object_get(json_object_get(h, "device"), "gpu_layers");
    p->device_layers = json_is_integer(dl) ? (int)json_integer_value(dl) : 0;
    json_decref(h);
host:;
    long long rss = proc_status_kib(pid, "VmRSS"), hwm = proc_status_kib(pid, "VmHWM");
    p->host_rss_bytes = rss > 0 ? rss * 1024 : 0;
    p->host_hwm_bytes = hwm > 0 ? hwm * 1024 : 0;
    p->ttft_ms_median = median(p->ttft_ms, N_PROMPTS);
    p->client_decode_tps_median = median(p->client_decode_tps, N_PROMPTS);
    p->ok = all_ok && !dr_interrupted;
    stop_worker(pid);
    unlink(sock);
}

/* ---- the chart ---------------------------------------------------------------- */

static const char *const g_colors[3] = {"#2b7bd6", "#6a5acd", "#e08a1e"};

static void svg_panel(FILE *f, double x, double y, double w, double h, const char *title,
                      const char *key, const char *unit, const profile *ps, int n,
                      const double *values)
{
    double max = 0;
    for (int i = 0; i < n; i++)
        if (values[i] > max)
            max = values[i];
    if (max <= 0)
        max = 1;
    fprintf(f, "<g class=\"panel\" data-metric=\"%s\">\n", key);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-weight=\"bold\">%s</text>\n", x, y + 14, title);
    double bw = (w - 20) / n - 16, base = y + h - 24;
    for (int i = 0; i < n; i++) {
        double bh = values[i] / max * (h - 70);
        double bx = x + 10 + i * (bw + 16);
        fprintf(f, "<rect class=\"bar\" data-profile=\"%s\" data-metric=\"%s\" data-value=\"%.6g\" "
                   "x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
                ps[i].name, key, values[i], bx, base - bh, bw, bh, g_colors[i % 3]);
        fprintf(f, values[i] >= 1000 ? "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                                       "font-size=\"10\">%.0f %s</text>\n"
                                     : "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                                       "font-size=\"10\">%.3g %s</text>\n",
                bx + bw / 2, base - bh - 4, values[i], unit);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%s</text>\n",
                bx + bw / 2, base + 14, ps[i].name);
    }
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#999\"/>\n</g>\n",
            x + 4, base, x + w - 4, base);
}

static int write_svg(const char *path, const profile *ps, int n, const char *device,
                     const char *model)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    const double pw = 260, ph = 230, width = 4 * pw + 20, height = ph + 80;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
               "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            width, height, width, height);
    fprintf(f, "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">spillway bench "
               "profiles: %s</text>\n<text x=\"10\" y=\"40\" fill=\"#555\">",
            device);
    for (const char *s = model; *s; s++)
        fputs(*s == '<' ? "&lt;" : *s == '&' ? "&amp;" : (char[2]){*s, 0}, f);
    fprintf(f, "</text>\n");
    double v[3][4];
    for (int i = 0; i < n && i < 3; i++) {
        v[i][0] = ps[i].ttft_ms_median;
        v[i][1] = ps[i].prefill_tps;
        v[i][2] = ps[i].decode_tps;
        v[i][3] = (double)((ps[i].device_bytes > 0 ? ps[i].device_bytes : 0) +
                           ps[i].host_rss_bytes) / 1048576.0;
    }
    static const char *const titles[4] = {"time to first token (median)", "prefill tokens/s",
                                          "decode tokens/s", "memory: device + host RSS"};
    static const char *const keys[4] = {"ttft_ms", "prefill_tokens_per_second",
                                        "decode_tokens_per_second", "memory_mib"};
    static const char *const units[4] = {"ms", "", "", "MiB"};
    for (int k = 0; k < 4; k++) {
        double col[3] = {0, 0, 0};
        for (int i = 0; i < n && i < 3; i++)
            col[i] = v[i][k];
        svg_panel(f, 10 + k * pw, 56, pw - 10, ph, titles[k], keys[k], units[k], ps, n, col);
    }
    fprintf(f, "</svg>\n");
    int rc = ferror(f) ? -1 : 0;
    if (fclose(f))
        rc = -1;
    return rc;
}

int cli_bench_profiles_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},   {"gpu-layers", required_argument, 0, 'g'},
        {"out", required_argument, 0, 'o'},     {"device", required_argument, 0, 'd'},
        {"sim-capacity", required_argument, 0, 'c'}, {"gen", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
        {"llama-server", required_argument, 0, 'L'}, {0, 0, 0, 0},
    };
    char model[600] = "", device[128] = "", pool[64] = "";
    const char *server = NULL;
    const char *out_dir = "bench-profiles", *sim_capacity = "2GiB";
    int gpu_layers = -2, gen = 32, threads = 1, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:g:o:d:c:n:t:L:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': snprintf(model, sizeof model, "%s", optarg); break;
        case 'g': gpu_layers = atoi(optarg); break;
        case 'o': out_dir = optarg; break;
        case 'd': snprintf(device, sizeof device, "%s", optarg); break;
        case 'c': sim_capacity = optarg; break;
        case 'n': gen = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'L': server = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc || gen < 2 || gen > 4096 || threads < 0 || gpu_layers < -2 ||
        strlen(out_dir) > 300) {
        usage(stderr);
        return 2;
    }
    if (server && access(server, X_OK)) {
        fprintf(stderr, "spillway bench profiles: --llama-server %s: not an executable\n", server);
        return 2;
    }
    if (mkdir(out_dir, 0755) && access(out_dir, W_OK)) {
        fprintf(stderr, "spillway bench profiles: cannot write to %s\n", out_dir);
        return 2;
    }
    dr_signals_install();
    if (!getenv("SPILLWAY_LOG") && sw_log_get_level() < SW_LOG_WARN)
        sw_log_set_level(SW_LOG_WARN); /* the pool's info lines between the progress lines */
    if (!model[0]) {
        eng_model_make_params mp = eng_model_make_default_params();
        mp.n_vocab = 1024;
        mp.seed = 5;
        snprintf(model, sizeof model, "%s/bench-model.gguf", out_dir);
        sw_error err;
        if (eng_model_make(&mp, model, &err)) {
            fprintf(stderr, "spillway bench profiles: %s\n", err.message);
            return 1;
        }
    }
    int n_layer = 0;
    if (server) {
        /* the file's layers from its metadata: the engine need not run it */
        eng_gguf *g = NULL;
        const char *arch = NULL;
        size_t arch_len = 0;
        char key[96];
        uint32_t blocks = 0;
        sw_error err;
        if (eng_gguf_open(model, &g, &err) ||
            eng_gguf_get_str(g, "general.architecture", &arch, &arch_len, &err) ||
            (snprintf(key, sizeof key, "%.*s.block_count", (int)(arch_len < 64 ? arch_len : 64),
                      arch),
             eng_gguf_get_u32(g, key, &blocks, &err))) {
            fprintf(stderr, "spillway bench profiles: %s\n", err.message);
            eng_gguf_close(g);
            return 1;
        }
        n_layer = (int)blocks;
        eng_gguf_close(g);
    } else {
        eng_model *m = NULL;
        sw_error err;
        eng_model_load_params lp = eng_model_load_default_params();
        lp.copy_weights = false; /* the layer count is all it needs */
        if (eng_model_load_with(model, &lp, &m, &err)) {
            fprintf(stderr, "spillway bench profiles: %s\n", err.message);
            return 1;
        }
        n_layer = eng_model_hparams(m)->n_layer;
        eng_model_free(m);
    }
    if (gpu_layers == -2)
        gpu_layers = n_layer / 2;
    if (gpu_layers > n_layer) {
        fprintf(stderr, "spillway bench profiles: --gpu-layers %d: the model has %d layers\n",
                gpu_layers, n_layer);
        return 2;
    }
    bool sim = !device[0] && !server;
    if (server)
        snprintf(device, sizeof device, "llama-server");
    if (sim) {
        snprintf(pool, sizeof pool, "bench-%d", (int)getpid());
        snprintf(device, sizeof device, "sim-gpu:%s", pool);
    }
    profile ps[3] = {
        {.name = "full-gpu", .gpu_layers = -1, .on_device = true},
        {.name = "split", .gpu_layers = gpu_layers, .on_device = true},
        {.name = "cpu", .gpu_layers = 0, .on_device = false},
    };
    for (int i = 0; i < 3 && !dr_interrupted; i++) {
        run_profile(&ps[i], model, out_dir, device, sim ? sim_capacity : NULL, gen, threads,
                    server);
        if (sim) {
            sw_error err;
            dev_sim_unlink(pool, &err);
        }
    }
    printf("spillway bench profiles: %s, model %s, %d prompts x %d tokens\n", device, model,
           N_PROMPTS, gen);
    printf("%-9s %6s %10s %12s %12s %12s %12s %12s\n", "profile", "layers", "TTFT ms",
           "prefill t/s", "decode t/s", "client t/s", "device MiB", "host RSS MiB");
    for (int i = 0; i < 3; i++) {
        const profile *p = &ps[i];
        if (!p->ok) {
            printf("%-9s failed: %s\n", p->name, p->error[0] ? p->error : "interrupted");
            continue;
        }
        char layers[16];
        snprintf(layers, sizeof layers, "%d/%d", p->on_device ? (p->gpu_layers < 0 ? n_layer : p->gpu_layers) : 0,
                 n_layer);
        char dev[32];
        if (p->device_bytes < 0)
            snprintf(dev, sizeof dev, "n/a");
        else
            snprintf(dev, sizeof dev, "%.2f", (double)p->device_bytes / 1048576.0);
        printf("%-9s %6s %10.1f %12.1f %12.1f %12.1f %12s %12.1f\n", p->name, layers,
               p->ttft_ms_median, p->prefill_tps, p->decode_tps, p->client_decode_tps_median,
               dev, (double)p->host_rss_bytes / 1048576.0);
    }
    json_t *root = json_object();
    json_object_set_new(root, "device", json_string(device));
    json_object_set_new(root, "simulated", json_boolean(sim || !strncmp(device, "sim-gpu:", 8)));
    json_object_set_new(root, "model", json_string(model));
    json_object_set_new(root, "layers", json_integer(n_layer));
    json_object_set_new(root, "generated_tokens_per_prompt", json_integer(gen));
    json_t *prompts = json_array();
    for (int i = 0; i < N_PROMPTS; i++)
        json_array_append_new(prompts, json_string(g_prompts[i]));
    json_object_set_new(root, "prompts", prompts);
    json_t *arr = json_array();
    bool all_ok = true;
    for (int i = 0; i < 3; i++) {
        const profile *p = &ps[i];
        all_ok = all_ok && p->ok;
        json_t *o = json_object();
        json_object_set_new(o, "profile", json_string(p->name));
        json_object_set_new(o, "ok", json_boolean(p->ok));
        json_object_set_new(o, "error", p->ok ? json_null() : json_string(p->error));
        json_object_set_new(o, "device_layers",
                            json_integer(p->on_device ? (p->gpu_layers < 0 ? n_layer : p->gpu_layers) : 0));
        json_object_set_new(o, "ttft_ms", json_real(p->ttft_ms_median));
        json_t *per = json_array();
        for (int k = 0; k < N_PROMPTS; k++)
            json_array_append_new(per, json_pack("{s:i, s:f, s:f}", "prompt_tokens",
                                                 p->prompt_tokens[k], "ttft_ms", p->ttft_ms[k],
                                                 "client_decode_tokens_per_second",
                                                 p->client_decode_tps[k]));
        json_object_set_new(o, "per_prompt", per);
        json_object_set_new(o, "prefill_tokens_per_second", json_real(p->prefill_tps));
        json_object_set_new(o, "decode_tokens_per_second", json_real(p->decode_tps));
        json_object_set_new(o, "client_decode_tokens_per_second",
                            json_real(p->client_decode_tps_median));
        json_object_set_new(o, "device_memory_bytes",
                            p->device_bytes < 0 ? json_null() : json_integer(p->device_bytes));
        json_object_set_new(o, "kv_bytes_per_token", json_integer(p->kv_bytes_per_token));
        json_object_set_new(o, "host_rss_bytes", json_integer(p->host_rss_bytes));
        json_object_set_new(o, "host_peak_rss_bytes", json_integer(p->host_hwm_bytes));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "profiles", arr);
    char path[700];
    snprintf(path, sizeof path, "%s/profiles.json", out_dir);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    snprintf(path, sizeof path, "%s/profiles.svg", out_dir);
    rc |= write_svg(path, ps, 3, device, model);
    if (rc)
        fprintf(stderr, "spillway bench profiles: cannot write the results in %s\n", out_dir);
    else
        fprintf(stderr, "bench profiles: %s/profiles.json, %s/profiles.svg\n", out_dir, out_dir);
    if (dr_interrupted)
        return 130;
    return rc || !all_ok ? 1 : 0;
}
