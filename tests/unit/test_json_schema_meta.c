/* test_json_schema_meta.c - the built-in metaschemas (json_schema_meta.c):
 * {"$ref": "https://json-schema.org/draft/2020-12/schema"} and draft 7's
 * "http://json-schema.org/draft-07/schema#" compiled into the automaton.
 *
 * The suite's own schemas (../shared/jsonschema-test-suite) are
 * metaschema-valid instances: every group schema of every keyword file is
 * fed through the compiled metaschema, its keys written in the order the
 * automaton writes them (the built-in's "properties" order; the key order
 * is a narrowing of every object with declared properties). Each must be
 * accepted, except where it meets a documented narrowing, which the test
 * names per schema and counts:
 *   - a keyword the metaschema does not declare (a free key beside
 *     declared properties is never generated);
 *   - an array with uniqueItems (type, required, dependentRequired) of more
 *     than one item (uniqueItems: at most one item is generated);
 *   - what the built-in document itself narrows (a pattern that is not
 *     literal text, a $ref that is not an RFC 3986 URI reference), which
 *     eng_json_validate, applying the document exactly, refuses too;
 *   - a number or a string the generator writes otherwise or not at all
 *     (an exponent; an unbounded number of more than 15 integer or 6
 *     fraction digits; a control character, which needs a \u escape).
 * Instances that the published metaschemas reject (checked with
 * python3-jsonschema 4.10, Debian's, when the list was written) must be
 * rejected by the automaton and by eng_json_validate. A remote $ref to
 * anything else stays SW_EUNSUPPORTED.
 */
#include "testutil.h"
#include "schema_check.h"

#include "common/error.h"
#include "grammar/constrain.h"
#include "grammar/json_schema.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* json_schema-impl.h: the built-in document's text, for its key order */
const char *eng__sc_builtin_metaschema(const char *uri);

#define URI_2020 "https://json-schema.org/draft/2020-12/schema"
#define URI_7 "http://json-schema.org/draft-07/schema#"

static eng_cs_vocab *g_vocab;

static bool feed_text(const eng_grammar *g, const char *text)
{
    eng_constraint *c = NULL;
    sw_error err;
    assert_int_equal(eng_constraint_create(g, g_vocab, &c, &err), SW_OK);
    bool ok = true;
    for (size_t i = 0; ok && text[i]; i++)
        ok = eng_constraint_feed(c, &text[i], 1);
    ok = ok && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return ok;
}

static json_t *meta_ref(bool draft7)
{
    if (draft7)
        return json_pack("{s:s,s:s}", "$schema", URI_7, "$ref", URI_7);
    return json_pack("{s:s,s:s}", "$schema", URI_2020, "$ref", URI_2020);
}

static eng_grammar *compile_meta(bool draft7)
{
    json_t *s = meta_ref(draft7);
    eng_grammar *g = NULL;
    sw_error err;
    int rc = eng_grammar_from_schema(s, &g, &err);
    if (rc)
        fail_msg("the metaschema does not compile: %s", err.message);
    json_decref(s);
    return g;
}

/* ---- walking a schema instance ------------------------------------------ */

static const char *const schema_valued[] = {
    "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema", "items",
};
static const char *const schema_arrays[] = {"allOf", "anyOf", "oneOf", "prefixItems", "items"};
static const char *const schema_maps[] = {"properties", "patternProperties", "$defs",
                                          "definitions", "dependentSchemas", "dependencies"};
static const char *const unique_arrays[] = {"type", "required"};

static bool in(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}
#define IN(k, list) in((k), (list), sizeof(list) / sizeof *(list))

/* A copy of a value that is not a schema (const, enum, default, ...),
 * keys in their own order; *why as for canon. */
static json_t *value_copy(const json_t *s, const char **why)
{
    if (json_is_real(s)) {
        /* 2.0 is the integer 2 (the generator writes it so) */
        double d = json_real_value(s);
        if (d == (double)(json_int_t)d && d > -1e15 && d < 1e15)
            return json_integer((json_int_t)d);
        char b[64];
        snprintf(b, sizeof b, "%.15g", d);
        if (strchr(b, 'e') && !*why)
            *why = "a number written with an exponent";
        const char *dot = strchr(b, '.');
        if (dot && strlen(dot + 1) > 6 && !*why)
            *why = "an unbounded number with more than 6 fraction digits";
        return json_deep_copy(s);
    }
    if (json_is_integer(s)) {
        json_int_t i = json_integer_value(s);
        if ((i > 999999999999999 || i < -999999999999999) && !*why)
            *why = "an unbounded integer of more than 15 digits";
        return json_deep_copy(s);
    }
    if (json_is_string(s)) {
        for (size_t i = 0; i < json_string_length(s); i++) {
            unsigned char ch = (unsigned char)json_string_value(s)[i];
            if (ch < 0x20 && (ch == 0 || !strchr("\b\f\n\r\t", ch)) && !*why)
                *why = "a string with a \\u escape (a control character)";
        }
    }
    if (json_is_array(s)) {
        json_t *a = json_array();
        for (size_t j = 0; j < json_array_size(s); j++)
            json_array_append_new(a, value_copy(json_array_get(s, j), why));
        return a;
    }
    if (json_is_object(s)) {
        json_t *o = json_object();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)s, k, v) {
            json_object_set_new(o, k, value_copy(v, why));
        }
        return o;
    }
    return json_deep_copy(s);
}

/* A deep copy of the schema s with each schema object's keys in the
 * built-in's order (declared keys first, the rest after). *why receives
 * the first automaton narrowing s meets, if any. */
static json_t *canon(const json_t *s, const json_t *order, const char **why)
{
    if (!json_is_object(s))
        return value_copy(s, why);
    json_t *out = json_object();
    const char *k;
    json_t *v;
    for (int pass = 0; pass < 2; pass++) {
        const json_t *keys = pass == 0 ? order : s;
        size_t i = 0;
        void *it = pass == 0 ? NULL : json_object_iter((json_t *)s);
        for (;;) {
            if (pass == 0) {
                if (i >= json_array_size(keys))
                    break;
                k = json_string_value(json_array_get(keys, i++));
                v = json_object_get(s, k);
                if (!v)
                    continue;
            } else {
                if (!it)
                    break;
                k = json_object_iter_key(it);
                v = json_object_iter_value(it);
                it = json_object_iter_next((json_t *)s, it);
                if (json_object_get(out, k))
                    continue;
                if (!*why)
                    *why = "a keyword the metaschema does not declare (a free key)";
            }
            json_t *c;
            if (IN(k, schema_valued) && (json_is_object(v) || json_is_boolean(v))) {
                c = canon(v, order, why);
            } else if (IN(k, schema_arrays) && json_is_array(v)) {
                c = json_array();
                for (size_t j = 0; j < json_array_size(v); j++)
                    json_array_append_new(c, canon(json_array_get(v, j), order, why));
            } else if (IN(k, schema_maps) && json_is_object(v)) {
                c = json_object();
                const char *mk;
                json_t *mv;
                json_object_foreach(v, mk, mv) {
                    if (json_is_array(mv) && json_array_size(mv) > 1 && !*why)
                        *why = "uniqueItems: an array of more than one item";
                    json_object_set_new(c, mk, canon(mv, order, why));
                }
            } else {
                if (IN(k, unique_arrays) && json_array_size(v) > 1 && !*why)
                    *why = "uniqueItems: an array of more than one item";
                if (strcmp(k, "dependentRequired") == 0) {
                    const char *dk;
                    json_t *dv;
                    json_object_foreach(v, dk, dv) {
                        if (json_array_size(dv) > 1 && !*why)
                            *why = "uniqueItems: an array of more than one item";
                    }
                }
                c = value_copy(v, why);
            }
            json_object_set_new(out, k, c);
        }
    }
    return out;
}

/* The keys of the built-in's "properties", in order. */
static json_t *key_order(const char *uri)
{
    json_error_t jerr;
    json_t *doc = json_loads(eng__sc_builtin_metaschema(uri), 0, &jerr);
    assert_non_null(doc);
    json_t *order = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(doc, "properties"), k, v) {
        json_array_append_new(order, json_string(k));
    }
    json_decref(doc);
    return order;
}

typedef struct tally {
    int schemas, accepted, narrowed_automaton, narrowed_document;
    int unexplained;
} tally;

static void check_instance(const eng_grammar *g, const json_t *meta, const json_t *order,
                           const json_t *schema, const char *where, tally *t)
{
    const char *why = NULL;
    json_t *c = canon(schema, order, &why);
    char *text = json_dumps(c, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    json_decref(c);
    assert_non_null(text);
    sw_error err;
    int vrc = eng_json_validate(meta, schema, &err);
    bool accepted = feed_text(g, text);
    t->schemas++;
    if (accepted) {
        t->accepted++;
        /* the document applied exactly: what the automaton writes, the
         * validator accepts */
        if (vrc != SW_OK) {
            print_message("FAIL %s: accepted by the automaton, eng_json_validate says %d (%s)\n",
                          where, vrc, err.message);
            t->unexplained++;
        }
    } else if (vrc == SW_EINVAL) {
        t->narrowed_document++;
        if (getenv("META_VERBOSE"))
            print_message("  narrowed (document) %s: %s\n", where, err.message);
    } else if (why) {
        t->narrowed_automaton++;
        if (getenv("META_VERBOSE"))
            print_message("  narrowed %s: %s\n", where, why);
    } else {
        print_message("FAIL %s: the valid schema %.300s is refused\n", where, text);
        t->unexplained++;
    }
    free(text);
}

static void run_suite_schemas(const char *draft, bool draft7)
{
    json_t *files = sc_suite_load(draft);
    if (!files)
        return;
    eng_grammar *g = compile_meta(draft7);
    json_t *meta = meta_ref(draft7);
    json_t *order = key_order(draft7 ? "http://json-schema.org/draft-07/schema" : URI_2020);
    tally t = {0};
    size_t i;
    json_t *file;
    json_array_foreach (files, i, file) {
        const char *name = json_string_value(json_object_get(file, "name"));
        const json_t *groups = json_object_get(file, "groups");
        for (size_t gi = 0; gi < json_array_size(groups); gi++) {
            const json_t *group = json_array_get(groups, gi);
            char where[512];
            snprintf(where, sizeof where, "%s/%s / %s", draft, name,
                     json_string_value(json_object_get(group, "description")));
            check_instance(g, meta, order, json_object_get(group, "schema"), where, &t);
        }
    }
    json_decref(files);
    print_message("%s: %d suite schemas through the metaschema: %d accepted, %d narrowed by "
                  "the automaton (free keys, uniqueItems, exponents), %d by the document "
                  "(patterns, URIs), %d unexplained\n",
                  draft, t.schemas, t.accepted, t.narrowed_automaton, t.narrowed_document,
                  t.unexplained);
    assert_int_equal(t.unexplained, 0);
    /* most must go through: a metaschema that refused everything would
     * "pass" on narrowings alone */
    assert_true(t.accepted * 2 > t.schemas);
    json_decref(order);
    json_decref(meta);
    eng_grammar_free(g);
}

static void test_suite_schemas_2020(void **state)
{
    (void)state;
    run_suite_schemas("draft2020-12", false);
}

static void test_suite_schemas_draft7(void **state)
{
    (void)state;
    run_suite_schemas("draft7", true);
}

/* Invalid under the published metaschema (python3-jsonschema 4.10 says
 * so for each), in both drafts unless marked. */
static const char *const invalid_both[] = {
    "1", "\"x\"", "null", "[]", "{\"type\":1}", "{\"type\":\"float\"}", "{\"type\":[]}",
    "{\"type\":[\"string\",\"string\"]}", "{\"minLength\":-1}", "{\"minLength\":1.5}",
    "{\"maxItems\":\"3\"}", "{\"required\":\"a\"}", "{\"required\":[1]}",
    "{\"required\":[\"a\",\"a\"]}", "{\"properties\":{\"a\":3}}", "{\"properties\":[]}",
    "{\"definitions\":{\"foo\":{\"type\":1}}}", "{\"allOf\":[]}", "{\"anyOf\":{}}",
    "{\"not\":3}", "{\"enum\":3}", "{\"multipleOf\":0}", "{\"multipleOf\":-2}",
    "{\"minimum\":\"1\"}", "{\"uniqueItems\":1}", "{\"additionalProperties\":1}",
    "{\"dependencies\":{\"a\":1}}", "{\"items\":{\"type\":1}}", "{\"title\":3}",
    "{\"$comment\":false}", "{\"if\":[]}", "{\"contains\":\"a\"}", "{\"patternProperties\":1}",
};
static const char *const invalid_2020[] = {
    "{\"$defs\":{\"foo\":{\"type\":1}}}", "{\"items\":[]}", "{\"prefixItems\":[]}",
    "{\"$anchor\":\"1a\"}", "{\"$id\":\"http://x/y#frag\"}", "{\"dependentRequired\":{\"a\":1}}",
    "{\"minContains\":-1}", "{\"$vocabulary\":{\"http://x\":1}}", "{\"deprecated\":1}",
};
static const char *const invalid_7[] = {"{\"items\":[]}", "{\"items\":[1]}",
                                        "{\"additionalItems\":3}"};

static void reject_all(bool draft7, const char *const *list, size_t n)
{
    eng_grammar *g = compile_meta(draft7);
    json_t *meta = meta_ref(draft7);
    for (size_t i = 0; i < n; i++) {
        json_error_t jerr;
        json_t *v = json_loads(list[i], JSON_DECODE_ANY, &jerr);
        assert_non_null(v);
        sw_error err;
        if (feed_text(g, list[i]))
            fail_msg("%s: the invalid schema %s is accepted", draft7 ? "draft7" : "2020-12",
                     list[i]);
        assert_int_equal(eng_json_validate(meta, v, &err), SW_EINVAL);
        json_decref(v);
    }
    json_decref(meta);
    eng_grammar_free(g);
}

static void test_invalid_rejected(void **state)
{
    (void)state;
    size_t nb = sizeof invalid_both / sizeof *invalid_both;
    reject_all(false, invalid_both, nb);
    reject_all(true, invalid_both, nb);
    reject_all(false, invalid_2020, sizeof invalid_2020 / sizeof *invalid_2020);
    reject_all(true, invalid_7, sizeof invalid_7 / sizeof *invalid_7);
}

/* A few valid schemas, written in the automaton's key order. */
static void test_valid_accepted(void **state)
{
    (void)state;
    static const char *const valid_both[] = {
        "true", "false", "{}", "{\"type\":\"integer\"}", "{\"type\":[\"null\"]}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":1}},"
        "\"required\":[\"a\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"enum\":[1,\"a\",null]},\"maxItems\":3}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}",
        "{\"$ref\":\"#/definitions/x\",\"definitions\":{\"x\":true}}",
        "{\"multipleOf\":0.5,\"minimum\":-1.5,\"pattern\":\"^abc$\"}",
        "{\"not\":{\"const\":{\"a\":[1,2]}}}",
    };
    for (int d = 0; d < 2; d++) {
        eng_grammar *g = compile_meta(d == 1);
        for (size_t i = 0; i < sizeof valid_both / sizeof *valid_both; i++)
            if (!feed_text(g, valid_both[i]))
                fail_msg("%s: the valid schema %s is refused", d ? "draft7" : "2020-12",
                         valid_both[i]);
        eng_grammar_free(g);
    }
}

/* A remote $ref to anything but the metaschemas stays a typed refusal. */
static void test_other_remote_refused(void **state)
{
    (void)state;
    static const char *const refs[] = {
        "https://json-schema.org/draft/2020-12/meta/core",
        "http://json-schema.org/draft-06/schema#",
        "https://example.com/schema", "https://json-schema.org/draft/2020-12/schemax",
    };
    for (size_t i = 0; i < sizeof refs / sizeof *refs; i++) {
        json_t *s = json_pack("{s:s}", "$ref", refs[i]);
        eng_grammar *g = NULL;
        sw_error err;
        assert_int_equal(eng_grammar_from_schema(s, &g, &err), SW_EUNSUPPORTED);
        assert_non_null(strstr(err.message, "remote $ref"));
        json_decref(s);
    }
}

/* The compiler reuses a string node across depths (the metaschema's
 * patterns are compiled once), only for a schema that compiled nothing
 * below it: a recursive anyOf with a string alternative keeps its
 * recursion at every level. */
static void test_recursive_string_or_array(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *s = json_loads("{\"$defs\":{\"t\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":"
                           "\"^a+$\"},{\"type\":\"object\",\"properties\":{\"c\":"
                           "{\"$ref\":\"#/$defs/t\"}},\"required\":[\"c\"]}]}},"
                           "\"$ref\":\"#/$defs/t\"}",
                           0, &jerr);
    assert_non_null(s);
    eng_grammar *g = NULL;
    sw_error err;
    assert_int_equal(eng_grammar_from_schema(s, &g, &err), SW_OK);
    assert_true(feed_text(g, "\"aa\""));
    assert_true(feed_text(g, "{\"c\":\"a\"}"));
    assert_true(feed_text(g, "{\"c\":{\"c\":\"a\"}}"));
    assert_false(feed_text(g, "{\"c\":\"b\"}"));
    eng_grammar_free(g);
    json_decref(s);
}

int main(void)
{
    g_vocab = tu_byte_vocab();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_accepted),
        cmocka_unit_test(test_invalid_rejected),
        cmocka_unit_test(test_other_remote_refused),
        cmocka_unit_test(test_recursive_string_or_array),
        cmocka_unit_test(test_suite_schemas_2020),
        cmocka_unit_test(test_suite_schemas_draft7),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    eng_cs_vocab_free(g_vocab);
    return rc;
}
