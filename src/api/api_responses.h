/* api_responses.h - OpenAI's Responses API (POST /v1/responses) as a
 * translation to and from chat completions, shared by the worker and the
 * router.
 *
 * A Responses body becomes the chat-completions body the engine already
 * serves (api_responses_chat); the chat answer becomes a Response object
 * (api_responses_from_chat), and a chat stream, chunk by chunk, becomes
 * the Responses stream's typed events (api_resp_stream). Where the
 * translation happens is the caller's choice: the worker translates at its
 * HTTP edge, the router at its sink, so the chat stream between router and
 * workers (failover, resume) is the same for both protocols.
 *
 * What a Response keeps of its request (instructions, tools, ...) is
 * echoed from the request body the caller passes; strings and objects are
 * copied, so the body may be freed after each call.
 */
#ifndef SPILLWAY_API_RESPONSES_H
#define SPILLWAY_API_RESPONSES_H

#include "api/api.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The chat-completions body of a Responses request: prior (NULL or an
 * array) are the items of earlier turns (previous_response_id: its input
 * and output items), put before the body's input. A new reference, or
 * NULL with e filled (400 and the parameter for anything refused; 500 on
 * an allocation lost). previous_response_id, store and background are
 * the caller's and are not read here. */
json_t *api_responses_chat(const json_t *body, const json_t *prior, api_error *e);

/* The body's input as a list of items (a string becomes one user
 * message): what a stored response keeps of its input. A new reference,
 * NULL when out of memory. Call only on a body api_responses_chat took. */
json_t *api_responses_input_items(const json_t *body);

/* A Response object in the given status ("in_progress", "queued", ...),
 * echoing body's settings, with an empty output and null usage. model
 * NULL: the body's. A new reference (NULL when out of memory). */
json_t *api_responses_object(const json_t *body, const char *id, int64_t created_at,
                             const char *status, const char *model);

/* The Response of a whole chat completion (chat: its JSON answer): output
 * items (reasoning, message, function calls), status completed, or
 * incomplete (max_output_tokens) when the chat answer ran out of tokens,
 * and usage. A new reference; NULL when out of memory. */
json_t *api_responses_from_chat(const json_t *body, const char *id, int64_t created_at,
                                const json_t *chat);

/* A chat stream translated as it comes. Each call returns the SSE text to
 * send for what was fed ("event: TYPE\ndata: JSON\n\n" per event, "" when
 * nothing is due; sw_free), or NULL when memory ran out (the stream is
 * then ended by the caller, with api_resp_stream_fail). */
typedef struct api_resp_stream api_resp_stream;

/* body is copied; NULL when out of memory. */
api_resp_stream *api_resp_stream_new(const json_t *body, const char *id, int64_t created_at);
void api_resp_stream_free(api_resp_stream *s);
/* One chat chunk (chat.completion.chunk), or an error object
 * ({"error": ...}), which ends the response as failed. */
char *api_resp_stream_chunk(api_resp_stream *s, const json_t *chunk);
/* The chat stream's end ([DONE]): the open item is closed and the
 * response completes (or is incomplete: the chat stream finished for
 * length). "" once the response has ended. */
char *api_resp_stream_end(api_resp_stream *s);
/* Ends the response as failed with this error (code, message) unless it
 * has ended; "" once it has. */
char *api_resp_stream_fail(api_resp_stream *s, const char *code, const char *message);
/* The text the last call returned did not reach the client (nothing of
 * it was sent): the events after are numbered from where the client is,
 * and a final event in it is as if never made (api_resp_stream_fail
 * then ends the stream). */
void api_resp_stream_lost(api_resp_stream *s);
/* The response as it stands (the final one once ended); borrowed. */
const json_t *api_resp_stream_response(const api_resp_stream *s);
/* Whether the stream has sent its final event. */
bool api_resp_stream_ended(const api_resp_stream *s);

/* The Responses parameter a chat body's parameter stands for, to name in
 * an error the chat route gave (max_tokens: max_output_tokens,
 * response_format...: text.format, messages...: input, stream_options:
 * stream); param itself when it is the same. */
const char *api_responses_param(const char *param);

/* An item id: prefix ("msg", "fc", "rs"), the response id's part after
 * "resp_", and the output index: the same for the same response and
 * position, in a whole answer and in a stream alike. */
void api_responses_item_id(char *out, size_t cap, const char *prefix, const char *resp_id,
                           size_t index);

#endif
