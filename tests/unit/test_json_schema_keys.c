/* test_json_schema_keys.c - free keys that must not take some names, and
 * the schema compiler's typed errors under lost allocations and overlong
 * URIs.
 *
 * An object without declared properties generates free keys. Where a name
 * has dependentRequired (draft 7: dependencies as a list) or is forbidden
 * by a 'not required', the compiler leaves that name out of the free keys
 * (docs/api.md, a narrowing). Checked here byte by byte over the automaton
 * (the name itself is refused, every other key is accepted, propertyNames
 * of each kind combined with it), and by random walks of the automaton
 * whose every output eng_json_validate must accept.
 *
 * Out of memory: every allocation of a compile is failed in turn; each
 * time the compile fails with SW_ENOMEM (never an error that blames the
 * schema) and leaves nothing behind, or succeeds.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/constrain.h"
#include "grammar/json_schema.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *v = sw_json_loadb_big(text, strlen(text), JSON_DECODE_ANY, &je);
    if (!v)
        fail_msg("bad test JSON: %s: %s", je.text, text);
    return v;
}

static eng_cs_vocab *g_vocab; /* the 256 single bytes, token 256 = end */

static void make_vocab(void) { g_vocab = tu_byte_vocab(); }

/* Whether text is accepted as a whole value. */
static bool whole(const eng_grammar *g, const char *text)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, g_vocab, &c, NULL), SW_OK);
    bool ok = eng_constraint_feed(c, text, strlen(text)) && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return ok;
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static uint64_t rng_next(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Random outputs of the automaton (uniform among the allowed bytes, a
 * budget of 60 bytes): each parses and eng_json_validate accepts it. */
static void walks_validate(const eng_grammar *g, const json_t *schema, const char *schema_text)
{
    for (int w = 0; w < 64; w++) {
        eng_constraint *c = NULL;
        uint32_t mask[(257 + 31) / 32];
        char out[128];
        size_t n = 0;
        assert_int_equal(eng_constraint_create(g, g_vocab, &c, NULL), SW_OK);
        for (;;) {
            int32_t allowed = eng_constraint_mask(c, 60 - (int64_t)n, mask);
            if (allowed == 0)
                fail_msg("%s: the walk got stuck after %.*s", schema_text, (int)n, out);
            int32_t pick = (int32_t)(rng_next() % (uint64_t)allowed), tok = -1;
            for (int32_t id = 0; id < 257 && tok < 0; id++)
                if ((mask[id >> 5] >> (id & 31) & 1u) && pick-- == 0)
                    tok = id;
            if (tok == 256)
                break;
            assert_true(eng_constraint_accept_token(c, tok));
            assert_true(n + 1 < sizeof out);
            out[n++] = (char)tok;
        }
        eng_constraint_free(c);
        json_error_t je;
        json_t *v = json_loadb(out, n, JSON_DECODE_ANY, &je);
        if (!v)
            fail_msg("%s: the output %.*s does not parse", schema_text, (int)n, out);
        sw_error err;
        int rc = eng_json_validate(schema, v, &err);
        json_decref(v);
        if (rc != SW_OK)
            fail_msg("%s: the output %.*s is invalid: %s", schema_text, (int)n, out,
                     err.message);
    }
}

typedef struct key_case {
    const char *schema;
    const char *accepted[6]; /* NULL-terminated */
    const char *refused[6];
} key_case;

static const key_case g_cases[] = {
    /* the suite's dependentRequired groups: bar needs foo; a free key is
     * never "bar" (with foo beside it that is valid: a narrowing) */
    {"{\"dependentRequired\":{\"bar\":[\"foo\"]}}",
     {"{}", "{\"foo\":1}", "{\"ba\":1}", "{\"barx\":true}", "{\"foo\":1,\"baz\":2}", NULL},
     {"{\"bar\":2}", "{\"foo\":1,\"bar\":2}", "{\"x\":0,\"bar\":[]}", NULL}},
    /* no dependents: no constraint */
    {"{\"dependentRequired\":{\"bar\":[]}}", {"{\"bar\":2}", "{}", NULL}, {NULL}},
    /* names that need escapes, and a multi-byte one */
    {"{\"dependentRequired\":{\"foo\\nbar\":[\"a\"],\"\\u00e9\\\"\":[\"b\"],\"\":[\"c\"]}}",
     {"{\"foo\":1}", "{\"foo\\nba\":1}", "{\"\xc3\xa9\":1}", NULL},
     {"{\"foo\\nbar\":1}", "{\"\xc3\xa9\\\"\":1}", "{\"\":1}", NULL}},
    /* draft 7: dependencies as a list */
    {"{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"dependencies\":{\"quux\":"
     "[\"foo\",\"bar\"]}}",
     {"{\"foo\":1,\"bar\":2}", "{}", NULL},
     {"{\"quux\":1}", "{\"foo\":1,\"bar\":2,\"quux\":3}", NULL}},
    /* beside propertyNames: a length bound, a pattern, a finite set */
    {"{\"propertyNames\":{\"maxLength\":3},\"dependentRequired\":{\"bar\":[\"foo\"]}}",
     {"{\"foo\":1}", "{\"ba\":1}", NULL},
     {"{\"bar\":1}", "{\"abcd\":1}", NULL}},
    {"{\"propertyNames\":{\"pattern\":\"^b\"},\"dependentRequired\":{\"bar\":[\"foo\"]}}",
     {"{\"baz\":1}", "{\"b\":1}", "{\"barr\":1}", NULL},
     {"{\"bar\":1}", "{\"foo\":1}", NULL}},
    {"{\"propertyNames\":{\"enum\":[\"bar\",\"baz\"]},\"dependentRequired\":{\"bar\":[\"foo\"]}}",
     {"{\"baz\":1}", "{}", NULL},
     {"{\"bar\":1}", "{\"foo\":1}", NULL}},
    /* a counted free object, values of a schema */
    {"{\"maxProperties\":1,\"additionalProperties\":{\"type\":\"integer\"},"
     "\"dependentRequired\":{\"bar\":[\"foo\"]}}",
     {"{\"a\":1}", "{}", NULL},
     {"{\"bar\":1}", "{\"a\":1,\"b\":2}", "{\"a\":\"x\"}", NULL}},
    /* not required on a free object: the name is never a free key (it was
     * generated before: any object) */
    {"{\"type\":\"object\",\"not\":{\"required\":[\"a\"]}}",
     {"{}", "{\"b\":1}", "{\"aa\":{}}", NULL},
     {"{\"a\":1}", "{\"b\":1,\"a\":2}", NULL}},
    {"{\"type\":\"object\",\"not\":{\"required\":[\"a\"]},\"propertyNames\":{\"minLength\":1}}",
     {"{\"b\":1}", NULL},
     {"{\"a\":1}", "{\"\":1}", NULL}},
};

static void test_free_keys(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++) {
        const key_case *k = &g_cases[i];
        json_t *s = parse(k->schema);
        eng_grammar *g = NULL;
        sw_error err;
        if (eng_grammar_from_schema(s, &g, &err))
            fail_msg("compile %s: %s", k->schema, err.message);
        for (size_t j = 0; k->accepted[j]; j++) {
            if (!whole(g, k->accepted[j]))
                fail_msg("%s: expected %s to be accepted", k->schema, k->accepted[j]);
            /* the suite's judge agrees: a valid value */
            json_t *v = parse(k->accepted[j]);
            assert_int_equal(eng_json_validate(s, v, &err), SW_OK);
            json_decref(v);
        }
        for (size_t j = 0; k->refused[j]; j++)
            if (whole(g, k->refused[j]))
                fail_msg("%s: expected %s to be refused", k->schema, k->refused[j]);
        walks_validate(g, s, k->schema);
        eng_grammar_free(g);
        json_decref(s);
    }
}

/* contains that no array satisfies ({"contains": false}, maxContains
 * below minContains): without a type, every non-array is valid and may be
 * generated; no array is; with "type": "array" the schema is a 400. */
static void test_unsatisfiable_contains(void **state)
{
    (void)state;
    static const char *const schemas[] = {
        "{\"contains\":false}",
        "{\"contains\":{\"const\":1},\"minContains\":2,\"maxContains\":1}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        json_t *s = parse(schemas[i]);
        eng_grammar *g = NULL;
        sw_error err;
        if (eng_grammar_from_schema(s, &g, &err))
            fail_msg("compile %s: %s", schemas[i], err.message);
        assert_true(whole(g, "\"x\""));
        assert_true(whole(g, "{}"));
        assert_true(whole(g, "null"));
        assert_false(whole(g, "[]"));
        assert_false(whole(g, "[1]"));
        assert_false(whole(g, "[1,1]"));
        walks_validate(g, s, schemas[i]);
        eng_grammar_free(g);
        json_decref(s);
    }
    json_t *s = parse("{\"type\":\"array\",\"contains\":false}");
    eng_grammar *g = NULL;
    sw_error err;
    assert_int_equal(eng_grammar_from_schema(s, &g, &err), SW_EUNSUPPORTED);
    json_decref(s);
}

/* What stays refused, with a typed error naming the keyword. */
static void test_free_keys_refused(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *message;
    } cases[] = {
        /* a schema dependency in 2020-12's removed 'dependencies' */
        {"{\"dependencies\":{\"bar\":{\"required\":[\"foo\"]}}}", "dependencies that are schemas"},
        /* propertyNames that is not one string schema */
        {"{\"propertyNames\":{\"anyOf\":[{\"maxLength\":1},{\"pattern\":\"^x\"}]},"
         "\"dependentRequired\":{\"bar\":[\"foo\"]}}",
         "one string schema"},
        {"{\"dependentRequired\":[\"bar\"]}", "expected an object of dependencies"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *s = parse(cases[i].schema);
        eng_grammar *g = NULL;
        sw_error err;
        int rc = eng_grammar_from_schema(s, &g, &err);
        if (rc != SW_EUNSUPPORTED && rc != SW_EINVAL)
            fail_msg("%s: got %d, want a refusal", cases[i].schema, rc);
        if (!strstr(err.message, cases[i].message))
            fail_msg("%s: message '%s' lacks '%s'", cases[i].schema, err.message,
                     cases[i].message);
        assert_null(g);
        json_decref(s);
    }
}

/* An $id or $ref longer than the URI buffer (1023 bytes) is refused, never
 * cut short: cut, "#/$defs/" + 1499 a's named the definition of 996 a's
 * (the bytes left after "urn:spillway:schema#/$defs/"), a string where an
 * integer was asked for. */
static void test_long_uris(void **state)
{
    (void)state;
    char name[1500];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    char text[4096];
    snprintf(text, sizeof text,
             "{\"$defs\":{\"%s\":{\"type\":\"integer\"},\"%.996s\":{\"type\":\"string\"}},"
             "\"$ref\":\"#/$defs/%s\"}",
             name, name, name);
    json_t *s = parse(text);
    eng_grammar *g = NULL;
    sw_error err;
    assert_int_equal(eng_grammar_from_schema(s, &g, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "longer than"));
    json_decref(s);
    snprintf(text, sizeof text, "{\"$id\":\"https://example.com/%s\",\"type\":\"integer\"}", name);
    s = parse(text);
    assert_int_equal(eng_grammar_from_schema(s, &g, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "longer than"));
    json_decref(s);
    /* within the bound (and a JSON pointer segment of at most 511 bytes): resolved */
    snprintf(text, sizeof text,
             "{\"$defs\":{\"%.500s\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/%.500s\"}", name,
             name);
    s = parse(text);
    assert_int_equal(eng_grammar_from_schema(s, &g, &err), SW_OK);
    assert_true(whole(g, "12"));
    assert_false(whole(g, "\"x\""));
    eng_grammar_free(g);
    json_decref(s);
}

/* Every allocation of a compile failed in turn: SW_ENOMEM or success. */
static void test_out_of_memory(void **state)
{
    (void)state;
    static const char *const schemas[] = {
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\","
        "\"minimum\":-5,\"maximum\":1000},\"next\":{\"$ref\":\"#/$defs/n\"}},\"required\":"
        "[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
        "\"p\":{\"type\":\"string\",\"pattern\":\"^[a-z]{2,5}$\"},\"e\":{\"enum\":[\"x\",1,null]},"
        "\"u\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"type\":"
        "\"boolean\"},\"maxItems\":3}]}},\"required\":[\"d\"]}",
        "{\"propertyNames\":{\"maxLength\":4},\"dependentRequired\":{\"bar\":[\"foo\"]},"
        "\"additionalProperties\":{\"type\":\"number\"}}",
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}},\"required\":"
        "[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"}},\"required\":"
        "[\"k\"]}],\"if\":{\"required\":[\"z\"]},\"then\":{\"minProperties\":1}}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        json_t *s = parse(schemas[i]);
        long runs = 0;
        for (long n = 0;; n++) {
            eng_grammar *g = NULL;
            sw_error err;
            sw_alloc_fail_after(n);
            int rc = eng_grammar_from_schema(s, &g, &err);
            sw_alloc_fail_after(-1);
            runs++;
            if (rc == SW_OK) {
                eng_grammar_free(g);
                break;
            }
            if (rc != SW_ENOMEM)
                fail_msg("schema %zu, allocation %ld failed: got %d (%s), want SW_ENOMEM", i, n,
                         rc, err.message);
            assert_null(g);
            assert_true(n < 1000000);
        }
        print_message("schema %zu: %ld allocations failed in turn, each SW_ENOMEM\n", i,
                      runs - 1);
        assert_true(runs > 1);
        json_decref(s);
    }
}

static int setup(void **state)
{
    (void)state;
    make_vocab();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    eng_cs_vocab_free(g_vocab);
    g_vocab = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_keys),
        cmocka_unit_test(test_free_keys_refused),
        cmocka_unit_test(test_unsatisfiable_contains),
        cmocka_unit_test(test_long_uris),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
