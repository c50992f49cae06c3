/* json_schema-impl.h - what the files of the schema compiler share: the
 * builder, the schema document, numeric bounds (json_schema.c compiles,
 * json_schema_nodes.c makes nodes, json_schema_doc.c indexes the document
 * and resolves $ref, json_schema_merge.c merges allOf and compares
 * numbers, json_schema_object.c compiles objects and arrays,
 * json_schema_combine.c not / anyOf / oneOf / if / dependencies,
 * json_schema_validate.c validates values, json_schema_meta.c holds the
 * built-in metaschemas). Only those files include it.
 */
#ifndef SPILLWAY_ENGINE_JSON_SCHEMA_IMPL_H
#define SPILLWAY_ENGINE_JSON_SCHEMA_IMPL_H

#include "grammar/constrain-impl.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sc_doc;

typedef struct builder {
    eng_grammar *g;
    sw_error *err;
    /* anyOf directly inside anyOf, per stack frame: an alternative that is
     * an object or an array starts a frame of its own (recursion through
     * Optional[Self] nests frames, not anyOfs) */
    int32_t anyof_nesting[ENG_CS_MAX_DEPTH + 1];
    char path[256];
    struct sc_doc *doc;                   /* the schema's identifiers and merged schemas */
    const char *base;                     /* where the current schema's $ref resolve */
    int32_t chain[ENG_CS_MAX_DEPTH + 1];  /* $ref / allOf followed at each frame depth */
    int64_t steps;                        /* compile calls: bounded */
    int64_t neg_work;                     /* merging to compile 'not': bounded */
    json_t *memo;                         /* "%p/depth" of a schema -> its node */
} builder;

/* Work bounds on hostile documents: schema objects indexed, compile calls
 * made, nodes made. Past them: SW_EUNSUPPORTED, never a hang. */
#define SC_MAX_INDEXED 200000
#define SC_MAX_COMPILE_STEPS 400000
#define SC_MAX_NODES 100000
/* Work merging schemas to write "not S" as positive ones: each merge
 * counts 1 and the properties it merges (a merge, with what the
 * document's arena keeps of it, costs about a microsecond and 100 bytes
 * per property; a oneOf of n overlapping alternatives needs n products of
 * n - 1 negations). Past it no more ways of failing are generated (a
 * narrowing): about 0.1 s and 30 MB at most. */
#define SC_MAX_NEG_WORK 50000
/* $ref followed one after another without a value in between ({"$ref":
 * "#"} points at itself). */
#define SC_MAX_REF_CHAIN 32
#define SC_URI_MAX 1024
#define SC_DEFAULT_BASE "urn:spillway:schema"

typedef enum sc_dialect { SC_2020 = 0, SC_DRAFT7 = 1, SC_DRAFT4 = 2 } sc_dialect;

typedef struct sc_doc {
    const json_t *root;
    sc_dialect dialect;
    json_t *ids;    /* absolute URI (no fragment, or #anchor) -> schema (a reference) */
    json_t *bases;  /* "%p" of a schema object -> its base URI (string) */
    json_t *arena;  /* schemas made while merging: alive until the document is freed */
    int64_t indexed;
} sc_doc;

static const char *const known_formats[] = {
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
    "json-pointer", "relative-json-pointer", "regex",
};

#define IN_LIST(k, list) eng__sc_in_list((k), (list), sizeof(list) / sizeof *(list))

enum {
    T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32,
    T_NULL = 64, T_ALL = 127
};

/* A lower or upper numeric bound of a schema, draft 4's boolean
 * exclusiveMinimum / exclusiveMaximum included. */
typedef struct num_bound {
    const json_t *v; /* NULL: none */
    bool excl;
} num_bound;

typedef struct dec {
    bool neg;
    char mag[ENG_CS_MAX_BIG_DIGITS + 8]; /* digits, no leading zeros; "0" for zero (never
                                            negative) */
} dec;

static const char *const min_keys[] = {"minLength", "minItems", "minProperties", "minContains"};
static const char *const max_keys[] = {"maxLength", "maxItems", "maxProperties", "maxContains"};
static const char *const bound_keys[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};

/* A schema no value of which is generated: false, a value nested deeper
 * than the automaton's stack (recursive schemas), an empty intersection.
 * Containers drop an optional property or item of it; a required one
 * makes the container CS_NEVER too. Never a node index. */
#define CS_NEVER (-2)

/* What a "not" asks, where it can be enforced: types to leave out, a
 * property to leave out, or literal values to filter (the validator does
 * that when the value set is finite). */
typedef struct not_info {
    int types_out;
    int types_only;     /* the value must have one of these types */
    const char *forbid; /* a property never generated */
    bool filter;        /* const / enum inside: only a finite value set can honour it */
} not_info;

/* ---- shared between the files ---------------------------------------- */

size_t eng__sc_pointer_push(char *path, size_t cap, size_t len, const char *seg);
size_t eng__sc_path_push(builder *b, size_t len, const char *seg);
size_t eng__sc_path_push_index(builder *b, size_t len, size_t i);
int eng__sc_fail_at(builder *b, size_t len, int code, const char *what);
char *eng__sc_dump_value(const json_t *v, int32_t *len_out);
bool eng__sc_only_annotations(const json_t *s, const char *except);
int eng__sc_effective(sc_doc *d, const json_t *s, const char *base, const json_t **out,
                      sw_error *err);
int eng__sc_oom(builder *b);
int eng__sc_get_count(builder *b, const json_t *s, const char *key, size_t plen, int32_t dflt,
                      int32_t *out);
int eng__sc_string_automaton(const json_t *s, eng_regex **re, int32_t *max_chars, const char **key,
                             sw_error *err);
int eng__sc_compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
int eng__sc_make_pattern(builder *b, eng_regex *re, int32_t lo, int32_t hi, size_t plen,
                         const char *key, int32_t *out);
int32_t eng__sc_len_add(int64_t a, int64_t b);
void eng__sc_node_clear(cs_node *n);
eng_grammar *eng__sc_grammar_new(void);
int32_t eng__sc_add_node(eng_grammar *g, cs_node *n);
int32_t eng__sc_make_literals(eng_grammar *g, const json_t *const *vals, size_t n);
int32_t eng__sc_make_string(eng_grammar *g, int32_t min_chars, int32_t max_chars);
int32_t eng__sc_make_anyof(eng_grammar *g, const int32_t *alts, int32_t n);
int32_t eng__sc_make_bool(eng_grammar *g);
int32_t eng__sc_make_any(eng_grammar *g, int32_t levels);
int32_t eng__sc_make_any_object(eng_grammar *g, int32_t levels);
int32_t eng__sc_any_levels(int32_t depth);
void eng__sc_ptr_key(const json_t *s, char *key, size_t cap);
const char *eng__sc_doc_base_of(const sc_doc *d, const json_t *s);
void eng__sc_doc_free(sc_doc *d);
int eng__sc_doc_init(sc_doc *d, const json_t *root, sw_error *err);
json_t *eng__sc_doc_keep(sc_doc *d, json_t *s);
/* The JSON text of the built-in metaschema a URI (no fragment) names, or
 * NULL (json_schema_meta.c). */
const char *eng__sc_builtin_metaschema(const char *uri);
int eng__sc_doc_resolve(const sc_doc *d, const char *base, const char *ref, const json_t **out,
                        sw_error *err);
bool eng__sc_in_list(const char *k, const char *const *list, size_t n);
bool eng__sc_is_known_keyword(const char *k);
int eng__sc_type_mask(const json_t *type);
bool eng__sc_val_equal(const json_t *a, const json_t *b);
bool eng__sc_is_num(const json_t *v);
bool eng__sc_big_ok(const json_t *v);
double eng__sc_num_double(const json_t *v);
void eng__sc_dec_round(const json_t *v, bool down, dec *out);
bool eng__sc_num_whole(const json_t *v);
void eng__sc_dec_negate(dec *x);
void eng__sc_dec_step(dec *x, int delta);
int eng__sc_dec_cmp(const dec *a, const dec *b);
int eng__sc_num_cmp(const json_t *a, const json_t *b);
num_bound eng__sc_bound_get(const json_t *s, bool lower);
int eng__sc_pattern_match_name(const char *pattern, const char *name, sw_error *err);
int eng__sc_prop_schema(const json_t *s, const char *name, json_t **out, sw_error *err);
char *eng__sc_pattern_prefix_form(const json_t *p);
int eng__sc_merge2(const json_t *a, const json_t *b, json_t **out, sw_error *err);
int eng__sc_compile_literals(builder *b, const json_t *s, size_t plen, int32_t *out);
int eng__sc_compile_object(builder *b, const json_t *s, const char *forbid, int32_t depth,
                           size_t plen, int32_t *out);
int eng__sc_compile_array(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
int eng__sc_analyze_not(builder *b, const json_t *n, size_t plen, not_info *ni, int nest);
int eng__sc_compile_anyof(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
int eng__sc_compile_dependent(builder *b, const json_t *s, int32_t depth, size_t plen,
                              int32_t *out);
int eng__sc_compile_not(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
int eng__sc_compile_if(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
json_t *eng__sc_negate_simple(const json_t *n);
int eng__sc_val_judge(const sc_doc *d, const json_t *schema, const json_t *value, sw_error *err);

#endif
