/* json_schema.h - JSON Schema (a practical subset) compiled into a grammar
 * that constrain.h turns into per-token masks.
 *
 * Why: a forced tool call or a `response_format` of type json_schema must
 * produce JSON that parses and validates whatever the model is, tiny random
 * test models included. The grammar describes the exact compact text
 * (no whitespace outside strings) that may be generated.
 *
 * The rule: a keyword is enforced, or the schema is refused with a typed
 * error naming it; a generated value never violates the schema. Unknown
 * keywords are annotations (ignored). docs/api.md lists what is enforced
 * and the deliberate narrowings (valid values never generated: additional
 * properties, another key order, exponents, \u escapes, ...); in short:
 * type, enum/const, properties/required/additionalProperties,
 * patternProperties, propertyNames, min/maxProperties, dependencies,
 * items/prefixItems/additionalItems, min/maxItems, contains, uniqueItems,
 * min/maxLength, pattern/format (regex.h), numeric bounds of any size and
 * simple multipleOf, $ref into the document ($defs, definitions, any JSON
 * pointer, $id/id bases, $anchor; recursion up to the automaton's depth),
 * allOf (merged), anyOf/oneOf (with siblings distributed; oneOf only when
 * the alternatives cannot overlap), not (type, const, enum, required),
 * if/then/else. The dialect (2020-12, draft 7, draft 4) comes from
 * $schema. The metaschemas of draft 7 and 2020-12 are built in
 * (json_schema_meta.c). Remote $ref, unevaluated*, $dynamicRef and what
 * cannot be enforced are SW_EUNSUPPORTED with a message naming the keyword and where
 * it is (a JSON pointer into the schema). Compiling is bounded in nodes
 * and steps.
 */
#ifndef SPILLWAY_GRAMMAR_JSON_SCHEMA_H
#define SPILLWAY_GRAMMAR_JSON_SCHEMA_H

#include "common/error.h"

#include <stddef.h>
#include <stdint.h>

struct json_t;

typedef struct eng_grammar eng_grammar; /* immutable once built; any thread may read it */

/* Compiles a schema (a JSON object, or true). Errors: SW_EUNSUPPORTED (a
 * keyword or construct outside the subset), SW_EINVAL (a malformed schema:
 * wrong keyword types, minLength > maxLength, an empty enum, ...),
 * SW_ERANGE (a pattern whose automaton is past ENG_REGEX_MAX_STATES,
 * regex.h), SW_ENOMEM. The message names the keyword and its JSON
 * pointer. */
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

/* The grammar as GBNF text (*out, sw_free): exactly the text the
 * constraint automaton lets through (json_schema_gbnf.c), for an engine
 * that takes GBNF (llama-server's `grammar`). SW_EUNSUPPORTED for what has
 * no GBNF form here (numbers with a multiple or bounds over 40 digits,
 * counts over 10000, a pattern past the work bound, a grammar compiled
 * from GBNF), naming it;
 * SW_ERANGE when the text would pass ENG_GBNF_MAX_BYTES (1 MiB, what
 * gbnf.h's parser takes, so the form can always be advanced); SW_ENOMEM. */
int eng_grammar_to_gbnf(const eng_grammar *g, char **out, sw_error *err);

/* Checks a parsed value against a schema with JSON Schema's exact meaning,
 * not the grammar's (any property order; additional properties; a keyword
 * constrains only values of its type; integers may be written 1.0;
 * numbers of any size; oneOf as exactly one; not, if/then/else, contains,
 * uniqueItems, dependencies, propertyNames, prefixItems too). Every value
 * the grammar generates passes. For values that did not come from the
 * grammar: the router checks a model's tool-call arguments with it; the
 * compiler filters enum values through it.
 * SW_OK: valid. SW_EINVAL: not valid, the message says why and where (a
 * JSON pointer into the value, "#/items/2"). SW_EUNSUPPORTED: the schema
 * is malformed or uses what cannot be judged (known formats, unevaluated*,
 * $dynamicRef, a remote $ref); the value was not judged. */
int eng_json_validate(const struct json_t *schema, const struct json_t *value, sw_error *err);

/* Bytes of the shortest text the grammar accepts. */
int64_t eng_grammar_min_bytes(const eng_grammar *g);

#endif
