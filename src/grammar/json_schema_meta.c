/* json_schema_meta.c - the built-in metaschemas: the documents that the
 * well-known URIs of draft 7 and 2020-12 name, so that a schema such as
 * {"$ref": "https://json-schema.org/draft/2020-12/schema"} (a request for
 * a JSON schema) resolves without fetching anything.
 *
 * They are written here, not copied: each encodes the metaschema's
 * structure as the compiler and the validator can use it. A schema is an
 * object or a boolean; each known keyword's value has its type (type: a
 * type name or an array of unique names; properties, $defs, definitions:
 * objects of schemas; required: an array of unique strings; minLength and
 * the other counts: non-negative integers; ...); other keys are free.
 * Differences from the published documents, all on the side of accepting
 * what they accept unless the compiler cannot enforce it (a narrowing,
 * listed in docs/internals/grammar.md):
 *   - "format" is kept where the compiler enforces it (uri on $schema,
 *     uri-reference on $id, $ref, ...): the published documents only
 *     annotate with it, but checkers with format assertions on (ours, the
 *     router's) would call a generated "$ref": "a b" invalid, so a string
 *     that is not a URI is never generated (a narrowing); "regex" has no
 *     automaton: see META_REGEX;
 *   - 2020-12's "$dynamicRef": "#meta" is "$ref": "#": for a schema with
 *     no extension of the metaschema it names the root metaschema, which
 *     is the only meaning a request can have here (nothing is fetched);
 *   - 2020-12's vocabularies (meta/core, meta/applicator, ...) are merged
 *     into one "properties" (their keywords do not overlap), so the
 *     document needs no allOf of remote parts;
 *   - no $ref stands beside other keywords and "items" is always a
 *     schema, so the documents mean the same in every dialect (the
 *     document that holds the reference sets the dialect).
 * The order of "properties" is the order a generated schema writes its
 * keywords in (the automaton writes declared properties in order); it
 * follows what schemas usually start with.
 */
#include "grammar/json_schema-impl.h"

#include <string.h>

#define META_COUNT_KEYS(ref)                                                                   \
    "\"maxLength\":{\"$ref\":\"" ref "\"},\"minLength\":{\"$ref\":\"" ref "\"},"               \
    "\"maxItems\":{\"$ref\":\"" ref "\"},\"minItems\":{\"$ref\":\"" ref "\"},"                 \
    "\"maxProperties\":{\"$ref\":\"" ref "\"},\"minProperties\":{\"$ref\":\"" ref "\"},"

#define META_NUMBER_KEYS                                                                       \
    "\"multipleOf\":{\"type\":\"number\",\"exclusiveMinimum\":0},"                             \
    "\"minimum\":{\"type\":\"number\"},\"maximum\":{\"type\":\"number\"},"                     \
    "\"exclusiveMinimum\":{\"type\":\"number\"},\"exclusiveMaximum\":{\"type\":\"number\"},"

/* A regular expression (format "regex" in the published documents, which
 * the checkers assert): only literal text, optionally anchored, is
 * generated or accepted, since ECMA-262 syntax is not a regular language
 * (a narrowing). */
#define META_REGEX "{\"type\":\"string\",\"pattern\":\"^\\\\^?[-A-Za-z0-9 _:/.@]*\\\\$?$\"}"

#define META_SCHEMA_MAP "{\"type\":\"object\",\"additionalProperties\":{\"$ref\":\"#\"}}"

/* draft 7 (http://json-schema.org/draft-07/schema#) */
static const char draft7_text[] =
    "{\"type\":[\"object\",\"boolean\"],"
    "\"definitions\":{"
    "\"schemaArray\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"$ref\":\"#\"}},"
    "\"nonNegativeInteger\":{\"type\":\"integer\",\"minimum\":0},"
    "\"simpleTypes\":{\"enum\":[\"array\",\"boolean\",\"integer\",\"null\",\"number\","
    "\"object\",\"string\"]},"
    "\"stringArray\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}},"
    "\"properties\":{"
    "\"$schema\":{\"type\":\"string\",\"format\":\"uri\"},"
    "\"$id\":{\"type\":\"string\",\"format\":\"uri-reference\"},"
    "\"$ref\":{\"type\":\"string\",\"format\":\"uri-reference\"},"
    "\"$comment\":{\"type\":\"string\"},"
    "\"title\":{\"type\":\"string\"},\"description\":{\"type\":\"string\"},"
    "\"type\":{\"anyOf\":[{\"$ref\":\"#/definitions/simpleTypes\"},{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/definitions/simpleTypes\"},\"minItems\":1,\"uniqueItems\":true}]},"
    "\"properties\":" META_SCHEMA_MAP ","
    "\"required\":{\"$ref\":\"#/definitions/stringArray\"},"
    "\"additionalProperties\":{\"$ref\":\"#\"},"
    "\"patternProperties\":{\"type\":\"object\",\"propertyNames\":" META_REGEX ","
    "\"additionalProperties\":{\"$ref\":\"#\"}},"
    "\"propertyNames\":{\"$ref\":\"#\"},"
    "\"dependencies\":{\"type\":\"object\",\"additionalProperties\":{\"anyOf\":["
    "{\"$ref\":\"#\"},{\"$ref\":\"#/definitions/stringArray\"}]}},"
    "\"items\":{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#/definitions/schemaArray\"}]},"
    "\"additionalItems\":{\"$ref\":\"#\"},"
    "\"contains\":{\"$ref\":\"#\"},"
    "\"uniqueItems\":{\"type\":\"boolean\"},"
    "\"enum\":{\"type\":\"array\"},\"const\":true,"
    META_COUNT_KEYS("#/definitions/nonNegativeInteger")
    META_NUMBER_KEYS
    "\"pattern\":" META_REGEX ",\"format\":{\"type\":\"string\"},"
    "\"contentMediaType\":{\"type\":\"string\"},\"contentEncoding\":{\"type\":\"string\"},"
    "\"allOf\":{\"$ref\":\"#/definitions/schemaArray\"},"
    "\"anyOf\":{\"$ref\":\"#/definitions/schemaArray\"},"
    "\"oneOf\":{\"$ref\":\"#/definitions/schemaArray\"},"
    "\"not\":{\"$ref\":\"#\"},"
    "\"if\":{\"$ref\":\"#\"},\"then\":{\"$ref\":\"#\"},\"else\":{\"$ref\":\"#\"},"
    "\"definitions\":" META_SCHEMA_MAP ","
    "\"default\":true,\"readOnly\":{\"type\":\"boolean\"},"
    "\"examples\":{\"type\":\"array\"}}}";

/* 2020-12 (https://json-schema.org/draft/2020-12/schema), its seven
 * vocabularies merged, with the keywords of earlier drafts it keeps
 * (definitions, dependencies, $recursiveAnchor, $recursiveRef) */
static const char draft2020_text[] =
    "{\"type\":[\"object\",\"boolean\"],"
    "\"$defs\":{"
    "\"schemaArray\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"$ref\":\"#\"}},"
    "\"nonNegativeInteger\":{\"type\":\"integer\",\"minimum\":0},"
    "\"simpleTypes\":{\"enum\":[\"array\",\"boolean\",\"integer\",\"null\",\"number\","
    "\"object\",\"string\"]},"
    "\"stringArray\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true},"
    "\"anchorString\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z_][-A-Za-z0-9._]*$\"}},"
    "\"properties\":{"
    "\"$schema\":{\"type\":\"string\",\"format\":\"uri\"},"
    "\"$id\":{\"type\":\"string\",\"format\":\"uri-reference\",\"pattern\":\"^[^#]*#?$\"},"
    "\"$ref\":{\"type\":\"string\",\"format\":\"uri-reference\"},"
    "\"$comment\":{\"type\":\"string\"},"
    "\"title\":{\"type\":\"string\"},\"description\":{\"type\":\"string\"},"
    "\"type\":{\"anyOf\":[{\"$ref\":\"#/$defs/simpleTypes\"},{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/simpleTypes\"},\"minItems\":1,\"uniqueItems\":true}]},"
    "\"properties\":" META_SCHEMA_MAP ","
    "\"required\":{\"$ref\":\"#/$defs/stringArray\"},"
    "\"additionalProperties\":{\"$ref\":\"#\"},"
    "\"patternProperties\":{\"type\":\"object\",\"propertyNames\":" META_REGEX ","
    "\"additionalProperties\":{\"$ref\":\"#\"}},"
    "\"propertyNames\":{\"$ref\":\"#\"},"
    "\"dependentRequired\":{\"type\":\"object\",\"additionalProperties\":"
    "{\"$ref\":\"#/$defs/stringArray\"}},"
    "\"dependentSchemas\":" META_SCHEMA_MAP ","
    "\"prefixItems\":{\"$ref\":\"#/$defs/schemaArray\"},"
    "\"items\":{\"$ref\":\"#\"},"
    "\"contains\":{\"$ref\":\"#\"},"
    "\"uniqueItems\":{\"type\":\"boolean\"},"
    "\"enum\":{\"type\":\"array\"},\"const\":true,"
    META_COUNT_KEYS("#/$defs/nonNegativeInteger")
    "\"maxContains\":{\"$ref\":\"#/$defs/nonNegativeInteger\"},"
    "\"minContains\":{\"$ref\":\"#/$defs/nonNegativeInteger\"},"
    META_NUMBER_KEYS
    "\"pattern\":" META_REGEX ",\"format\":{\"type\":\"string\"},"
    "\"allOf\":{\"$ref\":\"#/$defs/schemaArray\"},"
    "\"anyOf\":{\"$ref\":\"#/$defs/schemaArray\"},"
    "\"oneOf\":{\"$ref\":\"#/$defs/schemaArray\"},"
    "\"not\":{\"$ref\":\"#\"},"
    "\"if\":{\"$ref\":\"#\"},\"then\":{\"$ref\":\"#\"},\"else\":{\"$ref\":\"#\"},"
    "\"$defs\":" META_SCHEMA_MAP ","
    "\"$anchor\":{\"$ref\":\"#/$defs/anchorString\"},"
    "\"$dynamicRef\":{\"type\":\"string\",\"format\":\"uri-reference\"},"
    "\"$dynamicAnchor\":{\"$ref\":\"#/$defs/anchorString\"},"
    "\"$vocabulary\":{\"type\":\"object\","
    "\"propertyNames\":{\"type\":\"string\",\"format\":\"uri\"},"
    "\"additionalProperties\":{\"type\":\"boolean\"}},"
    "\"unevaluatedItems\":{\"$ref\":\"#\"},\"unevaluatedProperties\":{\"$ref\":\"#\"},"
    "\"contentEncoding\":{\"type\":\"string\"},\"contentMediaType\":{\"type\":\"string\"},"
    "\"contentSchema\":{\"$ref\":\"#\"},"
    "\"default\":true,\"deprecated\":{\"type\":\"boolean\"},"
    "\"readOnly\":{\"type\":\"boolean\"},\"writeOnly\":{\"type\":\"boolean\"},"
    "\"examples\":{\"type\":\"array\"},"
    "\"definitions\":" META_SCHEMA_MAP ","
    "\"dependencies\":{\"type\":\"object\",\"additionalProperties\":{\"anyOf\":["
    "{\"$ref\":\"#\"},{\"$ref\":\"#/$defs/stringArray\"}]}},"
    "\"$recursiveAnchor\":{\"$ref\":\"#/$defs/anchorString\"},"
    "\"$recursiveRef\":{\"type\":\"string\",\"format\":\"uri-reference\"}}}";

/* A URI as the built-in table knows it: the scheme's "s" is optional
 * (both are in use), and so is a trailing '#' (stripped before this). */
static bool uri_same(const char *uri, const char *https_form)
{
    if (strncmp(uri, "http://", 7) == 0 && strncmp(https_form, "https://", 8) == 0)
        return strcmp(uri + 7, https_form + 8) == 0;
    return strcmp(uri, https_form) == 0;
}

const char *eng__sc_builtin_metaschema(const char *uri)
{
    if (uri_same(uri, "https://json-schema.org/draft-07/schema"))
        return draft7_text;
    if (uri_same(uri, "https://json-schema.org/draft/2020-12/schema"))
        return draft2020_text;
    return NULL;
}
