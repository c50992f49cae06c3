/* worker.h - `spillway worker`: one engine served over HTTP.
 *
 * A worker is one process serving one model on one device with one
 * placement profile (DESIGN.md, Processes). It speaks the OpenAI API plus
 * the internal extensions the router needs (token ids, `resume`, a detailed
 * /health); docs/api.md is the reference for every endpoint and field.
 *
 * Two threads: the HTTP thread runs libevent's evhttp and never blocks on
 * generation; the engine thread owns the model, the context and every
 * sequence, and advances all active sequences together one step at a time
 * (continuous batching, chunked prefill of newcomers). They meet in a locked
 * queue of requests (HTTP -> engine) and a locked queue of events (engine ->
 * HTTP, woken through a pipe).
 */
#ifndef SPILLWAY_WORKER_WORKER_H
#define SPILLWAY_WORKER_WORKER_H

#include "chat/chat_reasoning.h"
#include "chat/chat_template.h"
#include "engine/model.h"
#include "text/tokenizer.h"

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Exit status after an unrecoverable device error (SW_EDEVICE): the
 * supervisor restarts the worker (EX_TEMPFAIL of sysexits.h). */
#define WK_EXIT_DEVICE_FAILURE 75
/* Exit status when the model or the device could not be set up. */
#define WK_EXIT_STARTUP_FAILURE 1

typedef struct wk_options {
    const char *model_path;
    const char *device;          /* NULL: CPU profile (host memory) */
    uint64_t sim_capacity;       /* sim-gpu pool capacity when creating it */
    int32_t gpu_layers;          /* -1: all */
    int32_t ctx_limit;           /* tokens per sequence; 0: min(trained, 4096) */
    int32_t max_seqs;            /* sequences served at once (default 4) */
    float reserve;               /* share of the device never used (0.10) */
    eng_kv_policy policy;
    uint32_t kv_type;            /* the KV cache's elements (ENG_TYPE_F16 default) */
    int32_t threads;             /* 0: one per core */
    const char *listen;          /* "unix:PATH", "HOST:PORT" or "PORT" */
    int32_t prefill_chunk;       /* prompt tokens per prefill chunk, one newcomer per step (64) */
    int32_t max_queue;           /* requests waiting for a slot (64) */
    size_t max_body_bytes;       /* request bodies above get 413 (1 MiB) */
    size_t max_header_bytes;     /* header blocks above get 400 (16 KiB) */
    int http_timeout_s;          /* read/write time-out per connection (30) */
    const char *chat_template;   /* family name overriding detection, or NULL */
    eng_reasoning_format reasoning_format; /* requests' default (auto: deepseek
                                    for the families that think) */
    const char *model_id;        /* the id it answers to (--model-id), or NULL:
                                    api_model_id's */
    bool skip_calibration;       /* true: no start-up measurement of the rates
                                    (--no-calibrate); /health has none until
                                    traffic measures them */
    bool prefix_cache;           /* keep finished sequences' KV blocks for
                                    prompts that start the same (default
                                    true; --no-prefix-cache) */
    bool shared_device;          /* other workers allocate on the device
                                    (--shared-device): the prefix cache
                                    keeps no block after its requests end,
                                    only shares among requests in flight */
    const char *cors_origins;    /* origins a browser page may call from
                                    (api_cors_allow; "*" default) */
    const char *const *aliases;  /* other names it answers to as "model"
                                    (--alias), n_aliases of them; the
                                    caller keeps them for the run */
    size_t n_aliases;
    int pooling;                 /* /v1/embeddings' pooling (engine/embed.h:
                                    mean, cls or last), overriding the
                                    file's <arch>.pooling_type; -1: the
                                    file's (--pooling) */
} wk_options;

wk_options wk_default_options(void);

/* Runs the worker until SIGTERM / SIGINT (drains the active requests, then
 * returns 0), an unrecoverable device error (WK_EXIT_DEVICE_FAILURE) or a
 * startup failure (WK_EXIT_STARTUP_FAILURE). Prints one line
 * "spillway worker: listening on <address>" on stdout once the socket is
 * bound (the actual port when port 0 was asked for). */
int wk_serve(const wk_options *opts);

#endif
