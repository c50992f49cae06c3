/* json_schema.h - JSON Schema (a practical subset) compiled into a grammar
 * that constrain.h turns into per-token masks.
 *
 * Why: a forced tool call or a `response_format` of type json_schema must
 * produce JSON that parses and validates whatever the model is, tiny random
 * test models included. The grammar describes the exact compact text
 * (no whitespace outside strings) that may be generated.
 *
 * Supported (docs/internals/engine.md, "Constrained decoding", has the
 * details):
 *   type: object (properties, required; properties are generated in their
 *         declared order and optional ones may be skipped; no properties:
 *         any object, or {} with additionalProperties false / a schema),
 *         string (minLength, maxLength; escapes \" \\ \/ \b \f \n \r \t,
 *         never \u), number (up to 15 integer and 6 fraction digits, no
 *         exponent), integer (up to 15 digits), boolean, null, array
 *         (items, minItems, maxItems), a list of types (any of them);
 *   enum (any JSON values), const, anyOf and oneOf (oneOf is generated as
 *         anyOf: alternatives that overlap can yield a value matching
 *         several; anyOf inside anyOf up to 8 deep, at most 64 branches
 *         per value), nesting up to ENG_CS_MAX_DEPTH frames;
 *   no type, no enum/const/anyOf: any JSON value (nesting bounded).
 * Ignored, because ignoring them cannot produce an invalid value:
 *   description, title, default, examples, $schema, $id, $comment,
 *   deprecated, readOnly, writeOnly, nullable, additionalProperties (only
 *   declared properties are generated), uniqueItems false.
 * Anything else (pattern, format, minimum, $ref, allOf, ...) is refused
 * with SW_EUNSUPPORTED and a message naming the keyword and where it is
 * (a JSON pointer into the schema).
 */
#ifndef SPILLWAY_ENGINE_JSON_SCHEMA_H
#define SPILLWAY_ENGINE_JSON_SCHEMA_H

#include "common/error.h"

#include <stddef.h>
#include <stdint.h>

struct json_t;

typedef struct eng_grammar eng_grammar; /* immutable once built; any thread may read it */

/* Compiles a schema (a JSON object, or true). Errors: SW_EUNSUPPORTED (a
 * keyword or construct outside the subset), SW_EINVAL (a malformed schema:
 * wrong keyword types, minLength > maxLength, an empty enum, ...),
 * SW_ENOMEM. The message names the keyword and its JSON pointer. */
int eng_grammar_from_schema(const struct json_t *schema, eng_grammar **out, sw_error *err);

/* Any JSON object (response_format "json_object"), nesting bounded by
 * ENG_CS_ANY_DEPTH. */
int eng_grammar_json_object(eng_grammar **out, sw_error *err);

/* A tool call: the object {"name":<one of the names>,"arguments":<that
 * tool's parameters>} (compact, in that order). parameters may be NULL
 * (no parameters: any object). With one tool the name is fixed. */
typedef struct eng_grammar_tool {
    const char *name;
    const struct json_t *parameters;
} eng_grammar_tool;

int eng_grammar_tool_call(const eng_grammar_tool *tools, size_t n_tools, eng_grammar **out,
                          sw_error *err);

void eng_grammar_free(eng_grammar *g);

/* Checks a parsed value against a schema of the subset above with JSON
 * Schema's meaning, not the grammar's (any property order; additional
 * properties allowed unless additionalProperties is false or a schema,
 * which is then applied; a keyword constrains only values of its type;
 * integers may be written 1.0; numbers of any size; oneOf checked as
 * anyOf, as it is generated). For values that did not come from the
 * grammar: the router checks a model's tool-call arguments with it.
 * SW_OK: valid. SW_EINVAL: not valid, the message says why and where (a
 * JSON pointer into the value, "#/items/2"). SW_EUNSUPPORTED: the schema
 * is malformed or outside the subset, the value was not judged. */
int eng_json_validate(const struct json_t *schema, const struct json_t *value, sw_error *err);

/* Bytes of the shortest text the grammar accepts. */
int64_t eng_grammar_min_bytes(const eng_grammar *g);

#endif
