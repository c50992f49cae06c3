/* fuzz_config.c - libFuzzer harness for the router's INI configuration.
 *
 * The input is a configuration file: it is written to an anonymous memory
 * file (memfd_create, so nothing lands on a disk) and read with
 * rt_config_load through /proc/self/fd, exactly as `spillway serve
 * --config` reads one, then checked with rt_config_check. (The worker has
 * no configuration file of its own: `spillway worker` takes flags, which
 * the router builds from this file.)
 *
 * Invariants: a refusal is SW_EINVAL naming the file and a line >= 1 (or
 * SW_ENOMEM); an accepted configuration holds only values inside the
 * ranges router_config.c documents (docs/router.md), every string fits
 * and is terminated, worker and tool names are valid and unique; loading
 * the same text twice gives the same configuration; rt_config_check's
 * answer agrees with the rules it states.
 */
#include "router/router.h"

#include "fuzzlib.h"

#include <jansson.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_TERMINATED(field) FZ_CHECK(memchr((field), 0, sizeof(field)) != NULL)

static bool valid_name(const char *n)
{
    size_t len = strlen(n);
    return len >= 1 && len <= 63 &&
           strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == len;
}

static void check_worker(const rt_config *c, int i)
{
    const rt_worker_config *w = &c->workers[i];
    FZ_TERMINATED(w->name);
    FZ_TERMINATED(w->url);
    FZ_TERMINATED(w->device);
    FZ_TERMINATED(w->model);
    FZ_TERMINATED(w->policy);
    FZ_CHECK(valid_name(w->name));
    for (int k = 0; k < i; k++)
        FZ_CHECK(strcmp(c->workers[k].name, w->name) != 0);
    FZ_CHECK(!w->url[0] || strlen(w->url) >= 8);
    FZ_CHECK(w->gpu_layers >= -1 && w->gpu_layers <= 100000);
    FZ_CHECK(w->ctx_limit >= 0 && w->ctx_limit <= (1 << 24));
    FZ_CHECK(w->max_seqs >= 0 && w->max_seqs <= 64);
    FZ_CHECK(w->reserve == -1 || (w->reserve >= 0 && w->reserve <= 0.99));
    FZ_CHECK(!w->policy[0] || !strcmp(w->policy, "reserve") || !strcmp(w->policy, "grow"));
    FZ_CHECK(w->threads >= 0 && w->threads <= 1024);
    FZ_CHECK(w->preference >= -1000000 && w->preference <= 1000000);
    FZ_CHECK(w->n_env >= 0 && w->n_env <= RT_MAX_ENV);
    for (int k = 0; k < w->n_env; k++) {
        FZ_TERMINATED(w->env[k]);
        const char *eq = strchr(w->env[k], '=');
        FZ_CHECK(eq && eq != w->env[k]);
    }
    FZ_CHECK(w->kind == RT_KIND_SPILLWAY || w->kind == RT_KIND_OPENAI);
}

static void check_tool(const rt_config *c, int i)
{
    const rt_tool_config *t = &c->tools[i];
    FZ_TERMINATED(t->name);
    FZ_TERMINATED(t->description);
    FZ_TERMINATED(t->url);
    FZ_TERMINATED(t->parameters);
    FZ_CHECK(valid_name(t->name));
    for (int k = 0; k < i; k++)
        FZ_CHECK(strcmp(c->tools[k].name, t->name) != 0);
    FZ_CHECK(t->timeout_ms >= 10 && t->timeout_ms <= 3600000);
    if (t->parameters[0]) {
        /* what a tool's parameters must be: a schema object of type object */
        json_t *j = json_loads(t->parameters, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        FZ_CHECK(json_is_object(j) && type && !strcmp(type, "object"));
        json_decref(j);
    }
}

static void check_config(const rt_config *c)
{
    FZ_TERMINATED(c->listen);
    FZ_TERMINATED(c->state_dir);
    FZ_CHECK(c->n_models >= 0 && c->n_models <= RT_MAX_MODELS);
    for (int i = 0; i < c->n_models; i++) {
        const rt_model_config *m = &c->models[i];
        FZ_TERMINATED(m->name);
        FZ_TERMINATED(m->path);
        FZ_TERMINATED(m->chat_template);
        FZ_CHECK(m->n_aliases >= 0 && m->n_aliases <= RT_MAX_ALIASES);
        for (int a = 0; a < m->n_aliases; a++)
            FZ_TERMINATED(m->aliases[a]);
        FZ_CHECK(!c->legacy_model || (c->n_models == 1 && !m->name[0]));
    }
    FZ_CHECK(c->listen[0] && c->state_dir[0]);
    FZ_CHECK(c->n_keys >= 0 && c->n_keys <= RT_MAX_KEYS);
    for (int i = 0; i < c->n_keys; i++) {
        FZ_TERMINATED(c->api_keys[i]);
        size_t n = strlen(c->api_keys[i]);
        FZ_CHECK(n >= 8 && n <= 127 && !strpbrk(c->api_keys[i], ", \t"));
    }
    FZ_CHECK(c->max_body_bytes >= 1024 && c->max_body_bytes <= ((size_t)1 << 30));
    FZ_CHECK(c->max_attempts >= 1 && c->max_attempts <= 8);
    FZ_CHECK(c->max_connections >= 1 && c->max_connections <= 100000);
    FZ_CHECK(c->queue_size >= 0 && c->queue_size <= 100000);
    FZ_CHECK(c->queue_timeout_ms >= 0 && c->queue_timeout_ms <= 3600000);
    FZ_CHECK(c->http_timeout_s >= 1 && c->http_timeout_s <= 86400);
    FZ_CHECK(c->keepalive_timeout_s >= 0 && c->keepalive_timeout_s <= 3600);
    FZ_CHECK(c->keepalive_max_requests >= 1 && c->keepalive_max_requests <= 1000000);
    FZ_CHECK(c->ledger_retention_s >= 1);
    FZ_CHECK(c->health_interval_ms >= 50 && c->health_interval_ms <= 600000);
    FZ_CHECK(c->hang_timeout_ms >= 100 && c->hang_timeout_ms <= 3600000);
    FZ_CHECK(c->idempotency_ttl_s >= 1 && c->idempotency_ttl_s <= 366 * 86400);
    FZ_CHECK(c->max_tool_steps >= 1 && c->max_tool_steps <= 64);
    FZ_CHECK(c->job_workers >= 1 && c->job_workers <= 64);
    FZ_CHECK(c->ready_timeout_s >= 1 && c->ready_timeout_s <= 86400);
    FZ_CHECK(c->n_workers >= 0 && c->n_workers <= RT_MAX_WORKERS);
    FZ_CHECK(c->n_tools >= 0 && c->n_tools <= RT_MAX_TOOLS);
    for (int i = 0; i < c->n_workers; i++)
        check_worker(c, i);
    for (int i = 0; i < c->n_tools; i++)
        check_tool(c, i);
}

/* rt_config_check says yes exactly when its stated rules hold (the
 * loopback rule aside, which is its own small parser). */
static void check_check(const rt_config *c)
{
    sw_error err;
    int rc = rt_config_check(c, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc < 0 && err.code == rc && err.message[0]);
        return;
    }
    FZ_CHECK(c->n_models >= 1 && c->n_workers >= 1);
    int defaults = 0;
    for (int i = 0; i < c->n_models; i++) {
        FZ_CHECK(c->models[i].path[0]);
        defaults += c->models[i].is_default;
    }
    FZ_CHECK(defaults <= 1);
    for (int i = 0; i < c->n_workers; i++) {
        FZ_CHECK(rt_config_worker_model(c, &c->workers[i]) >= 0);
        FZ_CHECK(c->workers[i].managed || c->workers[i].url[0]);
        FZ_CHECK(c->workers[i].kind != RT_KIND_OPENAI || !c->workers[i].managed);
    }
    for (int i = 0; i < c->n_tools; i++)
        FZ_CHECK(c->tools[i].url[0] && c->tools[i].parameters[0]);
}

/* One anonymous file, rewritten for each input. */
static int fz_memfd(char *path, size_t cap)
{
    static int fd = -1;
    if (fd < 0)
        fd = memfd_create("spillway-fuzz-config", MFD_CLOEXEC);
    if (fd >= 0)
        snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static rt_config a, b; /* 200 KiB each: not on the stack */
    char path[64];
    sw_error err;
    int fd = fz_memfd(path, sizeof path);
    if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;

    rt_config_defaults(&a);
    int rc = rt_config_load(&a, path, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EINVAL || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0]);
        if (rc == SW_EINVAL) {
            /* "PATH:LINE: why" with a line of the file */
            size_t n = strlen(path);
            FZ_CHECK(!strncmp(err.message, path, n) && err.message[n] == ':');
            FZ_CHECK(atoi(err.message + n + 1) >= 1);
        }
        return 0;
    }
    check_config(&a);
    check_check(&a);

    rt_config_defaults(&b);
    FZ_CHECK(rt_config_load(&b, path, &err) == SW_OK);
    FZ_CHECK(memcmp(&a, &b, sizeof a) == 0); /* the same text, the same configuration */
    return 0;
}
