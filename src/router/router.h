/* router.h - `spillway serve`: the router in front of the workers.
 *
 * The router is what users run (DESIGN.md, Processes and Request
 * lifecycle): it reads an INI configuration, spawns and supervises the
 * managed workers, admits each request from its exact prompt token count
 * and the workers' /health, routes it to the first eligible worker in
 * preference order, and replays or resumes it on the next worker when one
 * runs out of memory or crashes. docs/router.md is the reference for the
 * configuration keys and the behaviour.
 */
#ifndef SPILLWAY_ROUTER_ROUTER_H
#define SPILLWAY_ROUTER_ROUTER_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RT_MAX_WORKERS 16
#define RT_MAX_KEYS 8
#define RT_MAX_ENV 8
#define RT_MAX_TOOLS 16
#define RT_MAX_MODELS 8
#define RT_MAX_ALIASES 8

/* A model the router serves: a [model NAME] section, or the one [model]
 * section (its name then "" in the file, the model's id, taken at start:
 * general.name, else the file name). */
typedef struct rt_model_config {
    char name[64];             /* the id clients send as "model" */
    int position;              /* its place among the model sections */
    char path[512];
    char chat_template[32];    /* "" = detected */
    char reasoning_format[16]; /* reasoning-format: "" = the worker's default (auto) */
    char pooling[8];           /* pooling: its workers' /v1/embeddings pooling
                                  (--pooling mean|cls|last); "" = the file's */
    char aliases[RT_MAX_ALIASES][64]; /* more ids clients may send */
    int n_aliases;
    bool is_default;           /* default = true: a request without "model" */
    /* fallback = OTHER[, ...]: models that answer, in this order, a
     * request this one's workers cannot admit in time */
    char fallback[RT_MAX_MODELS - 1][64];
    int n_fallback;
    bool remote_never;         /* remote = never: its requests never go to a
                                  remote worker (rt_config_worker_remote) */
    int32_t image_tokens;      /* image-tokens: the KV tokens the books count per
                                  image of a request (docs/engines.md, Images);
                                  0 = not known: an image request reserves a
                                  whole slot's context */
} rt_model_config;

typedef struct rt_worker_config {
    char name[64];
    int position;              /* its place among the [worker] sections
                                  (breaks ties in preference) */
    bool managed;              /* true: the router spawns it */
    char url[512];             /* unix:PATH, http://HOST:PORT or (kind = openai,
                                  not managed) https://HOST[:PORT] */
    char ca_file[512];         /* https: a CA (PEM) trusted besides the system's */
    char api_key_env[128];     /* the variable holding the key sent as
                                  Authorization: Bearer; "" none. Only the
                                  name lives here: the key is read at start
                                  into router_net's upstream table */
    char device[128];          /* "" = cpu profile */
    uint64_t sim_capacity;     /* 0 = worker default */
    int32_t gpu_layers;        /* -1 = all */
    int32_t ctx_limit;         /* 0 = worker default */
    int32_t max_seqs;          /* 0 = worker default */
    double reserve;            /* < 0 = worker default */
    char policy[16];           /* "" = worker default */
    char kv_type[8];           /* kv-type: "" = worker default (f16) */
    int32_t threads;           /* 0 = worker default */
    int32_t preference;        /* lower first; ties in file order */
    char env[RT_MAX_ENV][256]; /* extra "K=V" for a managed worker */
    int n_env;
    int kind;                  /* RT_KIND_SPILLWAY (default), RT_KIND_OPENAI or
                                  RT_KIND_LLAMA_SERVER */
    bool skip_calibration;     /* calibrate = false: managed worker started
                                  with --no-calibrate */
    bool no_prefix_cache;      /* prefix-cache = false: managed worker started
                                  with --no-prefix-cache */
    char model[64];            /* model = NAME; "" = the only model */
    bool on_demand;            /* on-demand = true: started when its model is
                                  asked for, stopped when idle */
    int32_t idle_timeout_s;    /* idle-timeout-s: an on-demand worker without
                                  requests this long is stopped (300) */
    char command[1024];        /* kind = openai or llama-server: the engine the
                                  router runs
                                  (an argv template: {host} {port}
                                  {model_path}); "" none */
    char mmproj[512];          /* kind = llama-server with a command: its vision
                                  projector, passed as --mmproj PATH; "" none */
} rt_worker_config;

/* What a worker is: a spillway worker (its /health figures, resume, typed
 * errors), another OpenAI-compatible engine at a url (llama-server,
 * Ollama, vLLM): no extensions used (docs/router.md, External upstreams),
 * or llama.cpp's llama-server through its native API (router_llamaserver.c:
 * token ids of its streams, so a spillway worker can resume them; /slots,
 * /metrics, /tokenize; its typed errors). Both others are external: no
 * spillway extensions sent; never resumed onto, except a llama-server,
 * which takes a greedy stream another llama-server started from a token
 * prompt (router_failover.c). */
enum { RT_KIND_SPILLWAY = 0, RT_KIND_OPENAI = 1, RT_KIND_LLAMA_SERVER = 2 };
#define RT_KIND_EXTERNAL(kind) ((kind) != RT_KIND_SPILLWAY)

/* A server-side tool ([tool NAME]): the router calls it in agent runs
 * ("tool_execution": "server"); docs/router.md, Tools. */
typedef struct rt_tool_config {
    char name[64];
    int line;                  /* of its [tool NAME] header */
    char description[512];
    char url[512];             /* http://LOOPBACK:PORT/PATH or unix:PATH */
    char parameters[8192];     /* JSON schema of the arguments (an object) */
    bool idempotent;           /* default false */
    int timeout_ms;            /* default 5000 */
} rt_tool_config;

typedef struct rt_config {
    char listen[256];          /* HOST:PORT (default 127.0.0.1:8080) */
    char api_keys[RT_MAX_KEYS][128];
    int n_keys;
    char state_dir[512];       /* default ./spillway-state */
    size_t max_body_bytes;     /* default 1 MiB */
    size_t max_image_bytes;    /* one image of a request, decoded (20 MiB) */
    char cors_origins[1024];   /* origins a browser page may call from: "*" (default) any,
                                  "" none, else a list (api_cors_allow) */
    int max_attempts;          /* default 3 */
    int max_connections;       /* default 256 */
    int queue_size;            /* requests waiting for a worker (64) */
    int queue_timeout_ms;      /* longest wait in the queue (10000) */
    int http_timeout_s;        /* default 30 */
    int keepalive_timeout_s;   /* idle time between two requests on a
                                  connection (5); 0: one request each */
    int keepalive_max_requests;/* requests per connection (100) */
    int ledger_retention_s;    /* finished ledger rows kept (7 days) */
    char ledger[512];          /* postgresql://USER@HOST:PORT/DB: a ledger
                                  shared with other routers; "" SQLite in
                                  state-dir (default) */
    int ledger_lease_s;        /* the leases this router holds on keys and
                                  jobs in a shared ledger (10) */
    int health_interval_ms;    /* default 1000 */
    int hang_timeout_ms;       /* a ready worker silent this long is killed (15000) */
    int ready_timeout_s;       /* managed worker start-up (default 120) */
    rt_model_config models[RT_MAX_MODELS];
    int n_models;
    bool legacy_model;         /* the one [model] section (no NAME) */
    rt_worker_config workers[RT_MAX_WORKERS];
    int n_workers;
    int idempotency_ttl_s;     /* how long an Idempotency-Key is kept (86400) */
    int max_tool_steps;        /* tool calls per agent run (4) */
    int job_workers;           /* jobs run at once (2) */
    rt_tool_config tools[RT_MAX_TOOLS];
    int n_tools;
    int drain_timeout_s;       /* a reload's drain of a removed or changed
                                  worker, at most (300) */
    int stop_delay_ms;         /* after SIGTERM/SIGINT, serve on this long
                                  with /health 503 "draining" before
                                  closing the listener (0: close at once) */
    /* what `spillway serve` was started with: a reload reads the file
     * again and applies the same command-line overrides ("" none) */
    char config_path[512];
    char override_listen[256], override_state_dir[512], override_model[512];
    char override_ledger[512];
} rt_config;

void rt_config_defaults(rt_config *c);
/* Reads an INI file into c (defaults first). Errors name the line and the
 * key: SW_EINVAL for a bad value or unknown key, SW_EIO when unreadable. */
int rt_config_load(rt_config *c, const char *path, sw_error *err);
/* Checks the finished configuration (after command-line overrides): a
 * model with a path, at most one default, ids and aliases distinct, every
 * worker's model known (and named when there are several), at least one
 * worker, a non-loopback listen address only with an API key. */
int rt_config_check(const rt_config *c, sw_error *err);
/* What `spillway serve` and a reload do: defaults, the file at path,
 * the overrides (NULL or "" none; kept in c for the next reload; model:
 * the path of the only model; ledger: [server] ledger), the check.
 * SW_EINVAL / SW_EIO with the message naming file, line and key. */
int rt_config_read(rt_config *c, const char *path, const char *listen, const char *state_dir,
                   const char *model, const char *ledger, sw_error *err);
/* Whether v is a ledger URL [server] ledger takes: postgresql:// or
 * postgres://, without a password (that comes from PGPASSWORD or
 * ~/.pgpass). false with why (cap bytes) otherwise. */
bool rt_config_ledger_valid(const char *v, char *why, size_t cap);
/* The model of worker configuration w: its index in c->models, -1 when
 * it names none there. */
int rt_config_worker_model(const rt_config *c, const rt_worker_config *w);
/* Whether a request sent to w leaves the machine: a kind = openai worker
 * at an https:// url, or at an http:// url whose host is not loopback. */
bool rt_config_worker_remote(const rt_worker_config *w);

/* Runs the router until SIGTERM / SIGINT; returns the exit status. Prints
 * "spillway serve: listening on HOST:PORT" on stdout once bound (the real
 * port when 0 was asked for) and all workers were started. */
int rt_serve(const rt_config *c);

#endif
