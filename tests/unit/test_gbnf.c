/* test_gbnf.c - the GBNF parser (src/grammar/gbnf.c): grammars in
 * llama.cpp's syntax parse into rules, the reference matcher gives the
 * verdicts the grammar's meaning gives (derived by hand from each
 * grammar), malformed grammars are SW_EINVAL with the line and column,
 * oversized ones SW_ERANGE, and a failed allocation at any point is
 * reported (ASan checks nothing leaks).
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/gbnf.h"
#include "gbnf_testdata.h"

#include <string.h>

typedef struct mcase {
    const char *grammar, *text;
    bool match;
} mcase;

static const mcase g_match[] = {
    {NULL, "{}", true},
    {NULL, "{\"a\":1}", true},
    {NULL, "{ \"a\" : [1, 2.5e3, true, null, {\"b\":\"x\\ny\"}] }", true},
    {NULL, "{\"a\":}", false},
    {NULL, "[1]", false},                 /* the root is an object */
    {NULL, "{\"a\":01}", false},
    {NULL, "{\"k\":\"\\u00e9\"}", true},
    {NULL, "{\"k\":\"\\u00g9\"}", false},
    {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+\n", "12+3-4", true},
    {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+\n", "12+", false},
    {"root ::= \"a\"{2,3}", "aa", true},
    {"root ::= \"a\"{2,3}", "aaaa", false},
    {"root ::= \"a\"{2,}", "aaaaa", true},
    {"root ::= \"a\"{2}", "a", false},
    {"root ::= [α-ω]+ \"é\"", "αβé", true},
    {"root ::= [α-ω]+ \"é\"", "aé", false},
    {"root ::= [^a-c]*", "xyz", true},
    {"root ::= [^a-c]*", "xbz", false},
    {"root ::= . . .", "a😀c", true},
    {"root ::= . . .", "ab", false},
    {"root ::= \"x\" | # a comment\n  \"y\"\n", "y", true},
    {"root ::= (\n  \"x\"\n  \"y\"\n)", "xy", true},
    {"root ::= item+\nitem ::= \"\\x41\" | \"\\u00E9\" | \"\\U0001F600\"", "Aé😀", true},
    {"root ::= \"\\[\\]\\\\\\\"\"", "[]\\\"", true},
    {"root ::= [a\\-z]+", "-az", true},
    {"root ::= [a\\-z]+", "b", false},
    {"root ::= a\na ::= \"x\" a | \"\"", "xxx", true},
    {"root ::= \"\"", "", true},
    {"root ::= ws\nws ::= [ ]*", "   ", true},
};

static void test_match(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_match / sizeof g_match[0]; i++) {
        const char *gr = g_match[i].grammar ? g_match[i].grammar : tu_gbnf_json;
        eng_gbnf *g = NULL;
        sw_error err;
        if (eng_gbnf_parse(gr, strlen(gr), &g, &err))
            fail_msg("grammar %zu: %s", i, err.message);
        bool m = eng_gbnf_match(g, g_match[i].text, strlen(g_match[i].text));
        if (m != g_match[i].match)
            fail_msg("grammar %zu on '%s': got %d, want %d", i, g_match[i].text, m,
                     g_match[i].match);
        eng_gbnf_free(g);
    }
}

static void test_structure(void **state)
{
    (void)state;
    eng_gbnf *g = NULL;
    assert_int_equal(eng_gbnf_parse(tu_gbnf_json, strlen(tu_gbnf_json), &g, NULL), SW_OK);
    assert_int_equal(eng_gbnf_n_rules(g), 7);
    int32_t ws = eng_gbnf_rule(g, "ws");
    assert_true(ws >= 0);
    assert_string_equal(eng_gbnf_rule_name(g, ws), "ws");
    /* ws ::= | [ \t\n] ws : an ALT of an empty SEQ and a SEQ of two */
    const eng_gbnf_node *body = eng_gbnf_node_at(g, eng_gbnf_rule_body(g, ws));
    assert_int_equal(body->kind, ENG_GBNF_ALT);
    const eng_gbnf_node *a = eng_gbnf_node_at(g, body->first);
    assert_int_equal(a->kind, ENG_GBNF_SEQ);
    assert_int_equal(a->first, -1);
    const eng_gbnf_node *b = eng_gbnf_node_at(g, a->next);
    const eng_gbnf_node *cls = eng_gbnf_node_at(g, b->first);
    assert_int_equal(cls->kind, ENG_GBNF_CLASS);
    assert_int_equal(cls->n_ranges, 3);
    assert_int_equal(eng_gbnf_class_ranges(g, cls)[1].lo, '\t');
    const eng_gbnf_node *ref = eng_gbnf_node_at(g, cls->next);
    assert_int_equal(ref->kind, ENG_GBNF_REF);
    assert_int_equal(ref->rule, ws);
    assert_int_equal(eng_gbnf_rule(g, "nope"), -1);
    eng_gbnf_free(g);
}

static void test_errors(void **state)
{
    (void)state;
    char deep[300];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "root ::= ");
    for (int i = 0; i < 100; i++)
        strcat(deep, "(");
    const struct {
        const char *grammar;
        int code;
        const char *text;
    } cases[] = {
        {"root ::= value", SW_EINVAL, "'value'"},
        {"item ::= \"a\"", SW_EINVAL, "no 'root'"},
        {"root \"a\"", SW_EINVAL, "expected ::="},
        {"root ::= \"abc", SW_EINVAL, "unterminated string"},
        {"root ::= \"a\\q\"", SW_EINVAL, "unknown escape"},
        {"root ::= [z-a]", SW_EINVAL, "out of order"},
        {"root ::= [abc", SW_EINVAL, "unterminated character class"},
        {"root ::= \"a\"\nroot ::= \"b\"", SW_EINVAL, "defined twice"},
        {"root ::= \"a\"{3,2}", SW_EINVAL, "out of order"},
        {"root ::= \"a\"{}", SW_EINVAL, "expected a count"},
        {"root ::= (\"a\"", SW_EINVAL, "expected )"},
        {"root ::= \"a\" )", SW_EINVAL, "end of the rule"},
        {"root ::= \"\\xZZ\"", SW_EINVAL, "hex"},
        {"root ::= \"\\uD800\"", SW_EINVAL, "Unicode"},
        {"root ::= \"a\"{20000}", SW_ERANGE, "too large"},
        {"root ::= \"a\"\n\n  x ::= @", SW_EINVAL, "line 3, column 9"},
        {deep, SW_ERANGE, "nested too deeply"},
        {"root ::= \"\xff\"", SW_EINVAL, "UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eng_gbnf *g = NULL;
        sw_error err;
        int rc = eng_gbnf_parse(cases[i].grammar, strlen(cases[i].grammar), &g, &err);
        if (rc != cases[i].code || !strstr(err.message, cases[i].text))
            fail_msg("grammar %zu: got %d '%s', want %d with '%s'", i, rc,
                     rc ? err.message : "", cases[i].code, cases[i].text);
        assert_null(g);
    }
}

static void test_alloc_faults(void **state)
{
    (void)state;
    int failures = 0;
    for (long n = 0;; n++) {
        eng_gbnf *g = NULL;
        sw_alloc_fail_after(n);
        int rc = eng_gbnf_parse(tu_gbnf_json, strlen(tu_gbnf_json), &g, NULL);
        sw_alloc_fail_after(-1);
        eng_gbnf_free(g);
        if (rc == SW_OK)
            break;
        assert_int_equal(rc, SW_ENOMEM);
        failures++;
    }
    assert_true(failures > 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match),
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_alloc_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
