/* router_llamaserver.h - kind = llama-server (router_llamaserver.c): its
 * health figures, the native request of a stream, its events translated
 * into OpenAI chunks with their token ids, its typed context error.
 * Private to src/router.
 */
#ifndef SPILLWAY_ROUTER_LLAMASERVER_H
#define SPILLWAY_ROUTER_LLAMASERVER_H

#include "router/router-impl.h"
#include "router/router_failover.h"
#include "router/router_sink.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What one poll of a llama-server found (0: not reported). */
typedef struct rt_ls_health {
    int32_t slots, slots_busy;  /* GET /slots */
    int32_t n_ctx;              /* a slot's context */
    double prefill_rate, decode_rate; /* GET /metrics, tokens/s */
    bool vocab_checked;         /* POST /tokenize answered */
    bool vocab_same;            /* and gave the router's ids of the probe */
    bool props_checked;         /* GET /props answered (asked with the vocabulary) */
    bool vision;                /* and its modalities.vision is true: a projector
                                   (--mmproj) that takes images */
} rt_ls_health;

/* Polls the llama-server at address (no lock held): the status of GET
 * /health (200 ready, 503 loading, -1 unreachable) and, when 200, the
 * figures into h; the vocabulary of model compared, and /props asked
 * whether it takes images, when check_vocab (once per process). */
int rt__ls_health(const rt_router *rt, const char *address, int model, bool check_vocab,
                  rt_ls_health *h);

/* The body of POST /completion for r's stream, from the client's body
 * (a chat's messages rendered by the server's POST /apply-template; a
 * body with "resume": {"tokens"} gets the token prompt, the text then
 * those ids):
 * 0 and *out (free()); 1 when the request must take the OpenAI endpoint
 * (why says which field); -1 when the server could not render it, -2
 * when the client left meanwhile. */
int rt__ls_native_body(rt_relay *r, const char *address, const char *body, size_t len,
                       char **out, char *why, size_t why_cap);

/* Whether another llama-server can continue body's stream from a token
 * prompt after the n_ids ids sent (greedy, no stop strings, every field
 * native, and a grammar only where it can be advanced over their text,
 * read with tok), and why not: the replay table's input
 * (router_failover.h). An image chat's resume sends the text of the ids
 * instead: it also needs that text, after image_tail (the rendered
 * prompt after its last media marker, rt_relay.ls_image_tail; NULL: not
 * known), to tokenize back to the very ids. A constrained stream's
 * advanced grammar goes to *grammar_out (sw_free; NULL: none; the
 * argument may be NULL), so the resume's request need not compute it
 * again. */
rt_ls_resume rt__ls_resume_check(json_t *body, const eng_tokenizer *tok, const int32_t *ids,
                                 size_t n_ids, const char *image_tail, char **grammar_out);

/* A native stream begins on this attempt. */
void rt__ls_stream_begin(rt_relay *r);

/* One native event translated: *n_out payloads (each free()) for the
 * relay, in order, the last "[DONE]" after the final event. 0; 1 for an
 * error event (its type and message in error_text); -1 for an event that
 * is not JSON, or out of memory (payloads already made are in out). */
#define RT_LS_MAX_OUT 4
int rt__ls_translate(rt_relay *r, const char *payload, char *out[RT_LS_MAX_OUT], int *n_out,
                     char *error_text, size_t error_cap);

/* Whether an error body is llama-server's exceed_context_size_error; its
 * n_ctx (0 when absent) into *n_ctx. */
bool rt__ls_context_error(const char *body, int32_t *n_ctx);

#endif
