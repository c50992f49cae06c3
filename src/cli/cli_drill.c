/* cli_drill.c - `spillway drill`: the failover proof as a product feature
 * (DESIGN.md principle 5). It starts a router with one GPU worker and one
 * CPU worker (or attaches to a running router), runs the seed's
 * experiment as scenarios with pass/fail checks (drill_scenarios.c), and
 * writes report.md, report.json and timeline.svg (drill_report.c).
 *
 *   spillway drill [--config FILE | --router URL] [--out DIR] [--model PATH] [--quick]
 *
 * Exit status: 0 when every scenario that ran passed and no verdict
 * failed, 1 when one failed, 2 for bad options, 130 when interrupted.
 * docs/drill.md is the user's guide.
 */
#include "cli/cli.h"
#include "drill/drill_impl.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/device.h"
#include "modelgen/model_make.h"
#include "router/router.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway drill [--config FILE | --router URL] [--out DIR] [--model PATH]\n"
            "                      [--quick]\n"
            "  Runs the failover drill and writes DIR/report.md, report.json, timeline.svg.\n"
            "  default       a router with a sim-gpu worker and a CPU worker, started here\n"
            "  --config FILE take the GPU and CPU workers (device, gpu-layers, ctx-limit,\n"
            "                threads...) and the model from a router configuration\n"
            "                (e.g. a real cuda:0 worker); the drill still starts its own\n"
            "                router per scenario, with faults injected into that GPU worker\n"
            "  --router URL  attach to a running router (http://HOST:PORT); only the\n"
            "                scenarios that need no fault injection run\n"
            "  --out DIR     where the reports go (default drill-report)\n"
            "  --model PATH  the GGUF to serve (default: a small synthetic model made here)\n"
            "  --quick       fewer concurrent requests (CI)\n"
            "SPILLWAY_SABOTAGE in the environment is passed to the router (self-check).\n"
            "Exit status: 0 all passed, 1 a scenario or verdict failed, 2 bad options,\n"
            "130 interrupted.\n");
}

/* Worker keys worth carrying over from a user's configuration. */
static void worker_extra(const rt_worker_config *w, char *buf, size_t cap, bool gpu)
{
    size_t n = 0;
    buf[0] = '\0';
#define ADD(...)                                                                    \
    do {                                                                            \
        int k_ = snprintf(buf + n, cap - n, __VA_ARGS__);                           \
        if (k_ > 0 && (size_t)k_ < cap - n)                                         \
            n += (size_t)k_;                                                        \
    } while (0)
    if (gpu && w->gpu_layers >= 0)
        ADD("gpu-layers = %d\n", (int)w->gpu_layers);
    ADD("ctx-limit = %d\n", w->ctx_limit > 0 ? (int)w->ctx_limit : 1024);
    if (w->threads > 0)
        ADD("threads = %d\n", (int)w->threads);
    if (w->reserve >= 0)
        ADD("reserve = %g\n", w->reserve);
#undef ADD
}

/* The keys of a llama-server worker carried over into the drill's
 * configurations. */
static void ls_extra(const rt_worker_config *w, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "preference = %d\n", (int)w->preference);
    if (w->ctx_limit > 0 && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "ctx-limit = %d\n", (int)w->ctx_limit);
    if (w->max_seqs > 0 && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "max-seqs = %d\n", (int)w->max_seqs);
    if (w->mmproj[0] && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "mmproj = %s\n", w->mmproj);
}

/* A configuration whose workers are all kind = llama-server, two or more
 * of them run by the router (command =): the drill's llama-server pair
 * (drill_llamaserver.c), the first two in preference order (ties in file
 * order) as the GPU and the CPU tier. 1 when it is one, 0 when not, -1
 * when it is one the drill cannot use (said on stderr). */
static int setup_ls_pair(drill *d, const rt_config *cfg, const char *path)
{
    const rt_worker_config *tier[2] = {NULL, NULL};
    for (int i = 0; i < cfg->n_workers; i++) {
        const rt_worker_config *w = &cfg->workers[i];
        if (w->kind != RT_KIND_LLAMA_SERVER)
            return 0;
        if (!w->command[0])
            continue;
        if (!tier[0] || w->preference < tier[0]->preference) {
            tier[1] = tier[0];
            tier[0] = w;
        } else if (!tier[1] || w->preference < tier[1]->preference) {
            tier[1] = w;
        }
    }
    if (!tier[1]) {
        fprintf(stderr, "spillway drill: %s: a llama-server pair needs two kind = llama-server "
                        "workers the router runs (command = ...): the GPU tier first in "
                        "preference order, the CPU tier after it\n", path);
        return -1;
    }
    d->ls_pair = true;
    snprintf(d->ls_gpu_command, sizeof d->ls_gpu_command, "%s", tier[0]->command);
    snprintf(d->ls_cpu_command, sizeof d->ls_cpu_command, "%s", tier[1]->command);
    ls_extra(tier[0], d->ls_gpu_extra, sizeof d->ls_gpu_extra);
    ls_extra(tier[1], d->ls_cpu_extra, sizeof d->ls_cpu_extra);
    d->ls_gpu_port = dr__ls_pick_port();
    d->ls_cpu_port = dr__ls_pick_port();
    while (d->ls_cpu_port == d->ls_gpu_port && d->ls_cpu_port > 0)
        d->ls_cpu_port = dr__ls_pick_port();
    if (d->ls_gpu_port <= 0 || d->ls_cpu_port <= 0) {
        fprintf(stderr, "spillway drill: no free loopback port for the llama-servers\n");
        return -1;
    }
    snprintf(d->gpu_device, sizeof d->gpu_device, "llama-server %s", tier[0]->name);
    if (!d->model[0]) {
        int m = rt_config_worker_model(cfg, tier[0]);
        snprintf(d->model, sizeof d->model, "%s", cfg->models[m < 0 ? 0 : m].path);
    }
    return 1;
}

static int setup_from_config(drill *d, const char *path)
{
    static rt_config cfg;
    sw_error err;
    rt_config_defaults(&cfg);
    if (rt_config_load(&cfg, path, &err)) {
        fprintf(stderr, "spillway drill: %s\n", err.message);
        return -1;
    }
    int ls = setup_ls_pair(d, &cfg, path);
    if (ls != 0)
        return ls < 0 ? -1 : 0;
    const rt_worker_config *gpu = NULL, *cpu = NULL;
    for (int i = 0; i < cfg.n_workers; i++) {
        const rt_worker_config *w = &cfg.workers[i];
        bool is_cpu = !w->device[0] || !strcmp(w->device, "cpu");
        if (is_cpu && (!cpu || w->preference < cpu->preference))
            cpu = w;
        if (!is_cpu && (!gpu || w->preference < gpu->preference))
            gpu = w;
    }
    if (!gpu || !cpu || !gpu->managed || !cpu->managed) {
        fprintf(stderr, "spillway drill: %s needs a managed GPU worker (device sim-gpu:NAME or "
                        "cuda:N) and a managed CPU worker\n", path);
        return -1;
    }
    snprintf(d->gpu_device, sizeof d->gpu_device, "%s", gpu->device);
    d->gpu_simulated = !strncmp(gpu->device, "sim-gpu:", 8);
    if (d->gpu_simulated) {
        /* the drill's own pool name, so a demo running beside it is not touched */
        snprintf(d->pool, sizeof d->pool, "drill-%d", (int)getpid());
        snprintf(d->gpu_device, sizeof d->gpu_device, "sim-gpu:%.63s", d->pool);
        if (gpu->sim_capacity)
            snprintf(d->sim_capacity, sizeof d->sim_capacity, "%llu",
                     (unsigned long long)gpu->sim_capacity);
    }
    worker_extra(gpu, d->gpu_extra, sizeof d->gpu_extra, true);
    worker_extra(cpu, d->cpu_extra, sizeof d->cpu_extra, false);
    if (!d->model[0]) {
        /* the GPU worker's model */
        int m = rt_config_worker_model(&cfg, gpu);
        snprintf(d->model, sizeof d->model, "%s", cfg.models[m < 0 ? 0 : m].path);
    }
    return 0;
}

int cli_drill_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, 0, 'c'}, {"router", required_argument, 0, 'r'},
        {"out", required_argument, 0, 'o'},    {"model", required_argument, 0, 'm'},
        {"quick", no_argument, 0, 'q'},        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    static drill dd;
    drill *d = &dd;
    memset(d, 0, sizeof *d);
    d->out_dir = "drill-report";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:r:o:m:qh", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': d->config_path = optarg; break;
        case 'r': d->router_url = optarg; break;
        case 'o': d->out_dir = optarg; break;
        case 'm': snprintf(d->model, sizeof d->model, "%s", optarg); break;
        case 'q': d->quick = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc || (d->config_path && d->router_url) || !d->out_dir[0] ||
        strlen(d->out_dir) > 300) {
        usage(stderr);
        return 2;
    }
    if (mkdir(d->out_dir, 0755) && access(d->out_dir, W_OK)) {
        fprintf(stderr, "spillway drill: cannot write to %s\n", d->out_dir);
        return 2;
    }
    d->color = isatty(2);
    /* the drill's own device handle (the second model) would log at info
     * level in the middle of the progress lines */
    if (!getenv("SPILLWAY_LOG") && sw_log_get_level() < SW_LOG_WARN)
        sw_log_set_level(SW_LOG_WARN);
    d->attached = d->router_url != NULL;
    const char *sab = getenv("SPILLWAY_SABOTAGE");
    snprintf(d->sabotage, sizeof d->sabotage, "%s", sab ? sab : "");
    d->requests = sw_calloc(DR_MAX_REQUESTS, sizeof *d->requests);
    if (!d->requests) {
        fprintf(stderr, "spillway drill: out of memory\n");
        return 1;
    }
    pthread_mutex_init(&d->lock, NULL);
    dr_scenarios_init(d);
    dr_signals_install();
    int status = 1;

    if (d->attached) {
        const char *u = d->router_url;
        snprintf(d->router.address, sizeof d->router.address, "%s",
                 strncmp(u, "http://", 7) == 0 ? u + 7 : u);
        size_t l = strlen(d->router.address);
        if (l && d->router.address[l - 1] == '/')
            d->router.address[l - 1] = '\0';
        int st = 0;
        json_t *h = dh_get_json(d->router.address, "/health", 5000, &st);
        if (!h) {
            fprintf(stderr, "spillway drill: no router answers at %s (/health)\n", u);
            json_decref(h);
            status = 2;
            goto out;
        }
        json_decref(h);
        snprintf(d->gpu_device, sizeof d->gpu_device, "(attached)");
        dr_note_sabotage(d);
    } else if (d->config_path) {
        if (setup_from_config(d, d->config_path)) {
            status = 2;
            goto out;
        }
    } else {
        snprintf(d->pool, sizeof d->pool, "drill-%d", (int)getpid());
        snprintf(d->gpu_device, sizeof d->gpu_device, "sim-gpu:%.63s", d->pool);
        snprintf(d->gpu_extra, sizeof d->gpu_extra, "ctx-limit = 1024\nthreads = 1\n");
        snprintf(d->cpu_extra, sizeof d->cpu_extra, "ctx-limit = 1024\nthreads = 1\n");
        d->gpu_simulated = true;
    }
    if (d->gpu_simulated && !d->sim_capacity[0])
        snprintf(d->sim_capacity, sizeof d->sim_capacity, "64MiB");
    if (!d->attached && !d->model[0]) {
        /* a small synthetic model: quick to load, same code paths */
        eng_model_make_params p = eng_model_make_default_params();
        p.n_vocab = 1024;
        p.seed = 5;
        snprintf(d->model, sizeof d->model, "%s/drill-model.gguf", d->out_dir);
        sw_error err;
        if (eng_model_make(&p, d->model, &err)) {
            fprintf(stderr, "spillway drill: cannot make the model: %s\n", err.message);
            goto out;
        }
    }
    if (!d->attached && d->model[0] != '/') {
        /* the router runs with the same working directory, but be explicit */
        char cwd[400], abs[1100];
        if (getcwd(cwd, sizeof cwd)) {
            snprintf(abs, sizeof abs, "%.399s/%.599s", cwd, d->model);
            if (strlen(abs) < sizeof d->model)
                memcpy(d->model, abs, strlen(abs) + 1);
        }
    }
    if (d->sabotage[0])
        fprintf(stderr, "spillway drill: SPILLWAY_SABOTAGE=%s is passed to the router: "
                        "checks are expected to fail\n", d->sabotage);
    d->t_start = dh_now();
    dr_progress(d, "spillway drill: %s, GPU worker %s, model %s",
                d->attached ? d->router_url : "managed router", d->gpu_device,
                d->attached ? "(the router's)" : d->model);
    dr_run_all(d);
    d->t_end = dh_now();
    dr_cleanup(d);
    if (dr_write_reports(d))
        fprintf(stderr, "spillway drill: cannot write the reports in %s\n", d->out_dir);
    else
        fprintf(stderr, "spillway drill: reports in %s/report.md, report.json, timeline.svg\n",
                d->out_dir);
    for (int v = 0; v < DR_V_COUNT; v++)
        fprintf(stderr, "  verdict %-40s %s\n", dr_verdict_name((dr_verdict_id)v),
                dr_verdict_status(d, (dr_verdict_id)v));
    status = dr_interrupted ? 130 : dr_all_passed(d) ? 0 : 1;
out:
    dr_cleanup(d);
    pthread_mutex_destroy(&d->lock);
    sw_free(d->requests);
    return status;
}
