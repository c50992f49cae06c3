/* json_big.h - request bodies with numbers jansson cannot hold exactly.
 *
 * jansson refuses an integer outside int64 and a real beyond a double's
 * range (json_error_numeric_overflow). A JSON schema may still write one
 * (an enum of 128-bit ids, a maximum of 10^23), and the schema compiler
 * handles such a bound exactly as decimal text. So a body is loaded with
 * sw_json_loadb_big: each such number literal becomes a marker string,
 * NUL + a per-process random tag + '#' + the literal's text, and
 * sw_json_big_text gives the text back. A client cannot write a marker
 * (it does not know the tag), so a marker is always a number of the body.
 *
 * Where a body's number must fit (max_tokens, seed, ...), a marker is a
 * string and the field's type check refuses it; the worker names such a
 * field with a typed 400 first (worker_request.c). sw_json_dumps writes
 * every marker back as its number, so a body re-serialized (the router's
 * resume, a tool definition in the prompt) keeps the client's text.
 */
#ifndef SPILLWAY_COMMON_JSON_BIG_H
#define SPILLWAY_COMMON_JSON_BIG_H

#include <stdbool.h>
#include <stddef.h>

struct json_t;
struct json_error_t;

/* sw_json_loadb, with numbers past jansson's range kept as markers. */
struct json_t *sw_json_loadb_big(const char *buffer, size_t len, size_t flags,
                                 struct json_error_t *error);

/* The number text of a marker (NUL-terminated, e.g. "-123456789012345678901"),
 * or NULL when v is not one. */
const char *sw_json_big_text(const struct json_t *v);

/* The top-level field of a request body with a marker outside the JSON
 * schemas (response_format.json_schema.schema, tools[].function.parameters),
 * or NULL: such a number is a typed 400 naming the field. */
const char *sw_json_big_field(const struct json_t *body);

/* In a dump of JSON (sw_json_dumps calls it): every marker written back as
 * its number, in place; the new length. */
size_t sw__json_big_restore(char *text, size_t len);

#endif
