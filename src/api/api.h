/* api.h - the OpenAI protocol pieces the worker and the router share.
 *
 * Both processes read the same request bodies: the worker to serve them,
 * the router to route and admit them (a model id to match, a prompt's
 * token count for the context and KV checks). What both need lives here,
 * so that neither includes the other (docs/internals/rooms.md): the id a
 * model file is served as, a chat body's messages and tools as the chat
 * room's types, and the token count of a chat prompt.
 */
#ifndef SPILLWAY_API_H
#define SPILLWAY_API_H

#include "chat/chat_template.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* A refused body: the message, the parameter it names (or NULL), and the
 * HTTP status and error code (400 invalid_request unless set before). */
typedef struct api_error {
    char msg[512];
    const char *param;
    int status;
    const char *code;
} api_error;

/* Fills e (status 400 and invalid_request when none is set yet); returns
 * false, so that a parser can `return api_bad(...)`. */
bool api_bad(api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An allocation lost while reading the body: 500 internal_error "out of
 * memory" whatever was set before (the body is not to blame, and the
 * client may retry); returns false. */
bool api_oom(api_error *e);

/* ---- CORS (the Fetch standard's protocol), for browser clients ---------- */

/* The methods and request headers a preflight allows by default, and the
 * response headers a page may read. */
#define API_CORS_METHODS "GET, POST, DELETE, OPTIONS"
#define API_CORS_HEADERS                                                                       \
    "Authorization, Content-Type, Idempotency-Key, X-Request-Id, Prefer, x-api-key, "          \
    "anthropic-version, anthropic-beta"
#define API_CORS_EXPOSE                                                                        \
    "X-Request-Id, X-Spillway-Worker, X-Spillway-Model, X-Spillway-Attempts, "                \
    "X-Spillway-Fallback-From, Retry-After"
/* The Access-Control-Allow-Origin value for a request from origin, or NULL
 * when the list does not allow it: list "*" allows any origin (answered
 * "*"), otherwise it names origins (comma- or space-separated, compared
 * exactly: the origin is answered); NULL or "" allows none. */
const char *api_cors_allow(const char *list, const char *origin);
/* A preflight's Access-Control-Allow-Headers: the headers it asked for
 * when they are a plain list of names, else API_CORS_HEADERS. */
const char *api_cors_request_headers(const char *asked);
/* Whether a configured list is "*", "", or origins (scheme://host[:port]). */
bool api_cors_list_valid(const char *list);

/* ---- model ids ---------------------------------------------------------- */

/* A model's id when none is given: the file's general.name, else the
 * file name of path, else "model" (each only when it is 1..cap-1 bytes of
 * printable UTF-8). The worker's and the router's for a [model] section
 * without a name. */
void api_model_id(const eng_gguf *gg, const char *path, char *out, size_t cap);
/* Whether p (n bytes) can be a model id: printable UTF-8 (it goes into
 * every JSON response). */
bool api_model_id_valid(const char *p, size_t n);
/* OpenAI's system_fingerprint of answers from the model file at path:
 * "spillway-<version>-<12 hex digits>", the digits a 64-bit FNV-1a hash of
 * the file's size, its first and its last MiB (the GGUF header, metadata
 * and vocabulary, and weights at both ends: cheap on a file of any size,
 * and another file or another build gives another string). The version
 * alone when the file cannot be read. */
void api_system_fingerprint(const char *path, char *out, size_t cap);

/* ---- chat messages -------------------------------------------------------- */

/* A chat body's messages as the chat room renders them. Strings point into
 * the body (keep it alive); content given as parts is joined into owned
 * copies. */
typedef struct api_chat_messages {
    eng_chat_message *msgs;
    eng_chat_message_tools *tools; /* tool_calls, tool_call_id per message */
    const char **reasoning;        /* reasoning_content per message, or NULL */
    size_t n;
    eng_chat_tool_call **calls_; /* owned, per message */
    char **joined_;              /* owned, per message */
} api_chat_messages;

/* Reads `messages` (a non-empty array is the caller's check). False with e
 * set when a message is malformed; every field is freed by
 * api_chat_messages_free either way. */
bool api_chat_messages_parse(json_t *messages, api_chat_messages *out, api_error *e);
void api_chat_messages_free(api_chat_messages *m);

/* ---- tools and tool_choice ------------------------------------------------ */

#define API_MAX_TOOLS 64

typedef enum api_tool_choice {
    API_CHOICE_NONE,     /* no tools, or tool_choice "none" */
    API_CHOICE_AUTO,     /* the default with tools */
    API_CHOICE_REQUIRED, /* some tool must be called */
    API_CHOICE_NAMED,    /* this one: names[named] */
} api_tool_choice;

typedef struct api_tools {
    size_t n;
    const char *names[API_MAX_TOOLS]; /* into the body */
    json_t *parameters[API_MAX_TOOLS]; /* into the body; NULL: none given */
    char *text;       /* the definitions as the prompt shows them, one JSON
                         text per line with Python json.dumps's spacing
                         (sw_free); NULL without tools */
    api_tool_choice choice;
    size_t named;
} api_tools;

/* Reads and checks `tools` and `tool_choice` (chat false: a completions
 * body, where tools are refused). False with e set when refused; t is
 * freed by api_tools_free either way. */
bool api_tools_parse(json_t *body, bool chat, api_tools *t, api_error *e);
void api_tools_free(api_tools *t);

/* Whether the prompt shows the tools' definitions: the model is offered
 * them (auto, without a JSON response_format) or must call one. */
bool api_tools_in_prompt(const api_tools *t, json_t *body);

/* ---- the prompt ------------------------------------------------------------ */

/* What a chat body asks of the template beyond its messages (o's tools
 * are the caller's): chat_template_kwargs {"enable_thinking": bool} (Qwen3;
 * llama-server's and vLLM's field; other keys are ignored),
 * "reasoning_effort" ("low", "medium" or "high", and OpenAI's "minimal" as
 * "low"; harmony), and today's UTC
 * date for harmony's and Llama 3.1's system message (into date, 11 bytes). False with e
 * set for a wrong type or value. */
bool api_chat_options_parse(json_t *body, eng_chat_options *o, char date[11], api_error *e);

/* The chat prompt in the family's template with the tools' text and the
 * options (o->tools_text: the definitions, or NULL), tokenized so that
 * only the template's text can produce control tokens: what a worker
 * prefills. *ids (sw_free) and *n_ids; false with e set. */
bool api_chat_tokenize(const eng_tokenizer *tok, eng_chat_family family,
                       const api_chat_messages *m, const eng_chat_options *o, int32_t **ids,
                       size_t *n_ids, api_error *e);

/* How many prompt tokens a worker with this tokenizer and chat family
 * renders a /v1/chat/completions body to (template, tool definitions,
 * tool calls and results, content parts), for the router's admission,
 * without compiling any grammar. SW_OK and *n_tokens; SW_EINVAL when a
 * worker would refuse the body for its messages or tools (it then answers
 * with the reason); SW_ENOMEM. */
int api_chat_prompt_tokens(const eng_tokenizer *tok, eng_chat_family family, json_t *body,
                           size_t *n_tokens);
/* The same with the token ids themselves (*ids_out, sw_free) on SW_OK. */
int api_chat_prompt_ids(const eng_tokenizer *tok, eng_chat_family family, json_t *body,
                        int32_t **ids_out, size_t *n_tokens);

#endif
