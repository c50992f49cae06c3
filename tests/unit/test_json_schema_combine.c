/* test_json_schema_combine.c - oneOf whose alternatives may overlap, not
 * of any schema, allOf merges, and schema strings with U+0000 or keyword
 * names as property names.
 *
 * Each case is a schema that must compile (or be refused with a message
 * naming the construct): values the automaton must accept as a whole
 * (valid values it generates), values it must refuse (invalid ones: a
 * value two oneOf alternatives match, a value the not-ed schema accepts,
 * ...), and random walks of the automaton over a byte vocabulary under
 * several seeds, every output of which must parse and validate: by
 * eng_json_validate here, and by python3-jsonschema
 * (tests/jsonschema_check.py through sc_check) at the end, the judge that
 * shares no code with the compiler.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/constrain.h"
#include "grammar/json_schema.h"
#include "schema_check.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static eng_cs_vocab *g_vocab; /* the 256 single bytes, token 256 = end */
static json_t *g_records;     /* sc_record per case, for python3-jsonschema */

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *v = sw_json_loadb_big(text, strlen(text), JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        fail_msg("bad test JSON: %s: %s", je.text, text);
    return v;
}

/* Whether text is accepted as a whole value. */
static bool whole(const eng_grammar *g, const char *text)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, g_vocab, &c, NULL), SW_OK);
    bool ok = eng_constraint_feed(c, text, strlen(text)) && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return ok;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define WALKS_PER_SEED 24
#define BUDGET 90

/* Random outputs of the automaton (uniform among the allowed bytes) under
 * seeds 1..4: each must parse and validate; each is kept for the python
 * check. */
static void walks(const eng_grammar *g, const json_t *schema, const char *text, json_t *outputs)
{
    for (uint64_t seed = 1; seed <= 4; seed++) {
        uint64_t rng = 0x9E3779B97F4A7C15ull * seed;
        for (int w = 0; w < WALKS_PER_SEED; w++) {
            eng_constraint *c = NULL;
            uint32_t mask[(257 + 31) / 32];
            char out[BUDGET + 8];
            size_t n = 0;
            assert_int_equal(eng_constraint_create(g, g_vocab, &c, NULL), SW_OK);
            for (;;) {
                int32_t allowed = eng_constraint_mask(c, BUDGET - (int64_t)n, mask);
                if (allowed == 0)
                    fail_msg("%s: the walk got stuck after %.*s", text, (int)n, out);
                int32_t pick = (int32_t)(rng_next(&rng) % (uint64_t)allowed), tok = -1;
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
            json_t *v = sw_json_loadb_big(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!v)
                fail_msg("%s: the output %.*s does not parse", text, (int)n, out);
            sw_error err;
            int rc = eng_json_validate(schema, v, &err);
            json_decref(v);
            if (rc != SW_OK)
                fail_msg("%s: the output %.*s is invalid: %s", text, (int)n, out, err.message);
            json_array_append_new(outputs, json_stringn(out, n));
        }
    }
}

typedef struct combine_case {
    const char *name;
    const char *schema;
    const char *accepted[10]; /* NULL-terminated: valid values the automaton takes */
    const char *refused[8];    /* invalid values it must refuse */
} combine_case;

static const combine_case g_cases[] = {
    /* oneOf over object shapes with different required keys: "this one
     * and not the others" (a key the other requires is left out) */
    {"oneOf objects, different required keys",
     "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
     "\"b\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":"
     "{\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"c\"]}]}",
     {"{\"a\":\"x\"}", "{\"a\":\"x\",\"b\":1}", "{\"c\":true}", "{\"b\":2,\"c\":false}"},
     {"{\"a\":\"x\",\"c\":true}", "{}", "{\"b\":1}"}},
    {"oneOf over $refs sharing a property",
     "{\"$defs\":{\"cat\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
     "\"meows\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"meows\"]},\"dog\":{\"type\":"
     "\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"barks\":{\"type\":\"boolean\"}},"
     "\"required\":[\"name\",\"barks\"]}},\"oneOf\":[{\"$ref\":\"#/$defs/cat\"},"
     "{\"$ref\":\"#/$defs/dog\"}]}",
     {"{\"name\":\"x\",\"meows\":true}", "{\"name\":\"y\",\"barks\":false}"},
     {"{\"name\":\"x\",\"meows\":true,\"barks\":true}", "{\"name\":\"x\"}"}},
    {"oneOf of closed object shapes",
     "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
     "\"url\":{\"type\":\"string\"}},\"required\":[\"url\"],\"additionalProperties\":false},"
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"path\":"
     "{\"type\":\"string\"}},\"required\":[\"path\"],\"additionalProperties\":false}]}",
     {"{\"url\":\"a\"}", "{\"id\":1,\"url\":\"a\"}", "{\"id\":2,\"path\":\"b\"}"},
     {"{\"id\":1}", "{\"url\":\"a\",\"path\":\"b\"}"}},
    {"oneOf of closed shapes sharing their optional keys",
     "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
     "\"b\":{\"type\":\"string\"}},\"additionalProperties\":false},{\"type\":\"object\","
     "\"properties\":{\"a\":{\"type\":\"integer\"},\"c\":{\"type\":\"boolean\"}},"
     "\"additionalProperties\":false}]}",
     {"{\"b\":\"x\"}", "{\"a\":1,\"b\":\"\"}", "{\"c\":true}", "{\"a\":2,\"c\":false}"},
     {"{}", "{\"a\":1}", "{\"b\":\"x\",\"c\":true}"}},
    {"oneOf overlapping integer ranges",
     "{\"oneOf\":[{\"type\":\"integer\",\"minimum\":0},{\"type\":\"integer\",\"maximum\":10}]}",
     {"11", "-1", "12345"},
     {"0", "5", "10", "\"x\""}},
    {"oneOf with base schema, string lengths",
     "{\"type\":\"string\",\"oneOf\":[{\"minLength\":2},{\"maxLength\":4}]}",
     {"\"abcde\"", "\"a\"", "\"\""},
     {"\"ab\"", "\"abcd\"", "1"}},
    {"oneOf of patterns",
     "{\"type\":\"string\",\"oneOf\":[{\"pattern\":\"^a\"},{\"pattern\":\"b$\"}]}",
     {"\"ax\"", "\"xb\"", "\"a\""},
     {"\"ab\"", "\"axb\"", "\"x\""}},
    /* not over objects and arrays */
    {"not required, two names",
     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
     "\"string\"}},\"not\":{\"required\":[\"a\",\"b\"]}}",
     {"{}", "{\"b\":\"x\"}"},
     {"{\"a\":1,\"b\":\"x\"}"}},
    {"not required and properties",
     "{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\"}},\"required\":"
     "[\"kind\"],\"not\":{\"required\":[\"kind\"],\"properties\":{\"kind\":{\"const\":\"x\"}}}}",
     {"{\"kind\":\"y\"}", "{\"kind\":\"xx\"}", "{\"kind\":\"\"}"},
     {"{\"kind\":\"x\"}", "{}"}},
    {"not anyOf of required",
     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":"
     "\"string\"}},\"not\":{\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}}",
     {"{}"},
     {"{\"a\":\"x\"}", "{\"b\":\"x\"}", "{\"a\":\"x\",\"b\":\"y\"}"}},
    {"not items",
     "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"not\":{\"items\":{\"minimum\":0}}}",
     {"[-1]", "[-3,-4]"},
     {"[]", "[1]", "[0,2]"}},
    {"not minItems",
     "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"not\":{\"minItems\":2,"
     "\"items\":{\"type\":\"boolean\"}}}",
     {"[]", "[true]"},
     {"[true,false]"}},
    {"not contains",
     "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"not\":{\"contains\":{\"const\":1}}}",
     {"[]", "[2]", "[0,3]"},
     {"[1]", "[2,1]"}},
    {"not prefixItems",
     "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"integer\"}],"
     "\"items\":false,\"not\":{\"prefixItems\":[{\"maximum\":5},{\"maximum\":5}]}}",
     {"[6]", "[1,7]", "[9,9]"},
     {"[1]", "[1,2]", "[]"}},
    /* const and enum of any type */
    {"not const object",
     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"not\":{\"const\":"
     "{\"a\":1}}}",
     {"{}"},
     {"{\"a\":1}"}},
    {"not const array",
     "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"not\":{\"const\":[]}}",
     {"[1]", "[1,2]"},
     {"[]"}},
    {"not enum of strings",
     "{\"type\":\"string\",\"not\":{\"enum\":[\"red\",\"green\"]}}",
     {"\"blue\"", "\"redd\"", "\"\"", "\"re\""},
     {"\"red\"", "\"green\""}},
    {"not enum of integers",
     "{\"type\":\"integer\",\"not\":{\"enum\":[1,2,3]}}",
     {"0", "4", "-5"},
     {"1", "2", "3"}},
    {"not enum of mixed types",
     "{\"not\":{\"enum\":[\"a\",1,true,null]}}",
     {"\"b\"", "false", "2", "{}", "[]"},
     {"\"a\"", "1", "true", "null"}},
    /* patterns as complements, numeric ranges */
    {"not anchored pattern",
     "{\"type\":\"string\",\"not\":{\"pattern\":\"^[0-9]+$\"}}",
     {"\"a1\"", "\"\"", "\"12a\""},
     {"\"123\"", "\"0\""}},
    {"not unanchored pattern",
     "{\"type\":\"string\",\"not\":{\"pattern\":\"ab|^c\"}}",
     {"\"ba\"", "\"xc\"", "\"\""},
     {"\"xaby\"", "\"ab\"", "\"cab\"", "\"c\""}},
    {"not numeric range",
     "{\"type\":\"number\",\"not\":{\"minimum\":1,\"maximum\":5}}",
     {"0", "6", "5.5", "-2.25"},
     {"1", "3", "5", "4.5"}},
    {"not of pattern and length",
     "{\"type\":\"string\",\"not\":{\"pattern\":\"^x\",\"minLength\":3}}",
     {"\"xy\"", "\"abc\"", "\"\""},
     {"\"xyz\"", "\"xxxx\""}},
    /* allOf merges */
    {"allOf of two patterns",
     "{\"type\":\"string\",\"allOf\":[{\"pattern\":\"^[a-z]+$\"},{\"pattern\":\"q\"},"
     "{\"pattern\":\"^.{2,4}$\"}]}",
     {"\"aq\"", "\"qqqq\"", "\"bqc\""},
     {"\"q\"", "\"ab\"", "\"aQ\"", "\"aqaqa\""}},
    {"allOf of two multipleOf, whole",
     "{\"type\":\"integer\",\"allOf\":[{\"multipleOf\":1.5},{\"multipleOf\":2}]}",
     {"0", "6", "-12"},
     {"3", "4", "2"}},
    {"allOf of two multipleOf, binary fractions",
     "{\"type\":\"number\",\"allOf\":[{\"multipleOf\":0.25},{\"multipleOf\":0.5}]}",
     {"0", "3", "-2"},
     {"0.25", "0.75"}},
    {"allOf of two multipleOf, decimal fractions",
     "{\"type\":\"number\",\"allOf\":[{\"multipleOf\":0.1},{\"multipleOf\":0.25}]}",
     {"0", "3", "-7"},
     {"0.3", "0.25"}},
    {"allOf of two oneOf",
     "{\"allOf\":[{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]},"
     "{\"oneOf\":[{\"minimum\":5,\"minLength\":2},{\"maximum\":0,\"maxLength\":1}]}]}",
     {"7", "-3", "\"ab\"", "\"a\""},
     {"3", "true"}},
    {"allOf of two if",
     "{\"type\":\"integer\",\"allOf\":[{\"if\":{\"minimum\":10},\"then\":{\"maximum\":"
     "20},\"else\":{\"minimum\":0}},{\"if\":{\"maximum\":15},\"then\":{\"minimum\":5}}]}",
     {"5", "12", "20", "16"},
     {"21", "-1", "3"}},
    {"allOf of two anyOf, 81 pairs of which 10 hold values",
     "{\"allOf\":[{\"anyOf\":[{\"type\":\"string\",\"minLength\":2},{\"type\":\"string\","
     "\"pattern\":\"^z\"},{\"type\":\"integer\",\"minimum\":0},{\"type\":\"integer\","
     "\"maximum\":-10},{\"type\":\"boolean\"},{\"type\":\"null\"},{\"type\":\"array\","
     "\"maxItems\":1},{\"type\":\"object\",\"maxProperties\":0},{\"const\":2.5}]},"
     "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"const\":\"zzzzz\"},"
     "{\"type\":\"integer\",\"maximum\":5},{\"const\":-20},{\"const\":false},"
     "{\"type\":\"array\",\"items\":{\"type\":\"null\"}},{\"enum\":[{}]},"
     "{\"type\":\"number\",\"minimum\":2},{\"type\":\"array\",\"minItems\":1}]}]}",
     {"\"ab\"", "\"zzzzz\"", "\"z\"", "3", "-20", "false", "[null]", "{}", "2.5"},
     {"\"abcd\"", "true", "null", "-5", "[1,2]", "1.5"}},
    /* U+0000 in schema strings; keyword names as property names */
    {"const with U+0000", "{\"const\":\"a\\u0000b\"}", {"\"a\\u0000b\""}, {"\"ab\"", "\"a\""}},
    {"not const with U+0000",
     "{\"type\":\"string\",\"maxLength\":3,\"not\":{\"const\":\"a\\u0000\"}}",
     {"\"a\"", "\"\""},
     {"\"a\\u0000\""}},
    {"keyword names as property names",
     "{\"type\":\"object\",\"properties\":{\"format\":{\"type\":\"string\",\"format\":\"date\"},"
     "\"type\":{\"const\":\"x\"},\"required\":{\"type\":\"boolean\"},\"not\":{\"type\":"
     "\"integer\"}},\"required\":[\"format\",\"type\"]}",
     {"{\"format\":\"2024-01-02\",\"type\":\"x\"}",
      "{\"format\":\"2024-01-02\",\"type\":\"x\",\"required\":true,\"not\":3}"},
     {"{\"format\":\"x\",\"type\":\"x\"}", "{\"type\":\"x\"}",
      "{\"format\":\"2024-01-02\",\"type\":\"y\"}"}},
};

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) {
        const combine_case *k = &g_cases[i];
        json_t *s = parse(k->schema);
        eng_grammar *g = NULL;
        sw_error err;
        sw_error_clear(&err);
        int rc = eng_grammar_from_schema(s, &g, &err);
        if (rc != SW_OK)
            fail_msg("%s: refused: %s", k->name, err.message);
        for (int j = 0; j < 10 && k->accepted[j]; j++)
            if (!whole(g, k->accepted[j]))
                fail_msg("%s: %s is refused", k->name, k->accepted[j]);
        for (int j = 0; j < 8 && k->refused[j]; j++) {
            /* the value is invalid (the validator says so) and refused */
            json_t *v = parse(k->refused[j]);
            sw_error verr;
            assert_int_not_equal(eng_json_validate(s, v, &verr), SW_OK);
            json_decref(v);
            if (whole(g, k->refused[j]))
                fail_msg("%s: %s is accepted", k->name, k->refused[j]);
        }
        json_t *rec = sc_record("combine", k->name, s);
        walks(g, s, k->name, sc_outputs(rec));
        json_array_append_new(g_records, rec);
        eng_grammar_free(g);
        json_decref(s);
    }
}

/* Compiles text, checks the values, walks, and keeps the outputs for the
 * python check. */
static void check_schema(const char *name, const char *text, const char *const *accepted,
                         const char *const *refused)
{
    json_t *s = parse(text);
    eng_grammar *g = NULL;
    sw_error err;
    sw_error_clear(&err);
    int rc = eng_grammar_from_schema(s, &g, &err);
    if (rc != SW_OK)
        fail_msg("%s: refused: %s", name, err.message);
    for (int j = 0; accepted[j]; j++)
        if (!whole(g, accepted[j]))
            fail_msg("%s: %s is refused", name, accepted[j]);
    for (int j = 0; refused[j]; j++) {
        json_t *v = parse(refused[j]);
        sw_error verr;
        assert_int_not_equal(eng_json_validate(s, v, &verr), SW_OK);
        json_decref(v);
        if (whole(g, refused[j]))
            fail_msg("%s: %s is accepted", name, refused[j]);
    }
    json_t *rec = sc_record("combine", name, s);
    walks(g, s, name, sc_outputs(rec));
    json_array_append_new(g_records, rec);
    eng_grammar_free(g);
    json_decref(s);
}

/* Wide oneOfs whose alternatives overlap their neighbours: 30 object
 * shapes (shape i declares k_i..k_i+4, requires k_i), 64 integer ranges
 * [3i, 3i+5]. Excluding the others stays within the merge bound; where
 * the branches would pass 64, alternatives keep fewer ways of excluding
 * (a narrowing), and so do the branches of a wide anyOf. */
static void test_wide_oneof(void **state)
{
    (void)state;
    char *text = malloc(65536);
    assert_non_null(text);
    size_t n = (size_t)sprintf(text, "{\"oneOf\":[");
    for (int i = 0; i < 30; i++) {
        n += (size_t)sprintf(text + n, "%s{\"type\":\"object\",\"properties\":{", i ? "," : "");
        for (int j = i; j < i + 5; j++)
            n += (size_t)sprintf(text + n, "%s\"k%d\":{\"type\":\"string\"}", j > i ? "," : "", j);
        n += (size_t)sprintf(text + n, "},\"required\":[\"k%d\"]}", i);
    }
    sprintf(text + n, "]}");
    static const char *const shapes_ok[] = {"{\"k0\":\"a\"}", NULL};
    static const char *const shapes_bad[] = {"{\"k0\":\"a\",\"k1\":\"b\"}", "{}", NULL};
    check_schema("oneOf of 30 overlapping object shapes", text, shapes_ok, shapes_bad);
    n = (size_t)sprintf(text, "{\"oneOf\":[");
    for (int i = 0; i < 64; i++)
        n += (size_t)sprintf(text + n, "%s{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}",
                             i ? "," : "", 3 * i, 3 * i + 5);
    sprintf(text + n, "]}");
    static const char *const ranges_ok[] = {"1", "2", NULL};
    static const char *const ranges_bad[] = {"4", "5", "-1", NULL};
    check_schema("oneOf of 64 overlapping integer ranges", text, ranges_ok, ranges_bad);
    /* 40 untyped alternatives, 5 branches each: the widest keep one */
    n = (size_t)sprintf(text, "{\"anyOf\":[");
    for (int i = 0; i < 40; i++)
        n += (size_t)sprintf(text + n, "%s{\"title\":\"t%d\"}", i ? "," : "", i);
    sprintf(text + n, "]}");
    static const char *const wide_ok[] = {"1", "\"xyz\"", "null", "[]", "{}", "true", NULL};
    static const char *const wide_bad[] = {NULL};
    check_schema("anyOf of 40 untyped alternatives", text, wide_ok, wide_bad);
    free(text);
}

/* What no positive schema can stand for is refused, naming it. */
static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *message;
    } cases[] = {
        {"{\"type\":\"integer\",\"not\":{\"multipleOf\":3}}", "'not' of 'multipleOf'"},
        {"{\"type\":\"array\",\"not\":{\"uniqueItems\":true}}", "'not' of 'uniqueItems'"},
        /* U+0000 where the compiler reads a name: refused, never cut short
         * (required "a\u0000" is not "a") */
        {"{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"object\",\"properties\":"
         "{\"a\":{\"type\":\"string\"}},\"required\":[\"a\\u0000\"]}}}",
         "#/properties/title/required"},
        {"{\"type\":\"string\",\"format\":\"date\\u0000\"}", "U+0000"},
        {"{\"type\":[\"string\\u0000\"]}", "#/type"},
        {"{\"type\":\"integer\",\"not\":{\"if\":{\"minimum\":10},\"then\":{\"multipleOf\":2}}}",
         "'not' of 'multipleOf'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *s = parse(cases[i].schema);
        eng_grammar *g = NULL;
        sw_error err;
        sw_error_clear(&err);
        int rc = eng_grammar_from_schema(s, &g, &err);
        if (rc != SW_EUNSUPPORTED || !strstr(err.message, cases[i].message))
            fail_msg("%s: got %d (%s), expected a refusal naming %s", cases[i].schema, rc,
                     err.message, cases[i].message);
        json_decref(s);
    }
}

/* Hostile nestings of not end in a typed answer, never a hang. */
static void test_hostile(void **state)
{
    (void)state;
    static const char *const cases[] = {
        "{\"not\":{\"$ref\":\"#\"}}",
        "{\"$defs\":{\"a\":{\"not\":{\"$ref\":\"#/$defs/b\"}},\"b\":{\"not\":{\"$ref\":"
        "\"#/$defs/a\"},\"type\":\"object\"}},\"$ref\":\"#/$defs/a\"}",
        "{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#\"}},\"not\":{\"$ref\":\"#\"}}",
        "{\"not\":{\"anyOf\":[{\"not\":{\"anyOf\":[{\"minLength\":1},{\"maxLength\":3}]}},"
        "{\"oneOf\":[{\"pattern\":\"a\"},{\"pattern\":\"b\"},{\"pattern\":\"c\"}]}]}}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *s = parse(cases[i]);
        eng_grammar *g = NULL;
        sw_error err;
        sw_error_clear(&err);
        int rc = eng_grammar_from_schema(s, &g, &err);
        assert_true(rc == SW_OK || rc == SW_EUNSUPPORTED || rc == SW_EINVAL);
        if (rc == SW_OK) {
            json_t *outs = json_array();
            walks(g, s, cases[i], outs);
            json_decref(outs);
        }
        eng_grammar_free(g);
        json_decref(s);
    }
}

static void test_python_check(void **state)
{
    (void)state;
    if (sc_check(g_records, "combine") > 0)
        fail_msg("python3-jsonschema found invalid outputs (listed above)");
}

static int setup(void **state)
{
    (void)state;
    g_vocab = tu_byte_vocab();
    g_records = json_array();
    return g_vocab && g_records ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    eng_cs_vocab_free(g_vocab);
    json_decref(g_records);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_wide_oneof),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_python_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
