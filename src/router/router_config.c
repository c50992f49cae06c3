/* router_config.c - the INI configuration of `spillway serve` (inih).
 *
 * Every key is checked when it is read, so a typo or a bad value stops the
 * start with a message naming the section, the key and the line (inih
 * reports the line of the first failing handler call).
 */
#include "router/router.h"

#include "api/api.h"

#include <ini.h>
#include <jansson.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct cfg_parse {
    rt_config *c;
    char msg[SW_ERROR_MESSAGE_MAX - 48];
    char cur_section[128];
    rt_worker_config *cur;
    rt_tool_config *cur_tool;
    rt_model_config *cur_model;
} cfg_parse;

void rt_config_defaults(rt_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen, sizeof c->listen, "127.0.0.1:8080");
    snprintf(c->state_dir, sizeof c->state_dir, "spillway-state");
    c->max_body_bytes = (size_t)1 << 20;
    c->max_image_bytes = (size_t)20 << 20;
    snprintf(c->cors_origins, sizeof c->cors_origins, "*");
    c->max_attempts = 3;
    c->max_connections = 256;
    c->queue_size = 64;
    c->queue_timeout_ms = 10000;
    c->http_timeout_s = 30;
    c->keepalive_timeout_s = 5;
    c->keepalive_max_requests = 100;
    c->ledger_retention_s = 7 * 86400;
    c->ledger_lease_s = 10;
    c->health_interval_ms = 1000;
    c->hang_timeout_ms = 15000;
    c->ready_timeout_s = 120;
    c->idempotency_ttl_s = 86400;
    c->max_tool_steps = 4;
    c->job_workers = 2;
    c->drain_timeout_s = 300;
    c->stop_delay_ms = 0;
}

static int cfg_fail(cfg_parse *p, const char *section, const char *name, const char *why,
                    const char *value)
{
    if (!p->msg[0])
        snprintf(p->msg, sizeof p->msg, "[%s] %s = '%.64s': %s", section, name, value, why);
    return 0;
}

static bool cfg_int(const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

/* Sizes: a number with an optional KiB/MiB/GiB (or KB/MB/GB) suffix. */
static bool cfg_bytes(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || errno || *v == '-')
        return false;
    uint64_t mul = 1;
    if (!*end)
        mul = 1;
    else if (!strcasecmp(end, "KiB")) mul = 1ull << 10;
    else if (!strcasecmp(end, "MiB")) mul = 1ull << 20;
    else if (!strcasecmp(end, "GiB")) mul = 1ull << 30;
    else if (!strcasecmp(end, "KB")) mul = 1000ull;
    else if (!strcasecmp(end, "MB")) mul = 1000000ull;
    else if (!strcasecmp(end, "GB")) mul = 1000000000ull;
    else
        return false;
    if (x > UINT64_MAX / mul)
        return false;
    *out = (uint64_t)x * mul;
    return true;
}

static bool cfg_copy(char *dst, size_t cap, const char *v)
{
    size_t n = strlen(v);
    if (n >= cap)
        return false;
    memcpy(dst, v, n + 1);
    return true;
}

/* aliases and default belong to named models only */
static bool c_legacy(const cfg_parse *p)
{
    return p->c->legacy_model;
}

static bool cfg_model_id(const char *v)
{
    size_t n = strlen(v);
    return n > 0 && n < 64 &&
           strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/-") == n;
}

static bool cfg_bool(const char *v, bool *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1"))
        *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0"))
        *out = false;
    else
        return false;
    return true;
}

bool rt_config_ledger_valid(const char *v, char *why, size_t cap)
{
    const char *rest = !strncmp(v, "postgresql://", 13) ? v + 13
                       : !strncmp(v, "postgres://", 11) ? v + 11
                                                        : NULL;
    if (!rest) {
        snprintf(why, cap, "expected postgresql://USER@HOST:PORT/DB (absent or empty: SQLite in "
                 "state-dir)");
        return false;
    }
    /* the user part is what comes before the authority's last '@' */
    size_t auth = strcspn(rest, "/?#");
    const char *at = NULL;
    for (const char *p = rest; p < rest + auth; p++)
        if (*p == '@')
            at = p;
    bool password = at && memchr(rest, ':', (size_t)(at - rest)) != NULL;
    const char *query = strchr(rest, '?');
    for (const char *p = query; p && !password; p = strchr(p + 1, '&'))
        password = !strncmp(p + 1, "password=", 9);
    if (password) {
        snprintf(why, cap, "the URL carries a password: give it in the PGPASSWORD environment "
                 "variable or in ~/.pgpass (PGPASSFILE) instead, never in the configuration");
        return false;
    }
    return true;
}

static int cfg_server(cfg_parse *p, const char *s, const char *name, const char *v)
{
    rt_config *c = p->c;
    long long x;
    uint64_t b;
    if (!strcmp(name, "listen")) {
        if (!v[0] || !cfg_copy(c->listen, sizeof c->listen, v) || !strrchr(v, ':') ||
            (!strncmp(v, "unix:", 5) && strlen(v) < 6))
            return cfg_fail(p, s, name, "expected HOST:PORT or unix:PATH", v);
    } else if (!strcmp(name, "api-keys") || !strcmp(name, "api-key")) {
        /* comma- or space-separated */
        char buf[1024];
        if (!cfg_copy(buf, sizeof buf, v))
            return cfg_fail(p, s, name, "too long", v);
        for (char *save = NULL, *t = strtok_r(buf, ", \t", &save); t;
             t = strtok_r(NULL, ", \t", &save)) {
            if (c->n_keys >= RT_MAX_KEYS)
                return cfg_fail(p, s, name, "too many keys (at most 8)", v);
            if (strlen(t) < 8 || !cfg_copy(c->api_keys[c->n_keys], sizeof c->api_keys[0], t))
                return cfg_fail(p, s, name, "a key has 8 to 127 characters", v);
            c->n_keys++;
        }
    } else if (!strcmp(name, "cors-origins")) {
        if (!cfg_copy(c->cors_origins, sizeof c->cors_origins, v) || !api_cors_list_valid(v))
            return cfg_fail(p, s, name, "expected *, nothing, or origins such as https://app.example",
                            v);
    } else if (!strcmp(name, "state-dir")) {
        if (!v[0] || !cfg_copy(c->state_dir, sizeof c->state_dir, v))
            return cfg_fail(p, s, name, "expected a directory path", v);
    } else if (!strcmp(name, "max-body")) {
        if (!cfg_bytes(v, &b) || b < 1024 || b > ((uint64_t)1 << 30))
            return cfg_fail(p, s, name, "expected a size between 1KiB and 1GiB", v);
        c->max_body_bytes = (size_t)b;
    } else if (!strcmp(name, "max-image-bytes")) {
        if (!cfg_bytes(v, &b) || b < 64 || b > ((uint64_t)1 << 30))
            return cfg_fail(p, s, name, "expected a size between 64B and 1GiB", v);
        c->max_image_bytes = (size_t)b;
    } else if (!strcmp(name, "max-attempts")) {
        if (!cfg_int(v, 1, 8, &x))
            return cfg_fail(p, s, name, "expected an integer 1..8", v);
        c->max_attempts = (int)x;
    } else if (!strcmp(name, "max-connections")) {
        if (!cfg_int(v, 1, 100000, &x))
            return cfg_fail(p, s, name, "expected an integer 1..100000", v);
        c->max_connections = (int)x;
    } else if (!strcmp(name, "queue-size")) {
        if (!cfg_int(v, 0, 100000, &x))
            return cfg_fail(p, s, name, "expected an integer 0..100000", v);
        c->queue_size = (int)x;
    } else if (!strcmp(name, "queue-timeout-ms")) {
        if (!cfg_int(v, 0, 3600000, &x))
            return cfg_fail(p, s, name, "expected milliseconds 0..3600000", v);
        c->queue_timeout_ms = (int)x;
    } else if (!strcmp(name, "http-timeout")) {
        if (!cfg_int(v, 1, 86400, &x))
            return cfg_fail(p, s, name, "expected seconds 1..86400", v);
        c->http_timeout_s = (int)x;
    } else if (!strcmp(name, "keepalive-timeout-s")) {
        if (!cfg_int(v, 0, 3600, &x))
            return cfg_fail(p, s, name, "expected seconds 0..3600", v);
        c->keepalive_timeout_s = (int)x;
    } else if (!strcmp(name, "keepalive-max-requests")) {
        if (!cfg_int(v, 1, 1000000, &x))
            return cfg_fail(p, s, name, "expected an integer 1..1000000", v);
        c->keepalive_max_requests = (int)x;
    } else if (!strcmp(name, "ledger-retention-s")) {
        if (!cfg_int(v, 1, 10LL * 366 * 86400, &x))
            return cfg_fail(p, s, name, "expected seconds 1..316224000", v);
        c->ledger_retention_s = (int)x;
    } else if (!strcmp(name, "ledger")) {
        char why[200];
        if (v[0] && !rt_config_ledger_valid(v, why, sizeof why))
            /* a value with a password is not echoed */
            return cfg_fail(p, s, name, why, strstr(why, "password") ? "..." : v);
        if (!cfg_copy(c->ledger, sizeof c->ledger, v))
            return cfg_fail(p, s, name, "too long (at most 511 bytes)", v);
    } else if (!strcmp(name, "ledger-lease-s")) {
        if (!cfg_int(v, 1, 3600, &x))
            return cfg_fail(p, s, name, "expected seconds 1..3600", v);
        c->ledger_lease_s = (int)x;
    } else if (!strcmp(name, "health-interval-ms")) {
        if (!cfg_int(v, 50, 600000, &x))
            return cfg_fail(p, s, name, "expected milliseconds 50..600000", v);
        c->health_interval_ms = (int)x;
    } else if (!strcmp(name, "hang-timeout-ms")) {
        if (!cfg_int(v, 100, 3600000, &x))
            return cfg_fail(p, s, name, "expected milliseconds 100..3600000", v);
        c->hang_timeout_ms = (int)x;
    } else if (!strcmp(name, "idempotency-ttl-s")) {
        if (!cfg_int(v, 1, 366LL * 86400, &x))
            return cfg_fail(p, s, name, "expected seconds 1..31622400", v);
        c->idempotency_ttl_s = (int)x;
    } else if (!strcmp(name, "max-tool-steps")) {
        if (!cfg_int(v, 1, 64, &x))
            return cfg_fail(p, s, name, "expected an integer 1..64", v);
        c->max_tool_steps = (int)x;
    } else if (!strcmp(name, "job-workers")) {
        if (!cfg_int(v, 1, 64, &x))
            return cfg_fail(p, s, name, "expected an integer 1..64", v);
        c->job_workers = (int)x;
    } else if (!strcmp(name, "ready-timeout")) {
        if (!cfg_int(v, 1, 86400, &x))
            return cfg_fail(p, s, name, "expected seconds 1..86400", v);
        c->ready_timeout_s = (int)x;
    } else if (!strcmp(name, "drain-timeout-s")) {
        if (!cfg_int(v, 1, 86400, &x))
            return cfg_fail(p, s, name, "expected seconds 1..86400", v);
        c->drain_timeout_s = (int)x;
    } else if (!strcmp(name, "stop-delay-ms")) {
        if (!cfg_int(v, 0, 600000, &x))
            return cfg_fail(p, s, name, "expected milliseconds 0..600000", v);
        c->stop_delay_ms = (int)x;
    } else {
        return cfg_fail(p, s, name, "unknown key", v);
    }
    return 1;
}

static int cfg_worker(cfg_parse *p, const char *s, const char *name, const char *v)
{
    rt_worker_config *w = p->cur;
    long long x;
    if (!strcmp(name, "managed")) {
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1"))
            w->managed = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0"))
            w->managed = false;
        else
            return cfg_fail(p, s, name, "expected true or false", v);
    } else if (!strcmp(name, "model")) {
        if (!cfg_model_id(v) || !cfg_copy(w->model, sizeof w->model, v))
            return cfg_fail(p, s, name, "expected the NAME of a [model NAME] section", v);
    } else if (!strcmp(name, "calibrate")) {
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1"))
            w->skip_calibration = false;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0"))
            w->skip_calibration = true;
        else
            return cfg_fail(p, s, name, "expected true or false", v);
    } else if (!strcmp(name, "prefix-cache")) {
        bool on;
        if (!cfg_bool(v, &on))
            return cfg_fail(p, s, name, "expected true or false", v);
        w->no_prefix_cache = !on;
    } else if (!strcmp(name, "kind")) {
        if (!strcmp(v, "spillway"))
            w->kind = RT_KIND_SPILLWAY;
        else if (!strcmp(v, "openai"))
            w->kind = RT_KIND_OPENAI;
        else if (!strcmp(v, "llama-server"))
            w->kind = RT_KIND_LLAMA_SERVER;
        else
            return cfg_fail(p, s, name, "expected spillway, openai or llama-server", v);
    } else if (!strcmp(name, "url")) {
        if ((strncmp(v, "unix:", 5) && strncmp(v, "http://", 7) && strncmp(v, "https://", 8)) ||
            !cfg_copy(w->url, sizeof w->url, v) || strlen(v) < 9)
            return cfg_fail(p, s, name,
                            "expected unix:PATH, http://HOST:PORT or https://HOST[:PORT]", v);
        w->managed = w->command[0] != 0; /* a url alone: a worker already running */
    } else if (!strcmp(name, "ca-file")) {
        if (!v[0] || !cfg_copy(w->ca_file, sizeof w->ca_file, v))
            return cfg_fail(p, s, name, "expected the path of a PEM file of CA certificates", v);
    } else if (!strcmp(name, "api-key-env")) {
        size_t n = strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_");
        if (!v[0] || v[n] || (v[0] >= '0' && v[0] <= '9') ||
            !cfg_copy(w->api_key_env, sizeof w->api_key_env, v))
            return cfg_fail(p, s, name, "expected the NAME of an environment variable", v);
    } else if (!strcmp(name, "command")) {
        if (!v[0] || !cfg_copy(w->command, sizeof w->command, v))
            return cfg_fail(p, s, name, "expected a command line (at most 1023 bytes)", v);
        w->managed = true;
    } else if (!strcmp(name, "mmproj")) {
        if (!v[0] || !cfg_copy(w->mmproj, sizeof w->mmproj, v))
            return cfg_fail(p, s, name, "expected the path of a projector GGUF", v);
    } else if (!strcmp(name, "device")) {
        if (!strcmp(v, "cpu"))
            w->device[0] = 0;
        else if ((strncmp(v, "sim-gpu:", 8) && strncmp(v, "cuda:", 5)) ||
                 !cfg_copy(w->device, sizeof w->device, v))
            return cfg_fail(p, s, name, "expected cpu, sim-gpu:NAME or cuda:N", v);
    } else if (!strcmp(name, "sim-capacity")) {
        if (!cfg_bytes(v, &w->sim_capacity) || w->sim_capacity == 0)
            return cfg_fail(p, s, name, "expected a size such as 512MiB", v);
    } else if (!strcmp(name, "gpu-layers")) {
        if (!cfg_int(v, -1, 100000, &x))
            return cfg_fail(p, s, name, "expected -1 (all) or a layer count", v);
        w->gpu_layers = (int32_t)x;
    } else if (!strcmp(name, "ctx-limit")) {
        if (!cfg_int(v, 1, 1 << 24, &x))
            return cfg_fail(p, s, name, "expected a token count", v);
        w->ctx_limit = (int32_t)x;
    } else if (!strcmp(name, "max-seqs")) {
        if (!cfg_int(v, 1, 64, &x))
            return cfg_fail(p, s, name, "expected an integer 1..64", v);
        w->max_seqs = (int32_t)x;
    } else if (!strcmp(name, "reserve")) {
        char *end;
        double d = strtod(v, &end);
        if (end == v || *end || !(d >= 0 && d <= 0.99))
            return cfg_fail(p, s, name, "expected a share 0..0.99", v);
        w->reserve = d;
    } else if (!strcmp(name, "kv-type")) {
        if (strcmp(v, "f16") && strcmp(v, "q8_0") && strcmp(v, "q4_0") && strcmp(v, "f32"))
            return cfg_fail(p, s, name, "expected f16, q8_0, q4_0 or f32", v);
        snprintf(w->kv_type, sizeof w->kv_type, "%s", v);
    } else if (!strcmp(name, "policy")) {
        if (strcmp(v, "reserve") && strcmp(v, "grow"))
            return cfg_fail(p, s, name, "expected reserve or grow", v);
        snprintf(w->policy, sizeof w->policy, "%s", v);
    } else if (!strcmp(name, "on-demand")) {
        if (!cfg_bool(v, &w->on_demand))
            return cfg_fail(p, s, name, "expected true or false", v);
    } else if (!strcmp(name, "idle-timeout-s")) {
        if (!cfg_int(v, 1, 30 * 86400, &x))
            return cfg_fail(p, s, name, "expected seconds 1..2592000", v);
        w->idle_timeout_s = (int32_t)x;
    } else if (!strcmp(name, "threads")) {
        if (!cfg_int(v, 0, 1024, &x))
            return cfg_fail(p, s, name, "expected an integer 0..1024", v);
        w->threads = (int32_t)x;
    } else if (!strcmp(name, "preference")) {
        if (!cfg_int(v, -1000000, 1000000, &x))
            return cfg_fail(p, s, name, "expected an integer (lower is tried first)", v);
        w->preference = (int32_t)x;
    } else if (!strcmp(name, "env") || !strcmp(name, "fault")) {
        char buf[256];
        if (w->n_env >= RT_MAX_ENV)
            return cfg_fail(p, s, name, "too many env entries (at most 8)", v);
        if (!strcmp(name, "fault"))
            snprintf(buf, sizeof buf, "SPILLWAY_FAULT=%s", v);
        else
            snprintf(buf, sizeof buf, "%s", v);
        const char *eq = strchr(buf, '=');
        if (!eq || eq == buf || strlen(v) > 200)
            return cfg_fail(p, s, name, "expected NAME=VALUE", v);
        snprintf(w->env[w->n_env++], sizeof w->env[0], "%s", buf);
    } else {
        return cfg_fail(p, s, name, "unknown key", v);
    }
    return 1;
}

/* A tool's URL must stay on this machine: the router sends it model
 * output, and a tool is trusted code run by the operator. */
static bool tool_url_ok(const char *v)
{
    if (!strncmp(v, "unix:", 5))
        return strlen(v) > 5;
    if (strncmp(v, "http://", 7))
        return false;
    const char *h = v + 7;
    size_t hl;
    if (!strncmp(h, "127.0.0.1:", 10))
        hl = 9;
    else if (!strncmp(h, "localhost:", 10))
        hl = 9;
    else if (!strncmp(h, "[::1]:", 6))
        hl = 5;
    else
        return false;
    const char *port = h + hl + 1;
    size_t np = strspn(port, "0123456789");
    if (np == 0 || np > 5 || atoi(port) < 1 || atoi(port) > 65535)
        return false;
    return port[np] == 0 || port[np] == '/';
}

static int cfg_tool(cfg_parse *p, const char *s, const char *name, const char *v)
{
    rt_tool_config *t = p->cur_tool;
    long long x;
    if (!strcmp(name, "description")) {
        if (!cfg_copy(t->description, sizeof t->description, v))
            return cfg_fail(p, s, name, "too long (at most 511 bytes)", v);
    } else if (!strcmp(name, "url")) {
        if (!tool_url_ok(v) || !cfg_copy(t->url, sizeof t->url, v))
            return cfg_fail(p, s, name,
                            "expected http://127.0.0.1:PORT/PATH, http://[::1]:PORT/PATH, "
                            "http://localhost:PORT/PATH or unix:PATH (loopback only)",
                            v);
    } else if (!strcmp(name, "parameters")) {
        json_error_t je;
        json_t *j = json_loads(v, JSON_REJECT_DUPLICATES, &je);
        const char *type = json_string_value(json_object_get(j, "type"));
        json_t *props = json_object_get(j, "properties");
        bool ok = json_is_object(j) && type && !strcmp(type, "object") &&
                  (!props || json_is_object(props)) &&
                  (!json_object_get(j, "required") || json_is_array(json_object_get(j, "required")));
        json_decref(j);
        if (!ok)
            return cfg_fail(p, s, name,
                            "expected a JSON schema object with \"type\":\"object\" (on one line)", v);
        if (!cfg_copy(t->parameters, sizeof t->parameters, v))
            return cfg_fail(p, s, name, "too long (at most 8191 bytes)", v);
    } else if (!strcmp(name, "idempotent")) {
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1"))
            t->idempotent = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0"))
            t->idempotent = false;
        else
            return cfg_fail(p, s, name, "expected true or false", v);
    } else if (!strcmp(name, "timeout-ms")) {
        if (!cfg_int(v, 10, 3600000, &x))
            return cfg_fail(p, s, name, "expected milliseconds 10..3600000", v);
        t->timeout_ms = (int)x;
    } else {
        return cfg_fail(p, s, name, "unknown key", v);
    }
    return 1;
}

/* A model id or alias: what clients send as "model" (Ollama's
 * "name:tag" and Hugging Face's "org/name" included). */
/* A comma- or space-separated list of model ids into out (at most max,
 * none equal to self when self is not NULL); false when one is bad or
 * there are too many. */
static bool cfg_id_list(const char *v, char (*out)[64], int max, int *n, const char *self)
{
    char buf[1024];
    if (!cfg_copy(buf, sizeof buf, v))
        return false;
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save)) {
        if (*n >= max || !cfg_model_id(t) || (self && !strcmp(t, self)))
            return false;
        snprintf(out[(*n)++], 64, "%s", t);
    }
    return true;
}

static int cfg_model(cfg_parse *p, const char *s, const char *name, const char *v)
{
    rt_model_config *m = p->cur_model;
    if (!strcmp(name, "path")) {
        if (!v[0] || !cfg_copy(m->path, sizeof m->path, v))
            return cfg_fail(p, s, name, "expected a file path", v);
    } else if (!strcmp(name, "chat-template")) {
        if (!cfg_copy(m->chat_template, sizeof m->chat_template, v))
            return cfg_fail(p, s, name, "too long", v);
    } else if (!strcmp(name, "reasoning-format")) {
        if (strcmp(v, "auto") && strcmp(v, "deepseek") && strcmp(v, "none"))
            return cfg_fail(p, s, name, "expected auto, deepseek or none", v);
        snprintf(m->reasoning_format, sizeof m->reasoning_format, "%s", v);
    } else if (!strcmp(name, "pooling")) {
        if (strcmp(v, "mean") && strcmp(v, "cls") && strcmp(v, "last"))
            return cfg_fail(p, s, name, "expected mean, cls or last", v);
        snprintf(m->pooling, sizeof m->pooling, "%s", v);
    } else if (!strcmp(name, "aliases") && !c_legacy(p)) {
        if (!cfg_id_list(v, m->aliases, RT_MAX_ALIASES, &m->n_aliases, NULL))
            return cfg_fail(p, s, name, "at most 8 aliases, each 1..63 of [A-Za-z0-9._:/-]", v);
    } else if (!strcmp(name, "fallback") && !c_legacy(p)) {
        if (!cfg_id_list(v, m->fallback, RT_MAX_MODELS - 1, &m->n_fallback, m->name))
            return cfg_fail(p, s, name, "expected the NAMEs of other [model NAME] sections", v);
    } else if (!strcmp(name, "default") && !c_legacy(p)) {
        if (!cfg_bool(v, &m->is_default))
            return cfg_fail(p, s, name, "expected true or false", v);
    } else if (!strcmp(name, "remote")) {
        if (strcmp(v, "never") && strcmp(v, "allowed"))
            return cfg_fail(p, s, name, "expected never or allowed", v);
        m->remote_never = !strcmp(v, "never");
    } else if (!strcmp(name, "image-tokens")) {
        long long x;
        if (!cfg_int(v, 0, 1 << 20, &x))
            return cfg_fail(p, s, name, "expected KV tokens per image (0: not known)", v);
        m->image_tokens = (int32_t)x;
    } else {
        return cfg_fail(p, s, name, "unknown key", v);
    }
    return 1;
}

static int cfg_handler(void *user, const char *section, const char *name, const char *value)
{
    cfg_parse *p = user;
    rt_config *c = p->c;
    if (!strcmp(section, "server"))
        return cfg_server(p, section, name, value);
    if (!strcmp(section, "model") || !strncmp(section, "model ", 6)) {
        if (strcmp(section, p->cur_section)) {
            const char *mname = section + 5;
            while (*mname == ' ')
                mname++;
            bool legacy = !*mname;
            if (c->n_models > 0 && (legacy || c->legacy_model))
                return cfg_fail(p, section, name,
                                legacy ? "a [model] section without a name goes alone (use "
                                         "[model NAME] sections for several)"
                                       : "[model NAME] sections cannot follow a [model] "
                                         "section without a name",
                                value);
            size_t n = strlen(mname);
            if (!legacy && (n >= sizeof c->models[0].name || !cfg_model_id(mname)))
                return cfg_fail(p, section, name, "model names are 1..63 of [A-Za-z0-9._:/-]",
                                value);
            for (int i = 0; i < c->n_models; i++)
                if (!strcmp(c->models[i].name, mname))
                    return cfg_fail(p, section, name, "model section given twice", value);
            if (c->n_models >= RT_MAX_MODELS)
                return cfg_fail(p, section, name, "too many models (at most 8)", value);
            rt_model_config *m = &c->models[c->n_models];
            memset(m, 0, sizeof *m);
            snprintf(m->name, sizeof m->name, "%s", mname);
            m->position = c->n_models++;
            c->legacy_model = legacy;
            p->cur_model = m;
            p->cur = NULL;
            p->cur_tool = NULL;
            snprintf(p->cur_section, sizeof p->cur_section, "%s", section);
        }
        return cfg_model(p, section, name, value);
    }
    if (!strncmp(section, "worker ", 7)) {
        const char *wname = section + 7;
        while (*wname == ' ')
            wname++;
        if (strcmp(section, p->cur_section)) {
            /* a new [worker NAME] section */
            size_t n = strlen(wname);
            if (n == 0 || n >= sizeof c->workers[0].name ||
                strspn(wname, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != n)
                return cfg_fail(p, section, name, "worker names are 1..63 of [A-Za-z0-9_-]", value);
            for (int i = 0; i < c->n_workers; i++)
                if (!strcmp(c->workers[i].name, wname))
                    return cfg_fail(p, section, name, "worker section given twice", value);
            if (c->n_workers >= RT_MAX_WORKERS)
                return cfg_fail(p, section, name, "too many workers (at most 16)", value);
            rt_worker_config *w = &c->workers[c->n_workers];
            memset(w, 0, sizeof *w);
            snprintf(w->name, sizeof w->name, "%s", wname);
            w->managed = true;
            w->gpu_layers = -1;
            w->reserve = -1;
            w->preference = c->n_workers;
            w->position = c->n_workers;
            w->idle_timeout_s = 300;
            c->n_workers++;
            p->cur = w;
            p->cur_model = NULL;
            snprintf(p->cur_section, sizeof p->cur_section, "%s", section);
        }
        return cfg_worker(p, section, name, value);
    }
    if (!strncmp(section, "tool ", 5)) {
        const char *tname = section + 5;
        while (*tname == ' ')
            tname++;
        if (strcmp(section, p->cur_section)) {
            size_t n = strlen(tname);
            if (n == 0 || n >= sizeof c->tools[0].name ||
                strspn(tname, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != n)
                return cfg_fail(p, section, name, "tool names are 1..63 of [A-Za-z0-9_-]", value);
            for (int i = 0; i < c->n_tools; i++)
                if (!strcmp(c->tools[i].name, tname))
                    return cfg_fail(p, section, name, "tool section given twice", value);
            if (c->n_tools >= RT_MAX_TOOLS)
                return cfg_fail(p, section, name, "too many tools (at most 16)", value);
            rt_tool_config *t = &c->tools[c->n_tools++];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", tname);
            t->timeout_ms = 5000;
            p->cur_tool = t;
            p->cur = NULL;
            p->cur_model = NULL;
            snprintf(p->cur_section, sizeof p->cur_section, "%s", section);
        }
        return cfg_tool(p, section, name, value);
    }
    return cfg_fail(p, section, name, "unknown section", value);
}

int rt_config_load(rt_config *c, const char *path, sw_error *err)
{
    cfg_parse p;
    memset(&p, 0, sizeof p);
    p.c = c;
    int line = ini_parse(path, cfg_handler, &p);
    if (line == -1)
        return sw_error_set(err, SW_EIO, "cannot open configuration %s", path);
    if (line == -2)
        return sw_error_set(err, SW_ENOMEM, "out of memory reading %s", path);
    if (line > 0)
        return sw_error_set(err, SW_EINVAL, "%s:%d: %s", path, line,
                            p.msg[0] ? p.msg : "syntax error (expected [section] or key = value)");
    return SW_OK;
}

static bool cfg_loopback(const char *listen)
{
    const char *colon = strrchr(listen, ':');
    size_t n = colon ? (size_t)(colon - listen) : strlen(listen);
    if (!strncmp(listen, "unix:", 5))
        return true; /* a local socket is not reachable from outside */
    return (n == 9 && !strncmp(listen, "127.0.0.1", 9)) || (n == 9 && !strncmp(listen, "localhost", 9)) ||
           (n == 5 && !strncmp(listen, "[::1]", 5)) || (n >= 4 && !strncmp(listen, "127.", 4));
}

bool rt_config_worker_remote(const rt_worker_config *w)
{
    if (w->managed || !RT_KIND_EXTERNAL(w->kind))
        return false;
    if (!strncmp(w->url, "https://", 8))
        return true;
    if (strncmp(w->url, "http://", 7))
        return false; /* unix: */
    char hostport[512];
    snprintf(hostport, sizeof hostport, "%.*s", (int)strcspn(w->url + 7, "/"), w->url + 7);
    return !cfg_loopback(hostport);
}

int rt_config_check(const rt_config *c, sw_error *err)
{
    if (c->n_models == 0)
        return sw_error_set(err, SW_EINVAL, "a [model] or [model NAME] section is required");
    int defaults = 0;
    for (int i = 0; i < c->n_models; i++) {
        const rt_model_config *m = &c->models[i];
        if (!m->path[0])
            return sw_error_set(err, SW_EINVAL, "[model%s%s] path is required",
                                m->name[0] ? " " : "", m->name);
        defaults += m->is_default;
        /* every id and alias names one model */
        for (int a = -1; a < m->n_aliases; a++) {
            const char *id = a < 0 ? m->name : m->aliases[a];
            for (int j = 0; j < c->n_models; j++)
                for (int b = -1; b < c->models[j].n_aliases; b++) {
                    const char *other = b < 0 ? c->models[j].name : c->models[j].aliases[b];
                    if ((j != i || b != a) && id[0] && !strcmp(id, other))
                        return sw_error_set(err, SW_EINVAL,
                                            "[model %s]: '%s' names model %s too", m->name, id,
                                            c->models[j].name);
                }
        }
    }
    if (defaults > 1)
        return sw_error_set(err, SW_EINVAL, "default = true on more than one [model NAME]");
    for (int i = 0; i < c->n_models; i++)
        for (int f = 0; f < c->models[i].n_fallback; f++) {
            bool known = false;
            for (int j = 0; j < c->n_models && !known; j++)
                known = j != i && !strcmp(c->models[j].name, c->models[i].fallback[f]);
            if (!known)
                return sw_error_set(err, SW_EINVAL,
                                    "[model %s] fallback = %s: no other [model %s] section",
                                    c->models[i].name, c->models[i].fallback[f],
                                    c->models[i].fallback[f]);
        }
    if (c->n_workers == 0)
        return sw_error_set(err, SW_EINVAL, "at least one [worker NAME] section is required");
    for (int i = 0; i < c->n_workers; i++) {
        const rt_worker_config *w = &c->workers[i];
        if (!w->model[0] && c->n_models > 1)
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: model = NAME is required when there are several "
                                "models", w->name);
        if (rt_config_worker_model(c, w) < 0)
            return sw_error_set(err, SW_EINVAL, "[worker %s]: model = %s: no [model %s] section",
                                w->name, w->model, w->model);
        if (w->on_demand && !w->managed)
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: on-demand = true needs a worker the router starts "
                                "(managed)", w->name);
        if (w->command[0] && !RT_KIND_EXTERNAL(w->kind))
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: command = is for kind = openai or llama-server "
                                "(an engine the router runs); a spillway worker is started "
                                "without one",
                                w->name);
        if (w->mmproj[0] && (w->kind != RT_KIND_LLAMA_SERVER || !w->command[0]))
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: mmproj = is for kind = llama-server with a command "
                                "(passed to it as --mmproj); a llama-server at a url says itself "
                                "whether it has a projector (its /props)",
                                w->name);
        if (w->command[0] && w->url[0] && strncmp(w->url, "http://", 7))
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: a command's url is http://HOST:PORT (where it "
                                "listens), or none: the router then picks a loopback port",
                                w->name);
        if (!strncmp(w->url, "https://", 8) && (w->kind != RT_KIND_OPENAI || w->command[0]))
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: an https:// url is for kind = openai without a "
                                "command (a remote service)",
                                w->name);
        if (w->ca_file[0] && strncmp(w->url, "https://", 8))
            return sw_error_set(err, SW_EINVAL, "[worker %s]: ca-file needs an https:// url",
                                w->name);
        if (w->api_key_env[0] && (w->kind != RT_KIND_OPENAI || w->command[0]))
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: api-key-env is for kind = openai at a url, "
                                "without a command (not yet for an engine the router runs)",
                                w->name);
        /* the TLS settings and the key belong to the address (router_tls.h) */
        for (int j = 0; j < i; j++)
            if (!w->managed && !c->workers[j].managed && !strcmp(w->url, c->workers[j].url) &&
                (strcmp(w->ca_file, c->workers[j].ca_file) ||
                 strcmp(w->api_key_env, c->workers[j].api_key_env)))
                return sw_error_set(err, SW_EINVAL,
                                    "[worker %s]: url %s is also [worker %s]'s, with another "
                                    "ca-file or api-key-env",
                                    w->name, w->url, c->workers[j].name);
        if (RT_KIND_EXTERNAL(w->kind) && !w->command[0] && (w->managed || !w->url[0]))
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: kind = %s needs a url (an engine already "
                                "running) or a command (one the router runs)",
                                w->name, w->kind == RT_KIND_OPENAI ? "openai" : "llama-server");
        if (!c->workers[i].managed && !c->workers[i].url[0])
            return sw_error_set(err, SW_EINVAL, "[worker %s]: managed = false needs a url",
                                c->workers[i].name);
    }
    for (int i = 0; i < c->n_tools; i++)
        if (!c->tools[i].url[0] || !c->tools[i].parameters[0])
            return sw_error_set(err, SW_EINVAL, "[tool %s]: url and parameters are required",
                                c->tools[i].name);
    if (!cfg_loopback(c->listen) && c->n_keys == 0)
        return sw_error_set(err, SW_EINVAL,
                            "[server] listen = %s is not a loopback address: refusing to start "
                            "without [server] api-keys",
                            c->listen);
    return SW_OK;
}

static int cfg_override(char *dst, size_t cap, char *keep, size_t keep_cap, const char *v,
                        const char *what, sw_error *err)
{
    if (!v || !v[0])
        return SW_OK;
    if (!cfg_copy(dst, cap, v) || !cfg_copy(keep, keep_cap, v))
        return sw_error_set(err, SW_EINVAL, "%s: too long", what);
    return SW_OK;
}

int rt_config_worker_model(const rt_config *c, const rt_worker_config *w)
{
    if (!w->model[0])
        return c->n_models == 1 ? 0 : -1;
    for (int i = 0; i < c->n_models; i++)
        if (c->models[i].name[0] && !strcmp(c->models[i].name, w->model))
            return i;
    return -1;
}

/* --model: the path of the only model (a [model] section made when the
 * file has none); refused when there are several. */
static int cfg_override_model(rt_config *c, const char *model, sw_error *err)
{
    if (!model || !model[0])
        return SW_OK;
    if (c->n_models > 1)
        return sw_error_set(err, SW_EINVAL,
                            "--model: the configuration has several models; set their paths in "
                            "their [model NAME] sections");
    if (c->n_models == 0) {
        c->n_models = 1;
        c->legacy_model = true;
    }
    return cfg_override(c->models[0].path, sizeof c->models[0].path, c->override_model,
                        sizeof c->override_model, model, "--model", err);
}

int rt_config_read(rt_config *c, const char *path, const char *listen, const char *state_dir,
                   const char *model, const char *ledger, sw_error *err)
{
    rt_config_defaults(c);
    if (!cfg_copy(c->config_path, sizeof c->config_path, path))
        return sw_error_set(err, SW_EINVAL, "configuration path too long");
    int rc = rt_config_load(c, path, err);
    if (rc)
        return rc;
    if ((rc = cfg_override(c->listen, sizeof c->listen, c->override_listen,
                           sizeof c->override_listen, listen, "--listen", err)) ||
        (rc = cfg_override(c->state_dir, sizeof c->state_dir, c->override_state_dir,
                           sizeof c->override_state_dir, state_dir, "--state-dir", err)) ||
        (rc = cfg_override_model(c, model, err)) ||
        (rc = cfg_override(c->ledger, sizeof c->ledger, c->override_ledger,
                           sizeof c->override_ledger, ledger, "--ledger", err)))
        return rc;
    char why[200];
    if (c->ledger[0] && !rt_config_ledger_valid(c->ledger, why, sizeof why))
        return sw_error_set(err, SW_EINVAL, "--ledger %.64s: %s",
                            strstr(why, "password") ? "..." : c->ledger, why);
    return rt_config_check(c, err);
}
