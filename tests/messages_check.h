/* messages_check.h - what the Messages API tests read on the wire: a
 * strict reader of Anthropic's event stream that checks its grammar and
 * rebuilds the Message it tells.
 *
 * Independent of the server's code on purpose (it reads bytes, as a
 * client does), so a stream the SDKs would choke on fails the tests.
 */
#ifndef SPILLWAY_TESTS_MESSAGES_CHECK_H
#define SPILLWAY_TESTS_MESSAGES_CHECK_H

#include <jansson.h>
#include <stddef.h>

/* The Message a Messages stream tells (a new object: id, model, content
 * blocks with their text, thinking and tool_use input joined and parsed,
 * stop_reason, stop_sequence, usage), after checking every rule: each
 * event "event: NAME\ndata: JSON\n\n" with JSON's type NAME (ping
 * allowed); one message_start, first; each block opened with the next
 * index, its deltas of its own kind, closed once before the next opens;
 * one message_delta after the last block closed; message_stop last. A
 * stream that ends with an error event gives that event's data instead
 * ({"type":"error",...}). NULL with the broken rule in why. */
json_t *mc_stream_message(const char *body, size_t len, char *why, size_t why_cap);

/* The text of a Message's blocks of the given type ("text", "thinking"),
 * joined (a new string, sw_free). */
char *mc_blocks_text(json_t *message, const char *type);

#endif
