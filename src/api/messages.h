/* messages.h - Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) as a translation to and from chat
 * completions, for the worker and the router alike.
 *
 * A Messages body becomes the chat-completions body the engine already
 * serves (api_msg_to_chat); the chat answer becomes a Message
 * (api_msg_from_chat), a chat stream becomes a Messages stream event by
 * event (api_msg_stream), and an OpenAI-shaped error becomes Anthropic's
 * (api_msg_error_from_chat). Nothing here knows a worker or a router:
 * the worker runs its chat machinery unchanged between the two halves,
 * and the router relays the chat stream between workers as it always
 * does (failover, resume) and translates only what reaches the client.
 */
#ifndef SPILLWAY_API_MESSAGES_H
#define SPILLWAY_API_MESSAGES_H

#include "api/api.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* The request headers an Anthropic client sends beside its key. */
#define API_MSG_PATH "/v1/messages"
#define API_MSG_COUNT_PATH "/v1/messages/count_tokens"

/* The chat-completions body a Messages body asks for (a new object, the
 * caller's to json_decref): system, messages and their content blocks
 * (text, tool_use, tool_result, thinking), tools, tool_choice,
 * stop_sequences, max_tokens, temperature, top_p, top_k, stream,
 * thinking. count: a count_tokens body, where max_tokens is not asked
 * for. NULL with e set (400 invalid_request) when the body is refused
 * (docs/api.md says what is). */
json_t *api_msg_to_chat(json_t *body, bool count, api_error *e);

/* The Message for a chat.completion answer (a new object): content
 * blocks thinking, text and tool_use, stop_reason and stop_sequence,
 * usage, id msg_... NULL when memory ran out. */
json_t *api_msg_from_chat(json_t *chat);

/* Anthropic's error type for an HTTP status (invalid_request_error,
 * authentication_error, permission_error, not_found_error,
 * request_too_large, rate_limit_error, overloaded_error, api_error). */
const char *api_msg_error_type(int status);
/* {"type":"error","error":{"type":...,"message":...}} (a new object) for
 * an OpenAI-shaped error body {"error":{"message":...}} answered with
 * status; NULL when memory ran out. */
json_t *api_msg_error_from_chat(int status, json_t *openai_error);
/* The same for a message of our own. */
json_t *api_msg_error(int status, const char *message);

/* ---- streams --------------------------------------------------------------- */

/* A chat stream turned into a Messages stream: message_start, then each
 * content block opened, its deltas (thinking_delta, text_delta,
 * input_json_delta) and closed, then message_delta (stop_reason, usage)
 * and message_stop; an error event ends a stream that failed. Fed the
 * chat stream's data payloads one by one (duplicates of the role chunk,
 * as a resumed stream may send, change nothing). */
typedef struct api_msg_stream {
    char *out;  /* the Messages events produced by the last feed (sw_free'd
                   by api_msg_stream_free), out_len bytes */
    size_t out_len, out_cap;
    bool oom;   /* an allocation failed: some output was lost */
    bool started, ended;
    int open;   /* the kind of the open block: 0 none, 1 thinking, 2 text,
                   3 tool_use */
    int index;  /* the open block's index, or the next one's */
    long tool;  /* the chat tool call index of the open tool_use block */
    char id[96];
    char model[256];
    char finish[32];
    char *stop_sequence; /* the stop string that ended it (sw_free) */
    long long input_tokens, output_tokens;
} api_msg_stream;

/* model: the model to name until a chunk names one; input_tokens: the
 * prompt's count when known (else 0 until the usage chunk). */
void api_msg_stream_init(api_msg_stream *s, const char *model, long long input_tokens);
void api_msg_stream_free(api_msg_stream *s);
/* Feeds one chat stream payload (the text after "data: ": a chunk, an
 * {"error": ...} object, or "[DONE]"). The events to send are then in
 * s->out (s->out_len bytes, "event: ...\ndata: ...\n\n" each; may be
 * none). False when memory ran out (s->oom). */
bool api_msg_stream_feed(api_msg_stream *s, const char *payload, size_t len);
/* Ends a stream that will get no more payloads with an error event
 * (unless it ended already): into s->out. */
void api_msg_stream_fail(api_msg_stream *s, int status, const char *message);

#endif
