/* worker-impl.h - what the worker's HTTP side (worker_http.c, with
 * worker_request.c for request bodies, worker_tools.c for tool-call
 * replies and worker_reasoning.c for a thinking model's reasoning) and its
 * engine side (worker_engine.c) share: the request, the events the engine
 * sends back, and the server state with the lock that guards the shared
 * part.
 *
 * Ownership: a wk_req is created by the HTTP thread, queued for the engine,
 * and freed by the HTTP thread only, when it handles the request's final
 * event (WK_EV_DONE or WK_EV_ERROR); after posting that event the engine
 * never touches the request again. So no request is freed twice or used
 * after free, whatever the client does.
 */
#ifndef SPILLWAY_WORKER_IMPL_H
#define SPILLWAY_WORKER_IMPL_H

#include "common/alloc.h"
#include "api/api.h"
#include "api/messages.h"
#include "device/device.h"
#include "chat/chat_reasoning.h"
#include "chat/chat_template.h"
#include "grammar/constrain.h"
#include "engine/generate.h"
#include "grammar/json_schema.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"
#include "worker/worker.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct evhttp_request;
struct event_base;
struct evhttp;
struct event;

typedef enum wk_state {
    WK_LOADING = 0,
    WK_READY = 1,
    WK_DRAINING = 2,
    WK_FAILED = 3,
} wk_state;

#define WK_MAX_STOP_TOKENS 4
#define WK_MAX_CHOICES 16               /* n: choices in one answer */

/* What the reply is (docs/api.md, "Tools and response_format"). */
typedef enum wk_output {
    WK_OUT_TEXT = 0,        /* ordinary text */
    WK_OUT_JSON = 1,        /* response_format json_object / json_schema: constrained */
    WK_OUT_TOOL_FORCED = 2, /* tool_choice required / named: a constrained call */
    WK_OUT_TOOL_AUTO = 3,   /* tools offered: a reply in the family's call syntax is parsed */
    WK_OUT_GRAMMAR = 4,     /* grammar (GBNF): constrained text */
} wk_output;

/* Streaming a tool reply (HTTP thread): what was already turned into
 * chunks, a function of the text so far (so a resumed stream, which starts
 * from the resumed tokens' text, continues exactly where the first left). */
typedef struct wk_tool_stream {
    bool header_sent;       /* forced: the chunk with id, type and name */
    size_t args_sent;       /* forced: text bytes up to here went out as arguments */
    int auto_mode;          /* auto: 0 undecided, 1 plain content, 2 a call */
} wk_tool_stream;

typedef struct wk_req wk_req;
typedef struct wk_embed wk_embed; /* worker_embeddings.c */

/* The choices of one answer with n > 1 (worker_http.c): one request (and
 * sequence) per choice, sharing the HTTP request. The answer goes out
 * when the last one ends: non-stream, every choice in one body; a stream,
 * the chunks interleaved as they come, each with its choice's index, and
 * [DONE] after the last. HTTP thread only; freed with the last choice. */
typedef struct wk_group {
    int32_t n;
    int32_t n_live;                  /* choices whose final event has not come */
    wk_req *reqs[WK_MAX_CHOICES];
    bool started;                    /* the stream's head went out */
    json_t *choices[WK_MAX_CHOICES]; /* non-stream: each choice, at its end */
    json_t *exts[WK_MAX_CHOICES];    /* non-stream: each choice's spillway extension */
    int32_t completion_tokens;       /* summed over the choices */
    int32_t cached_tokens;           /* choice 0's */
    json_t *error;                   /* the first error: the answer (cancels the others) */
    int error_status;
} wk_group;

struct wk_req {
    wk_req *next;                    /* engine queue link */
    wk_req *live_prev, *live_next;   /* HTTP thread: requests in flight */
    char id[72];                     /* X-Request-Id (the router's, or made here) */
    char resp_id[96];                /* the body's id: chatcmpl-/cmpl- and the request id */
    int32_t n_choices;               /* n (1..WK_MAX_CHOICES) */
    wk_group *group;                 /* n > 1: the answer's choices, else NULL */
    int32_t choice;                  /* its index among them (0 without a group) */
    char *echo;                      /* completions' echo: the prompt's text, or NULL */
    size_t echo_len;
    bool chat;
    json_t *responses;               /* POST /v1/responses: its body (worker_responses.c) */
    struct api_resp_stream *resp_stream; /* ... its stream's translation, once begun */
    bool stream;
    bool include_usage;
    bool logprobs;
    int32_t top_logprobs;
    int32_t *prompt;                 /* client prompt + resume tokens */
    int32_t n_prompt;
    int32_t n_prompt_client;         /* usage.prompt_tokens */
    int32_t n_resume;
    int64_t resume_text_bytes;       /* resume: text bytes the client has; -1 unknown */
    int32_t max_tokens;              /* new tokens at most */
    int64_t kv_need;                 /* device KV bytes its admission takes (set
                                        by wk_engine_offer; 0 not counted) */
    eng_sampler_params sampling;     /* bias_ids / bias_values point below */
    int32_t *bias_ids;               /* logit_bias (sw_malloc) */
    float *bias_values;
    uint64_t skip_draws;
    bool ignore_eos;
    bool cache_prompt;               /* llama-server's cache_prompt (default true):
                                        false computes the whole prompt */
    char **stops;
    size_t n_stops;
    int32_t stop_tokens[WK_MAX_STOP_TOKENS]; /* chat: end-of-turn tokens */
    int32_t n_stop_tokens;
    int64_t created;
    /* constrained decoding and tools (set by the HTTP thread before submit;
     * the engine thread advances cons, the HTTP thread frees everything) */
    wk_output output;
    eng_grammar *grammar;
    eng_constraint *cons;            /* resume tokens already fed */
    char **tool_names;               /* the tools offered, for parsing calls */
    size_t n_tools;
    eng_chat_tool_syntax tool_syntax;
    /* reasoning (worker_reasoning.c): a thinking family's thought goes out
     * as reasoning_content, the rest as content (or tool calls) */
    bool split;                      /* reasoning_format deepseek on such a family */
    bool harmony_text;               /* harmony: its markers' text is reply text */
    bool harmony_calls;              /* harmony with tools offered (auto): calls
                                        come from its commentary messages */
    eng_reasoning rs;                /* HTTP thread: the splitter */
    eng_reasoning_delta rd;          /* HTTP thread: one event's split */
    eng_reasoning_text reasoning;    /* non-stream: the reasoning so far */
    /* HTTP thread only */
    wk_tool_stream ts;
    struct evhttp_request *evreq;
    bool started;                    /* stream: headers and first chunk sent */
    bool prefix_reported;            /* stream: spillway.prefix_tokens went out */
    bool detached;                   /* libevent dropped the connection */
    bool gone;                       /* the client closed its end */
    char *text;                      /* non-stream: the text so far */
    size_t text_len, text_cap;
    json_t *token_ids;
    json_t *lp;                      /* non-stream logprobs being built */
    /* an allocation failed while an event of it was handled: the answer
     * ends with a 500 / an error event (worker_http.c, sse_send) */
    bool broken;
    long fail_mark;                  /* sw_alloc_thread_failures() at the event's start */
    /* X-Spillway-Fault (tests; common/alloc.h): the request's fault
     * scope, current in each callback of the event loop that serves it,
     * and its engine thread's, current while the engine works for it */
    bool fault_scoped;
    sw_alloc_scope fault_scope;
    sw_alloc_scope engine_fault_scope;
    /* POST /v1/messages (worker_messages.c): the chat stream turned into
     * Anthropic's events as it goes out; NULL for an OpenAI request */
    struct api_msg_stream *msg;
    /* POST /v1/embeddings (worker_embeddings.c): its inputs and, once
     * the engine ran it, its vectors; NULL for a completion */
    wk_embed *embed;
    /* under wk_server.lock */
    bool cancelled;
};

typedef enum wk_event_kind {
    WK_EV_START = 0,                 /* admitted: a stream may send its headers */
    WK_EV_TOKEN = 1,
    WK_EV_DONE = 2,                  /* final */
    WK_EV_ERROR = 3,                 /* final */
} wk_event_kind;

typedef struct wk_event {
    struct wk_event *next;
    wk_event_kind kind;
    wk_req *req;
    char *text;                      /* released text (sw_malloc) or NULL */
    size_t text_len;
    int32_t token;
    float logprob;
    int32_t n_top;
    eng_token_logprob top[ENG_MAX_TOP_LOGPROBS];
    const char *finish;              /* DONE: "stop", "length", "cancelled" */
    const char *stop_string;         /* DONE: the stop string that ended it (in
                                        req->stops), NULL none */
    int32_t n_generated;
    int32_t n_cached;                /* DONE: prompt tokens taken from the prefix cache */
    int32_t prefix_tokens;           /* first TOKEN: eng_seq_prefix_cached_tokens */
    uint64_t draws;                  /* sampler draws consumed so far in total */
    int http_status;                 /* ERROR */
    const char *code;
    const char *type;
    char message[SW_ERROR_MESSAGE_MAX];
    json_t *extra;                   /* ERROR: extra fields of the error object */
} wk_event;

#define WK_MAX_SLOTS 64

typedef struct wk_slot {
    wk_req *req;                     /* NULL: free */
    int32_t n_prefilled;
    int32_t n_cached;                /* of n_prefilled, taken from the prefix cache */
    int32_t *history;
    size_t n_history;
    eng_sampler *sampler;
    float *logits;
    float *logprobs;
    int32_t n_generated;
    bool decoding;                   /* prefill done; logits hold the next step */
    eng_detok detok;
    char *held;                      /* text held back (possible stop prefix) */
    size_t held_len, held_cap;
    int32_t pending_token;           /* decode entry of this step */
    bool stop_hit;                   /* a stop string ended it: nothing more */
    int32_t stop_which;              /* that string's index in req->stops + 1, 0 none */
} wk_slot;

typedef struct wk_server {
    wk_options o;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* ---- under lock ---- */
    wk_req *queue_head, *queue_tail;
    int32_t n_queued;
    wk_event *ev_head, *ev_tail;
    int32_t ev_unwoken;              /* events queued without waking the HTTP
                                        thread (post_events, worker_engine.c) */
    bool stop_engine;
    wk_state state;
    char fail_message[SW_ERROR_MESSAGE_MAX];
    bool device_failed;
    bool device_error_seen;          /* engine thread: a step hit SW_EDEVICE */
    int32_t slots_active;
    /* requests accepted and not yet ended (queued, being admitted or
     * running): wk_engine_offer refuses what would take it past the
     * slots plus the queue; their final events give the places back */
    int32_t n_accepted;
    int32_t max_active_seen, max_accepted_seen; /* high-water marks */
    uint64_t n_refused_slots, n_refused_memory;  /* wk_engine_offer's refusals */
    size_t kv_used_bytes;
    size_t kv_device_used_bytes;     /* the device part of kv_used_bytes */
    /* the KV the device could hold at that same moment (free above the
     * reserve + kv_device_used_bytes), read on the engine thread, so the
     * two agree; -1 without a device figure */
    int64_t kv_budget_at_publish;
    size_t device_bytes;
    double prefill_tokens, prefill_seconds, decode_tokens, decode_seconds;
    /* the part of those totals that start-up calibration put there: while
     * the totals are no larger, /health says "rates_source": "calibration" */
    double calib_prefill_tokens, calib_decode_tokens;
    uint64_t n_ok, n_error, n_cancelled, n_rejected, n_oom;
    uint64_t prompt_tokens_total, generated_tokens_total;
    /* prompt tokens the engine computed (prefill), and the prefix cache:
     * requests that took cached tokens or none, and the engine's figures
     * at the last step */
    uint64_t prompt_tokens_computed;
    uint64_t cache_hits, cache_misses;
    eng_prefix_cache_stats cache;
    /* ---- set by the engine thread before state READY; read-only after ---- */
    eng_model *model;
    eng_context *ctx;
    dev_device *dev;
    const eng_tokenizer *tok;
    eng_cs_vocab *cs_vocab;          /* the vocabulary indexed for constrained decoding */
    char model_id[256];
    char fingerprint[64];            /* system_fingerprint (api_system_fingerprint) */
    eng_chat_family chat_family;
    int32_t n_ctx;
    int32_t n_seqs;
    size_t kv_bytes_per_token;
    size_t kv_block_bytes;
    int32_t kv_block_tokens;
    /* ---- engine thread only ---- */
    wk_slot slots[WK_MAX_SLOTS];
    pthread_t engine_thread;
    bool engine_started;
    /* ---- HTTP thread only ---- */
    int pipe_r, pipe_w;
    struct event_base *base;
    struct evhttp *http;
    struct event *pipe_ev;
    struct event *gone_ev;
    struct event *sig_ev[2];
    wk_req *live;
    int32_t unflushed;               /* final replies not yet written out */
    bool exit_scheduled;
    uint64_t next_id;
    int exit_status;
    char listen_desc[300];
    char *unix_path;
} wk_server;

/* worker_engine.c */
void *wk_engine_main(void *arg);
/* Queues a request for the engine (takes ownership unless it fails:
 * SW_ERANGE when the queue is full). */
int wk_engine_submit(wk_server *s, wk_req *req);
/* All n queued, in order, or none (SW_ERANGE: the queue has no room). */
int wk_engine_submit_all(wk_server *s, wk_req *const *reqs, int32_t n);

/* What a refusal of wk_engine_offer says about the worker's room now. */
typedef struct wk_room {
    bool memory;                     /* refused for KV memory (else for places) */
    int32_t places_free;             /* slots + queue less the requests accepted */
    int64_t kv_free_bytes;           /* device KV a newcomer could take now; -1
                                        not counted (no device) */
    int64_t kv_need_bytes;           /* what the refused request needs; 0 not counted */
} wk_room;

/* The worker's own admission, at once and before any work: all n queued,
 * or none. Refused with SW_ERANGE when the requests already accepted
 * (queued or running) plus these would be more than the slots plus the
 * queue, with SW_EDEVOOM when the worker runs others and the device's
 * free KV memory (its prefix cache's evictable blocks counted free, the
 * needs of the requests queued before counted taken) cannot hold what
 * these ones' admission takes at least: the blocks of prompt + max_tokens
 * (the prompt alone under the grow policy), less the prompt's whole
 * blocks when the prefix cache may hold them. The engine's admission is
 * the exact check (503 out_of_memory, phase admission). An idle worker
 * refuses nothing here. The refusal is counted, and *room (may be NULL)
 * says why and what is free. */
int wk_engine_offer(wk_server *s, wk_req *const *reqs, int32_t n, wk_room *room);
/* Marks a request cancelled (the client went away) and wakes the engine. */
void wk_engine_cancel(wk_server *s, wk_req *req);
void wk_req_free(wk_req *req);
/* Whether name is the model's id or one of its aliases. */
bool wk__model_name_is(const wk_server *s, const char *name);
void wk_event_free(wk_event *ev);

/* worker_http.c */
/* Wakes the HTTP thread to drain the event queue (any thread). */
void wk_http_wake(wk_server *s);

/* worker_responses.c: POST /v1/responses, translated to the chat request
 * the worker serves and its answer back */
/* The chat body of a Responses body (a new reference; r keeps the body and
 * takes a resp_ id), or NULL with e filled. */
json_t *wk__responses_request(wk_req *r, json_t *body, api_error *e);
/* The SSE text for one chat chunk, or for the stream's end (broken: it
 * ends failed, out of memory); sw_free, NULL when out of memory. */
char *wk__responses_chunk(wk_req *r, const json_t *chunk);
char *wk__responses_end(wk_req *r, bool broken);
/* The Responses parameter a chat parameter stands for (api_responses_param). */
const char *wk__responses_param(const char *chat_param);
/* The text wk__responses_chunk last returned was not sent. */
void wk__responses_lost(wk_req *r);
/* The Response of a whole chat answer (a new reference, NULL: out of memory). */
json_t *wk__responses_answer(wk_req *r, const json_t *chat);

/* worker_request.c */
/* Why a body was refused: the HTTP status (0 = 400), the error code (NULL =
 * invalid_request), the parameter at fault and the message. */
typedef api_error wk_parse_error; /* api.h */
/* Fills r from a completions (chat false) or chat body; false with *p set
 * when the body is refused. What r holds is freed by wk_req_free either way. */
bool wk__parse_request(wk_server *s, json_t *body, bool chat, wk_req *r, wk_parse_error *p);

/* worker_embeddings.c (docs/api.md, Embeddings) */
/* POST /v1/embeddings (HTTP thread): parsed, checked and queued, or
 * answered with its error. */
void wk__handle_embeddings(wk_server *s, struct evhttp_request *evreq);
/* Engine thread: every input of r through sequence seq (a free slot's),
 * cleared again after; SW_OK, SW_ECANCELLED when the client left between
 * two inputs, or eng_embed's / eng_seq_reserve's error. */
int wk__embed_run(wk_server *s, wk_req *r, int32_t seq, sw_error *err);
/* HTTP thread, after the engine's final event: the answer (NULL when
 * memory ran out). */
json_t *wk__embed_answer(wk_server *s, const wk_req *r);
int32_t wk__embed_prompt_tokens(const wk_embed *e);
void wk__embed_free(wk_embed *e);

/* worker_http.c, for the endpoints in files of their own */
/* A request's id: the client's X-Request-Id when it is 1-63 characters of
 * A-Z a-z 0-9 - _ . :, else PREFIX-<pid>-<a number>. */
void wk__request_id(wk_server *s, const char *hdr_id, const char *prefix, char *out, size_t cap);
json_t *wk__http_read_body(wk_server *s, struct evhttp_request *evreq, const char *req_id);
void wk__http_send_error(struct evhttp_request *evreq, int status, const char *code,
                         const char *param, const char *req_id, const char *message);
/* Queues r for the engine and follows its connection (a client that
 * leaves cancels it); when wk_engine_offer refuses it, the refusal is
 * sent and its code returned (nothing else done: r is the caller's). */
int wk__http_submit(wk_server *s, wk_req *r);
/* 503 worker_full for a refusal of wk_engine_offer. */
void wk__http_send_refusal(wk_server *s, struct evhttp_request *evreq, const char *req_id,
                           const wk_room *room);

/* worker_reasoning.c */
/* Sets r->split, r->harmony_text and r->harmony_calls from the family, the
 * worker's default and the body's reasoning_format (false with *p set for
 * an unknown value). */
bool wk__reasoning_setup(wk_server *s, json_t *body, wk_req *r, wk_parse_error *p);
/* Harmony: the marker text of a control token (its piece, which the
 * detokenizer leaves out), which comes after the event's text; NULL for
 * other tokens and families. */
const char *wk__event_marker(wk_server *s, const wk_req *r, int32_t token, size_t *len);
/* A resumed request: the resumed tokens' text the first worker had
 * released, fed to the splitter (output dropped: the client has it; a
 * tool reply keeps the content in r->text, as its calls are parsed from
 * it). False when out of memory. */
bool wk__reasoning_resume(wk_server *s, wk_req *r, bool tool_reply);
/* Harmony with tools: the calls of the finished reply as a tool_calls
 * array, or NULL when it made none (of the offered tools). */
json_t *wk__harmony_calls(const wk_req *r);
/* Non-stream: appends to the reasoning so far (cut short out of memory). */
void wk__reasoning_append(wk_req *r, const char *text, size_t n);

/* worker_tools.c: the reply text as tool calls (comments at each function) */
/* Appends to the non-stream reply text (cut short when out of memory). */
void wk__text_append(wk_req *r, const char *text, size_t n);
/* "call_" + 24 hex digits from the request id and the call's index. */
void wk__tool_call_id(const wk_req *r, size_t index, char *out, size_t cap);
/* Forced call: where its arguments start (0: the name is not complete yet,
 * else the name is copied out), and how many bytes of them may go out now. */
size_t wk__forced_args_start(const char *text, size_t len, char *name, size_t cap);
size_t wk__forced_args_ready(const char *text, size_t len, size_t start);
/* Auto reply: 0 may still become a call, 1 plain content, 2 a call. */
int wk__auto_state(const wk_req *r);
bool wk__tool_known(const wk_req *r, const char *name);
/* The finished reply as a tool_calls array, or NULL when it is not one
 * (auto: a reply is a call only when it starts with one). */
json_t *wk__auto_calls(const wk_req *r);
json_t *wk__forced_calls(const wk_req *r);

/* worker_messages.c: Anthropic's Messages API over the chat machinery */
/* Whether path is /v1/messages or /v1/messages/count_tokens. */
bool wk__messages_path(const char *path);
/* A JSON answer to a Messages request in Anthropic's shape (a new
 * object): a chat.completion as a Message, an error as an error; NULL
 * when memory ran out. */
json_t *wk__messages_answer(int status, json_t *body);
/* r's Messages stream state (r->msg), before its first event: false
 * when memory ran out. */
bool wk__messages_begin(wk_server *s, wk_req *r);
/* POST /v1/messages/count_tokens: {"input_tokens": N} (status 200), or
 * an error body with *status set. */
json_t *wk__messages_count(wk_server *s, json_t *body, int *status);

#endif
