/* test_gbnf_derive.c - the derivative of a GBNF grammar by a text
 * (eng_gbnf_derive, src/grammar/gbnf_derive.c), checked by its meaning:
 * for grammars with literals, classes, bounded and unbounded repetitions,
 * alternations, nested and recursive rules and JSON, each sample string
 * is cut at every character; where the cut's text begins some string of
 * the grammar, the derivative (which both the parser and the compiler
 * take) accepts a rest exactly when the original accepts the text then
 * that rest, for the rest of every sample cut anywhere. A text that leaves
 * the grammar, one that ends inside a UTF-8 character and a left-recursive
 * grammar are refused with their typed errors, and failed allocations
 * are reported (ASan checks nothing leaks).
 *
 * Compiled JSON schemas written as GBNF (eng_grammar_to_gbnf,
 * src/grammar/json_schema_gbnf.c): the grammar accepts a text exactly
 * when the constraint automaton takes it whole, on valid and invalid
 * samples and splices of two samples at every place; and its derivative
 * by each sample cut anywhere (inside a key, a string, a number, between
 * members) accepts a rest exactly when the grammar accepts the cut text
 * then that rest. What has no GBNF form
 * (a multiple) is SW_EUNSUPPORTED.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/constrain.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "gbnf_testdata.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

typedef struct dcase {
    const char *grammar;
    const char *samples[12]; /* NULL ends */
} dcase;

static const dcase g_cases[] = {
    /* a literal cut midway, alternatives sharing a start */
    {"root ::= \"hello\" | \"help\" | \"he\"", {"hello", "help", "he", "hex", "hellos", ""}},
    /* classes, negated classes and any character */
    {"root ::= [a-c]+ [^a-c] .", {"abx1", "ab", "cba\xc3\xa9\xe2\x82\xac", "a-b", "aa\n\t"}},
    /* a class that matches nothing, repeated and alone */
    {"root ::= []* \"a\" | [] \"b\" | \"c\" []?", {"a", "b", "c", "ca", ""}},
    /* bounded and unbounded repetitions */
    {"root ::= \"a\"{2,4} \"b\"{3} (\"c\" \"d\"?)*",
     {"aabbb", "aaaabbbcdcc", "aaaaabbb", "abbb", "aabb", "aabbbdc", "aaabbbcdd"}},
    /* a repetition of something that may be empty */
    {"root ::= (\"x\"?)* \"y\"", {"xxy", "y", "xyx", "xxxxy"}},
    /* nested and recursive rules */
    {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n",
     {"12+(3-4)", "(1+(2))", "((9)", "1+", "(1)+2-(3+(4-5))"}},
    /* right recursion: the stack does not grow with the text */
    {"root ::= a \"!\"\na ::= \"x\" a | \"\"", {"xxxxxxxxxxxx!", "!", "xx!x"}},
    /* non-ASCII and the escapes the printer writes */
    {"root ::= \"\\\"caf\\u00e9-[]\\\\\" [\\x00-\\x1F^-]*",
     {"\"caf\xc3\xa9-[]\\\x01^-", "\"caf\xc3\xa9-[]\\", "\"cafe"}},
    /* JSON, cut inside strings, numbers and between members */
    {NULL,
     {"{\"a\": 1, \"bc\": \"x\\ny\"}", "{\"a\":[1,2.5e3,true,null]}", "{}",
      "{\"k\":\"\\u00e9\"} ", "{\"a\":01}", "{\"a\" :{\"b\":{}}}"}},
};

static void check_case(const dcase *c)
{
    const char *gr = c->grammar ? c->grammar : tu_gbnf_json;
    eng_gbnf *g = NULL;
    sw_error err;
    if (eng_gbnf_parse(gr, strlen(gr), &g, &err))
        fail_msg("%s: %s", gr, err.message);
    size_t n_samples = 0;
    while (n_samples < 12 && c->samples[n_samples])
        n_samples++;
    int viable = 0;
    for (size_t si = 0; si < n_samples; si++) {
        const char *s = c->samples[si];
        size_t len = strlen(s);
        for (size_t cut = 0; cut <= len; cut++) {
            if (cut < len && ((unsigned char)s[cut] & 0xC0) == 0x80)
                continue; /* inside a character */
            char *rest_g = NULL;
            int rc = eng_gbnf_derive(g, s, cut, &rest_g, &err);
            if (rc) {
                /* refused: then no sample starting with this text matches */
                assert_int_equal(rc, SW_EINVAL);
                for (size_t o = 0; o < n_samples; o++)
                    if (!strncmp(c->samples[o], s, cut))
                        assert_false(eng_gbnf_match(g, c->samples[o], strlen(c->samples[o])));
                continue;
            }
            viable++;
            eng_gbnf *d = NULL;
            if (eng_gbnf_parse(rest_g, strlen(rest_g), &d, &err))
                fail_msg("the derivative of \"%.*s\" does not parse (%s):\n%s", (int)cut, s,
                         err.message, rest_g);
            eng_grammar *compiled = NULL;
            if (eng_grammar_from_gbnf(rest_g, strlen(rest_g), &compiled, &err))
                fail_msg("the derivative of \"%.*s\" does not compile (%s):\n%s", (int)cut, s,
                         err.message, rest_g);
            eng_grammar_free(compiled);
            /* every rest of every sample, after this text */
            for (size_t o = 0; o < n_samples; o++) {
                const char *t = c->samples[o];
                size_t tl = strlen(t);
                for (size_t from = 0; from <= tl; from++) {
                    if (from < tl && ((unsigned char)t[from] & 0xC0) == 0x80)
                        continue;
                    char whole[256];
                    assert_true(cut + tl - from < sizeof whole);
                    memcpy(whole, s, cut);
                    memcpy(whole + cut, t + from, tl - from);
                    bool want = eng_gbnf_match(g, whole, cut + tl - from);
                    bool got = eng_gbnf_match(d, t + from, tl - from);
                    if (want != got)
                        fail_msg("after \"%.*s\": \"%s\" %s by the derivative, %s by the "
                                 "grammar:\n%s",
                                 (int)cut, s, t + from, got ? "accepted" : "refused",
                                 want ? "accepted" : "refused", rest_g);
                }
            }
            eng_gbnf_free(d);
            sw_free(rest_g);
        }
    }
    assert_true(viable > 0);
    eng_gbnf_free(g);
}

static void test_meaning(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++)
        check_case(&g_cases[i]);
}

/* The printed form of a few: the rest of the literal, the repetition's
 * counts left, the old root under a new name. */
static void test_shape(void **state)
{
    (void)state;
    static const struct {
        const char *grammar, *text, *want;
    } cases[] = {
        {"root ::= \"hello\"", "he", "root ::= \"l\" \"l\" \"o\"\nroot-whole ::= \"hello\"\n"},
        {"root ::= \"a\"{2,5} \"b\"", "aaa",
         "root ::= \"a\" (\"a\")? \"b\" | \"b\"\nroot-whole ::= (\"a\"){2,5} \"b\"\n"},
        {"root ::= \"x\"", "x", "root ::= \"\"\nroot-whole ::= \"x\"\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eng_gbnf *g = NULL;
        sw_error err;
        assert_int_equal(eng_gbnf_parse(cases[i].grammar, strlen(cases[i].grammar), &g, &err), 0);
        char *out = NULL;
        assert_int_equal(eng_gbnf_derive(g, cases[i].text, strlen(cases[i].text), &out, &err), 0);
        assert_string_equal(out, cases[i].want);
        sw_free(out);
        eng_gbnf_free(g);
    }
}

static void test_refused(void **state)
{
    (void)state;
    eng_gbnf *g = NULL;
    sw_error err;
    const char *gr = "root ::= \"caf\\u00e9\" [a-z]*";
    assert_int_equal(eng_gbnf_parse(gr, strlen(gr), &g, &err), 0);
    char *out = NULL;
    /* leaves the grammar */
    assert_int_equal(eng_gbnf_derive(g, "cafe", 4, &out, &err), SW_EINVAL);
    assert_null(out);
    assert_non_null(strstr(err.message, "leaves the grammar at byte 3"));
    /* ends inside a character */
    assert_int_equal(eng_gbnf_derive(g, "caf\xc3", 4, &out, &err), SW_EINVAL);
    assert_non_null(strstr(err.message, "inside a UTF-8 character"));
    assert_int_equal(eng_gbnf_derive(g, "caf\xff", 4, &out, &err), SW_EINVAL);
    eng_gbnf_free(g);

    /* left recursion grows the stack without end */
    gr = "root ::= a\na ::= a \"x\" | \"y\"";
    assert_int_equal(eng_gbnf_parse(gr, strlen(gr), &g, &err), 0);
    assert_int_equal(eng_gbnf_derive(g, "y", 1, &out, &err), SW_ERANGE);
    assert_null(out);
    eng_gbnf_free(g);

    /* deeply nested text: past the depth bound, refused, not crashed */
    gr = "root ::= \"(\" root \")\" | \"\"";
    assert_int_equal(eng_gbnf_parse(gr, strlen(gr), &g, &err), 0);
    char deep[3000];
    memset(deep, '(', sizeof deep);
    assert_int_equal(eng_gbnf_derive(g, deep, sizeof deep, &out, &err), SW_ERANGE);
    assert_int_equal(eng_gbnf_derive(g, deep, 100, &out, &err), 0);
    sw_free(out);
    eng_gbnf_free(g);
}

static void test_alloc_failures(void **state)
{
    (void)state;
    eng_gbnf *g = NULL;
    sw_error err;
    assert_int_equal(eng_gbnf_parse(tu_gbnf_json, strlen(tu_gbnf_json), &g, &err), 0);
    const char *text = "{\"a\": [1, \"x";
    int failed = 0;
    for (int nth = 0; nth < 10000; nth++) {
        sw_alloc_fail_after(nth);
        char *out = NULL;
        int rc = eng_gbnf_derive(g, text, strlen(text), &out, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            sw_free(out);
            break;
        }
        assert_int_equal(rc, SW_ENOMEM);
        failed++;
    }
    assert_true(failed > 0);
    eng_gbnf_free(g);
}

/* The single bytes' vocabulary the automaton runs on. */
static eng_cs_vocab *g_bytes;

/* Whether the automaton of g takes text whole (every byte, then complete). */
static bool automaton_takes(const eng_grammar *g, const char *text, size_t len)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, g_bytes, &c, NULL), 0);
    bool ok = eng_constraint_feed(c, text, len) && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return ok;
}

typedef struct scase {
    const char *schema; /* NULL: response_format json_object */
    const char *samples[12];
} scase;

static const scase g_schemas[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
     "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
     "\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}",
     {"{\"name\":\"Tom\",\"age\":7}", "{\"name\":\"Tom\",\"age\":7,\"tags\":[\"a\",\"b\"],\"ok\":true}",
      "{\"name\":\"Tom\",\"ok\":true}", "{\"name\":\"a\\\"b\\\\n\",\"age\":-12,\"ok\":false}",
      "{\"age\":7,\"name\":\"x\"}", "{\"name\":\"Tomtomtomtom\",\"age\":1}",
      "{\"name\":\"Tom\",\"age\":07}", "{\"name\":\"\xc3\xa9\",\"age\":0,\"tags\":[\"a\",\"b\",\"c\",\"d\"]}",
      "{\"name\":\"x\",\"age\":1,\"tags\":[]}", "{\"name\":\"x\",\"age\":1,}"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"number\"},{\"enum\":[\"a\",\"bc\",null]}],"
     "\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":4}",
     {"[1.5]", "[-0.25,\"bc\"]", "[2,null,3,4]", "[2,null,3,4,5]", "[]", "[1,\"b\"]",
      "[1.1234567]", "[0,\"a\",-7]"}},
    {"{\"anyOf\":[{\"type\":\"string\",\"minLength\":2},{\"type\":\"object\","
     "\"additionalProperties\":{\"type\":\"number\"},\"maxProperties\":2}]}",
     {"\"ab\"", "\"a\"", "{}", "{\"x\":1,\"y\":2.5}", "{\"x\":1,\"y\":2,\"z\":3}", "{\"x\":\"s\"}"}},
    /* numbers with bounds, written digit by digit */
    {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":1234}",
     {"3", "2", "1234", "1235", "999", "0", "-1", "03", "12345", "100", "1199"}},
    {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":5.5}",
     {"0", "0.0", "0.001", "5", "5.5", "4.999999", "4.9999999", "6", "-1", "0.5", "1.", "1.0"}},
    {"{\"type\":\"integer\",\"minimum\":-20}",
     {"-20", "-21", "-0", "0", "123456789012345", "1234567890123456", "-5", "-200"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-2.5,"
     "\"maximum\":100}}",
     {"[-2,-2.5]", "[-3]", "[-1.75,100]", "[100.5]", "[99.999,0]", "[-0.0]", "[-2.4]"}},
    /* pattern strings: the automaton's states as rules, escapes, bounds */
    {"{\"type\":\"string\",\"pattern\":\"^[a-c]+\\\\/x$\",\"maxLength\":6}",
     {"\"ab/x\"", "\"ab\\/x\"", "\"abcabc/x\"", "\"a/x\"", "\"/x\"", "\"d/x\"",
      "\"a\\u002fx\"", "\"abca/x\""}},
    {"{\"type\":\"string\",\"pattern\":\"^Ã©[\\\\n\\\\t]?\"}",
     {"\"Ã©\"", "\"Ã©\\n\"", "\"Ã©\\u000a\"", "\"Ã©\\u000A\"",
      "\"Ã©\\txyz\"", "\"e\"", "\"Ã©\\u0009ð\"", "\"\"",
      "\"Ã©\\u0000\""}},
    {"{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}",
     {"{\"d\":\"2024-02-29\"}", "{\"d\":\"2023-02-29\"}", "{\"d\":\"2024-13-01\"}",
      "{\"d\":\"2024-1-01\"}", "{}", "{\"d\":\"1999-12-31\"}"}},
    {NULL,
     {"{}", "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", "{\"a\":true,\"b\":[]}", "[1]",
      "{\"a\":{\"b\":{\"c\":{\"d\":{}}}}}", "{\"a\":1.5e3}"}},
};

static void check_schema(const scase *c)
{
    eng_grammar *g = NULL;
    sw_error err;
    if (c->schema) {
        json_t *schema = json_loads(c->schema, 0, NULL);
        assert_non_null(schema);
        if (eng_grammar_from_schema(schema, &g, &err))
            fail_msg("%s: %s", c->schema, err.message);
        json_decref(schema);
    } else {
        assert_int_equal(eng_grammar_json_object(&g, &err), 0);
    }
    char *text = NULL;
    if (eng_grammar_to_gbnf(g, &text, &err))
        fail_msg("%s: %s", c->schema ? c->schema : "json_object", err.message);
    eng_gbnf *gb = NULL;
    if (eng_gbnf_parse(text, strlen(text), &gb, &err))
        fail_msg("the GBNF form does not parse (%s):\n%s", err.message, text);
    size_t n_samples = 0;
    while (n_samples < 12 && c->samples[n_samples])
        n_samples++;
    int valid = 0;
    for (size_t i = 0; i < n_samples; i++) {
        const char *s = c->samples[i];
        bool want = automaton_takes(g, s, strlen(s));
        if (eng_gbnf_match(gb, s, strlen(s)) != want)
            fail_msg("%s: the GBNF form %s it, the automaton %s it:\n%s", s,
                     want ? "refuses" : "accepts", want ? "takes" : "refuses", text);
        valid += want;
    }
    assert_true(valid > 0 && (size_t)valid < n_samples);
    /* and on splices: a sample's start, another's end from the same place */
    for (size_t i = 0; i < n_samples; i++) {
        for (size_t j = 0; j < n_samples; j++) {
            const char *a = c->samples[i], *b = c->samples[j];
            size_t la = strlen(a), lb = strlen(b);
            for (size_t at = 1; at < la && at < lb; at++) {
                char whole[512];
                assert_true(la + lb < sizeof whole);
                memcpy(whole, a, at);
                memcpy(whole + at, b + at, lb - at);
                size_t len = lb;
                if (automaton_takes(g, whole, len) != eng_gbnf_match(gb, whole, len))
                    fail_msg("%.*s: the GBNF form and the automaton disagree:\n%s", (int)len,
                             whole, text);
            }
        }
    }
    /* the derivative by every cut of every sample: a rest is accepted
     * exactly when the form (checked above against the automaton) accepts
     * the cut text then the rest */
    for (size_t si = 0; si < n_samples; si++) {
        const char *s = c->samples[si];
        size_t len = strlen(s);
        for (size_t cut = 0; cut <= len; cut++) {
            if (cut < len && ((unsigned char)s[cut] & 0xC0) == 0x80)
                continue;
            char *rest_g = NULL;
            if (eng_gbnf_derive(gb, s, cut, &rest_g, &err))
                continue; /* the text leaves it: checked in test_meaning */
            eng_gbnf *d = NULL;
            if (eng_gbnf_parse(rest_g, strlen(rest_g), &d, &err))
                fail_msg("derivative does not parse (%s):\n%s", err.message, rest_g);
            for (size_t o = 0; o < n_samples; o++) {
                const char *t = c->samples[o];
                size_t tl = strlen(t);
                for (size_t from = 0; from <= tl; from++) {
                    if (from < tl && ((unsigned char)t[from] & 0xC0) == 0x80)
                        continue;
                    char whole[512];
                    assert_true(cut + tl - from < sizeof whole);
                    memcpy(whole, s, cut);
                    memcpy(whole + cut, t + from, tl - from);
                    bool want = eng_gbnf_match(gb, whole, cut + tl - from);
                    if (eng_gbnf_match(d, t + from, tl - from) != want)
                        fail_msg("after \"%.*s\", \"%s\": the derivative %s it, the grammar "
                                 "%s the whole:\n%s",
                                 (int)cut, s, t + from, want ? "refuses" : "accepts",
                                 want ? "takes" : "refuses", rest_g);
                }
            }
            eng_gbnf_free(d);
            sw_free(rest_g);
        }
    }
    eng_gbnf_free(gb);
    sw_free(text);
    eng_grammar_free(g);
}

static void test_json_schema(void **state)
{
    (void)state;
    g_bytes = tu_byte_vocab();
    for (size_t i = 0; i < sizeof g_schemas / sizeof g_schemas[0]; i++)
        check_schema(&g_schemas[i]);
    eng_cs_vocab_free(g_bytes);
    g_bytes = NULL;
    /* no GBNF form: said, not guessed */
    static const char *const refused[] = {
        "{\"type\":\"integer\",\"multipleOf\":3}",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        json_t *schema = json_loads(refused[i], 0, NULL);
        eng_grammar *g = NULL;
        sw_error err;
        assert_int_equal(eng_grammar_from_schema(schema, &g, &err), 0);
        char *text = NULL;
        assert_int_equal(eng_grammar_to_gbnf(g, &text, &err), SW_EUNSUPPORTED);
        assert_null(text);
        assert_non_null(strstr(err.message, "no GBNF form"));
        eng_grammar_free(g);
        json_decref(schema);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meaning),
        cmocka_unit_test(test_shape),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_json_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
