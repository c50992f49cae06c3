/* responses_check.h - what the Responses API tests check of a stream
 * (POST /v1/responses with "stream": true), on the worker and through the
 * router: the SSE framing with event lines, and the events' order and
 * agreement, read from the wire independently of the code that makes
 * them.
 */
#ifndef SPILLWAY_TESTS_RESPONSES_CHECK_H
#define SPILLWAY_TESTS_RESPONSES_CHECK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct rc_stream {
    json_t *response;  /* the final event's response (json_decref) */
    char final_type[64];
    char text[8192];      /* the message items' text, in order */
    char reasoning[8192]; /* the reasoning items' text */
    int n_events;
    int n_items;
} rc_stream;

/* Fails the test unless body is one well-formed Responses stream: every
 * event exactly "event: TYPE\ndata: JSON\n\n" with the data's type TYPE
 * and sequence_number 0, 1, 2, ...; response.created first and once,
 * response.in_progress next; each output item added once, at the next
 * output index, and done once, nothing of it after its done; every
 * item's deltas adding up to its done text (content part, text, item);
 * one final event (response.completed, .incomplete or .failed), last,
 * whose output is exactly the items done. */
void rc_stream_check(const char *body, rc_stream *out);
void rc_stream_free(rc_stream *s);
/* The message text of a whole Response (its output_text parts, in
 * order), into out. */
void rc_response_text(const json_t *response, char *out, size_t cap);
/* Whether two Responses' usage counts the same tokens (input, output,
 * total; the cached prompt tokens may differ: they depend on what the
 * worker ran before). */
bool rc_usage_same(const json_t *a, const json_t *b);

#endif
