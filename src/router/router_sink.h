/* router_sink.h - where a generation's answer goes: the client socket
 * (chunked SSE or one response), the capture buffer (idempotency keys,
 * jobs, an agent run's inner generations) or an agent run's event
 * callback (rt_req.on_event), and what the client has received so far,
 * which the failover decision reads.
 */
#ifndef SPILLWAY_ROUTER_SINK_H
#define SPILLWAY_ROUTER_SINK_H

#include "router/router-impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One generation request's relay: what was sent and collected so far,
 * across its attempts. */
typedef struct rt_relay {
    rt_req *q;
    bool chat, stream;
    bool headers_sent, finished;
    uint32_t roles_sent;   /* chat: the choices (by index, n > 1) whose role
                              the client has */
    int32_t *tokens;       /* token ids the client has (sw_free) */
    size_t n_tokens, cap_tokens;
    long long draws;       /* sampler draws after them, -1 unknown */
    char phase[32];        /* where the last failure happened */
    char final_worker[64]; /* where the last attempt ran */
    size_t resume_base;    /* tokens sent before this attempt (a resume) */
    size_t text_bytes;     /* completion text the client got (resume.text_bytes) */
    double t_start;        /* monotonic, when the request was read */
    double ttft;           /* seconds to the first token sent, -1 before */
    int status;            /* HTTP status relayed to the client */
    bool content_sent;     /* completion text or a tool call reached the client */
    bool openai;           /* this attempt is on an external engine (kind =
                              openai or llama-server) */
    /* kind = llama-server (router_llamaserver.c) */
    bool ls_kind;          /* this attempt is on a llama-server */
    bool refused_context;  /* it answered exceed_context_size_error */
    bool worker_full_memory; /* a spillway worker's 503 worker_full said
                                "reason": "memory" (else its places) */
    int32_t refused_n_ctx; /* with this n_ctx (0 not given) */
    bool ls_kv_full;       /* "Context size has been exceeded.": an oom
                              that does not call for a restart */
    bool ls_native;        /* this attempt's events are native ones */
    bool ls_first;         /* its next chunk is its first */
    bool ls_include_usage; /* stream_options.include_usage */
    bool ls_ids_gap;       /* a token came without its id: no resume */
    size_t ls_ids;         /* ids it sent in this attempt */
    long long ls_created;  /* the chunks' "created" */
    char *ls_image_tail;   /* an image chat's rendered prompt after its last
                              media marker, from its native attempt
                              (sw_free): what rt__ls_resume_check reads
                              the sent text after */
    char *ls_resume_grammar; /* the grammar advanced over the ls_resume_ids
                                ids sent, from rt__ls_resume_check (sw_free):
                                the resume's request sends it */
    size_t ls_resume_ids;
    /* the prompt's blocks counted once in the books (router_prefix.h,
     * rt_queue_shared_attach): this attempt's worker, the prompt's block
     * hashes, and what its first token moved into the shared table */
    int attempt_worker;
    const uint64_t *prefix;
    int n_prefix;
    bool shared_noted;
    int shared_registered;
    int64_t shared_moved;
} rt_relay;

/* One SSE payload to the client (the stream's head first) and the
 * capture; -1 when the client is gone. */
int rt_sink_event(rt_relay *r, const char *payload);
/* One chunk of the chunked stream ("" ends it); -1 when the client is gone. */
int rt_sink_chunk(rt_relay *r, const char *data, size_t len);
/* Ends a stream with an error event, [DONE] and the last chunk; error
 * NULL (or one that cannot be written out) sends internal_error, "out of
 * memory". */
void rt_sink_stream_error(rt_relay *r, json_t *error);

#endif
