/* test_gbnf_compile.c - GBNF grammars compiled into the constraint automaton
 * (src/grammar/gbnf_compile.c run by src/grammar/constrain.c).
 *
 * Against the parser's reference matcher (eng_gbnf_match): fed byte by
 * byte, a text is accepted as complete exactly when it is in the
 * grammar's language, and every prefix of such a text is accepted; texts
 * sampled at random from the token masks (a vocabulary of single bytes and
 * longer pieces, the budget shrinking each step) always complete within
 * the budget and are in the language. Grammars that cannot be compiled
 * are refused with typed errors: parse errors with their line and column,
 * left recursion naming the rule, no finite text, too large.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/constrain.h"
#include "grammar/gbnf.h"
#include "grammar/regex.h"
#include "gbnf_testdata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_expr =
    "root ::= expr\n"
    "expr ::= term (([+*] | \" - \") term)*\n"
    "term ::= [0-9]{1,3} | \"(\" expr \")\" | \"-\" term\n";

static const char *const g_list =
    "root ::= \"[\" items? \"]\"\n"
    "items ::= item (\", \" items)?\n"
    "item ::= [a-z]+ | \"'\" [^']* \"'\"\n";

/* Ambiguous on purpose: where a word ends is decided only later. */
static const char *const g_ambiguous =
    "root ::= word word? \"!\" | word \"?\"\n"
    "word ::= [a-c]* \"c\"\n";

typedef struct mcase {
    const char *grammar, *text;
} mcase;

static const mcase g_cases[] = {
    {NULL, "{}"},
    {NULL, "{\"a\":1}"},
    {NULL, "{ \"a\" : [1, 2.5e3, true, null, {\"b\":\"x\\ny\"}] }"},
    {NULL, "{\"a\":}"},
    {NULL, "[1]"},
    {NULL, "{\"a\":01}"},
    {NULL, "{\"k\":\"\\u00e9\"}"},
    {NULL, "{\"k\":\"\\u00g9\"}"},
    {NULL, "{\"k\":[[[{\"z\":[]}]]]}"},
    {NULL, "{\"k\":\"é😀\"} "},
    {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+\n", "12+3-4"},
    {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+\n", "12+"},
    {"root ::= \"a\"{2,3}", "aa"},
    {"root ::= \"a\"{2,3}", "aaaa"},
    {"root ::= \"a\"{2,}", "aaaaa"},
    {"root ::= [α-ω]+ \"é\"", "αβé"},
    {"root ::= [α-ω]+ \"é\"", "aé"},
    {"root ::= [^a-c]*", "xyz\n"},
    {"root ::= [^a-c]*", "xbz"},
    {"root ::= . . .", "a😀c"},
    {"root ::= . . .", "ab"},
    {"root ::= a\na ::= \"x\" a | \"\"", "xxx"},
    {"root ::= a\na ::= \"x\" a | \"\"", ""},
    {"root ::= \"\"", ""},
    {"root ::= \"\"", "a"},
    {"root ::= ws\nws ::= [ ]*", "   "},
    {"root ::= ( \"ab\" | \"a\" ) \"b\"? \"c\"", "abc"},
    {"root ::= ( \"ab\" | \"a\" ) \"b\"? \"c\"", "ac"},
    {"root ::= ( \"ab\" | \"a\" ) \"b\"? \"c\"", "abbc"},
    {"root ::= ( \"ab\" | \"a\" ) \"b\"? \"c\"", "abbbc"},
    {"root ::= x{3}\nx ::= \"(\" y? \")\"\ny ::= x+", "()(())(()())"},
    {"root ::= x{3}\nx ::= \"(\" y? \")\"\ny ::= x+", "()(()"},
    {"root ::= [\\x00-\\x7F]{0,2} \"z\"", "\x7f\x01z"},
    {"root ::= [\\x00-\\x7F]{0,2} \"z\"", "abcz"},
    {NULL, NULL},
};

static const char *const g_pieces_multi[] = {
    "true", "false", "null", "\":", "{\"", "  ", "12", "ab", "\",\"", "é", "😀", "\xC3",
    "[1,", "}]", "(", ")(", "- ", " - ", "'x'", "cc", "c!", "abc", "\\u00", "\"}", NULL,
};

static eng_cs_vocab *vocab(int32_t *n_out)
{
    const char *pieces[300];
    size_t lens[300];
    char bytes[256];
    int32_t n = 0;
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[n] = &bytes[i];
        lens[n++] = 1;
    }
    for (int i = 0; g_pieces_multi[i]; i++) {
        pieces[n] = g_pieces_multi[i];
        lens[n++] = strlen(g_pieces_multi[i]);
    }
    int32_t end = n;
    pieces[n] = NULL;
    lens[n++] = 0;
    eng_cs_vocab *v = NULL;
    assert_int_equal(eng_cs_vocab_create_from_pieces(pieces, lens, n, &end, 1, &v, NULL), SW_OK);
    *n_out = n;
    return v;
}

static eng_grammar *compile(const char *text)
{
    eng_grammar *g = NULL;
    sw_error err;
    if (eng_grammar_from_gbnf(text, strlen(text), &g, &err))
        fail_msg("grammar does not compile: %s\n%s", err.message, text);
    return g;
}

static void test_verdicts(void **state)
{
    (void)state;
    int32_t n_tok;
    eng_cs_vocab *v = vocab(&n_tok);
    for (size_t i = 0; g_cases[i].text; i++) {
        const char *gr = g_cases[i].grammar ? g_cases[i].grammar : tu_gbnf_json;
        const char *text = g_cases[i].text;
        eng_gbnf *ref = NULL;
        assert_int_equal(eng_gbnf_parse(gr, strlen(gr), &ref, NULL), SW_OK);
        bool want = eng_gbnf_match(ref, text, strlen(text));
        eng_gbnf_free(ref);
        eng_grammar *g = compile(gr);
        eng_constraint *c = NULL;
        assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
        /* byte by byte: every prefix of a text in the language is taken */
        bool fed = true;
        for (size_t k = 0; fed && text[k]; k++)
            fed = eng_constraint_feed(c, text + k, 1);
        bool got = fed && eng_constraint_is_complete(c);
        if (got != want || (want && !fed))
            fail_msg("case %zu '%s': automaton %d (fed %d), reference %d", i, text, got, fed, want);
        eng_constraint_free(c);
        eng_grammar_free(g);
    }
    eng_cs_vocab_free(v);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Samples a text from the masks: uniform over allowed tokens, with the
 * end token taken half the time it is allowed. */
static void sample_runs(const char *gr, int runs, int budget)
{
    int32_t n_tok;
    eng_cs_vocab *v = vocab(&n_tok);
    eng_grammar *g = compile(gr);
    eng_gbnf *ref = NULL;
    assert_int_equal(eng_gbnf_parse(gr, strlen(gr), &ref, NULL), SW_OK);
    uint32_t *mask = sw_malloc(((size_t)n_tok + 31) / 32 * sizeof *mask);
    int32_t *allowed = sw_malloc((size_t)n_tok * sizeof *allowed);
    char *text = sw_malloc((size_t)budget * 8 + 1);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int run = 0; run < runs; run++) {
        eng_constraint *c = NULL;
        assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
        size_t len = 0;
        bool ended = false;
        for (int step = 0; step < budget && !ended; step++) {
            int32_t count = eng_constraint_mask(c, budget - step, mask), n = 0;
            if (count == 0)
                fail_msg("run %d step %d: nothing allowed after '%.*s'", run, step, (int)len, text);
            bool end_ok = false;
            for (int32_t id = 0; id < n_tok; id++) {
                if (!(mask[id >> 5] >> (id & 31) & 1u))
                    continue;
                if (eng_constraint_is_end_token(c, id))
                    end_ok = true;
                else
                    allowed[n++] = id;
            }
            if (end_ok && (n == 0 || rng_next(&seed) % 2 == 0)) {
                assert_true(eng_constraint_accept_token(c, n_tok - 1));
                ended = true;
                break;
            }
            int32_t id = allowed[rng_next(&seed) % (uint64_t)n];
            assert_true(id < 256 || id >= 256); /* an id of the vocabulary */
            assert_true(eng_constraint_accept_token(c, id));
            if (id < 256) {
                text[len++] = (char)id;
            } else {
                size_t l = strlen(g_pieces_multi[id - 256]);
                memcpy(text + len, g_pieces_multi[id - 256], l);
                len += l;
            }
        }
        if (!ended)
            assert_true(eng_constraint_is_complete(c));
        if (getenv("GBNF_SHOW"))
            printf("%.*s\n", (int)len, text);
        if (!eng_gbnf_match(ref, text, len))
            fail_msg("run %d: sampled '%.*s' is not in the language", run, (int)len, text);
        eng_constraint_free(c);
    }
    sw_free(mask);
    sw_free(allowed);
    sw_free(text);
    eng_gbnf_free(ref);
    eng_grammar_free(g);
    eng_cs_vocab_free(v);
}

static void test_sampled(void **state)
{
    (void)state;
    sample_runs(tu_gbnf_json, 40, 40);
    sample_runs(g_expr, 40, 24);
    sample_runs(g_list, 40, 20);
    sample_runs(g_ambiguous, 40, 12);
    sample_runs("root ::= [^\\x00]{2,5} \"!\"", 20, 10);
    sample_runs("root ::= (\"<\" root \">\")? \"x\"", 20, 40);
}

/* The shortest text must fit the budget: with exactly that many tokens
 * left every run still completes (checked in sample_runs), and one fewer
 * allows nothing at the start. */
static void test_budget(void **state)
{
    (void)state;
    int32_t n_tok;
    eng_cs_vocab *v = vocab(&n_tok);
    eng_grammar *g = compile("root ::= \"<\" [a-z]{3} \">\" tail\ntail ::= \"\" | \"!\" tail");
    assert_int_equal(eng_grammar_min_bytes(g), 5);
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    uint32_t mask[(300 + 31) / 32];
    assert_int_equal(eng_constraint_mask(c, 4, mask), 0);
    assert_true(eng_constraint_mask(c, 5, mask) > 0);
    assert_true(eng_constraint_feed(c, "<abc>", 5));
    assert_true(eng_constraint_is_complete(c));
    assert_false(eng_constraint_is_closed(c));
    assert_true(eng_constraint_feed(c, "!!", 2));
    assert_false(eng_constraint_feed(c, "?", 1));
    eng_constraint_free(c);
    eng_grammar_free(g);
    /* ambiguous enough to fill the state's 8 stacks: the ones kept are
     * those closest to the end, so with the budget at exactly the
     * shortest completion some token still leads there (a fuzz find) */
    g = compile("root ::= x{3}\nx ::= \"(\" y? \"(\"\ny ::= x+\n");
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    assert_true(eng_constraint_feed(c, "(((((((((((", 11));
    for (int64_t min; (min = eng_constraint_min_bytes(c)) > 0;) {
        assert_true(eng_constraint_mask(c, min, mask) > 0);
        assert_true(eng_constraint_feed(c, "(", 1));
        assert_true(eng_constraint_min_bytes(c) < min);
    }
    eng_constraint_free(c);
    eng_grammar_free(g);
    eng_cs_vocab_free(v);
}

typedef struct ecase {
    const char *grammar;
    int code;
    const char *message; /* a part of it */
} ecase;

static const ecase g_errors[] = {
    {"root ::= \"a\" |\n  \"b\" )\n", SW_EINVAL, "line 2, column 7"},
    {"root ::= x\n", SW_EINVAL, "'x'"},
    {"root ::= expr\nexpr ::= expr \"+\" [0-9] | [0-9]\n", SW_EINVAL, "'expr' is left-recursive"},
    {"root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"\n", SW_EINVAL, "left-recursive"},
    /* left recursion in a rule the root reaches only after a byte (it
     * recursed without end, a stack overflow, when only the root's first
     * nodes were checked) */
    {"root ::= . a\na ::= \"x\"* a | \"y\"\n", SW_EINVAL, "'a' is left-recursive"},
    {"root ::= \"x\" root\n", SW_EINVAL, "no finite text"},
    {"root ::= \"(\" root \")\" | \"(\" root\n", SW_EINVAL, "no finite text"},
    {"root ::= a\na ::= \"(\" a \")\" | \"(\" b \")\"\nb ::= \"[\" b \"]\" | \"[\" a", SW_EINVAL,
     "no finite text"},
    {NULL, 0, NULL},
};

static void test_errors(void **state)
{
    (void)state;
    for (size_t i = 0; g_errors[i].grammar; i++) {
        eng_grammar *g = NULL;
        sw_error err;
        int rc = eng_grammar_from_gbnf(g_errors[i].grammar, strlen(g_errors[i].grammar), &g, &err);
        if (rc != g_errors[i].code || !strstr(err.message, g_errors[i].message))
            fail_msg("case %zu: rc %d '%s'", i, rc, err.message);
        assert_null(g);
    }
    /* nesting: the shortest text of root needs 20 levels */
    char deep[2048] = "root ::= r0\n";
    for (int i = 0; i < 20; i++)
        snprintf(deep + strlen(deep), sizeof deep - strlen(deep),
                 "r%d ::= \"(\" r%d \")\" | \"(\" r%d \"]\"\n", i, i + 1, i + 1);
    snprintf(deep + strlen(deep), sizeof deep - strlen(deep), "r20 ::= \"x\" | \"{\" r0 \"}\"\n");
    eng_grammar *g = NULL;
    sw_error err;
    assert_int_equal(eng_grammar_from_gbnf(deep, strlen(deep), &g, &err), SW_ERANGE);
    assert_non_null(strstr(err.message, "nested too deeply"));
}

/* A regular part whose automaton is too large is built from its pieces. */
static void test_large_parts(void **state)
{
    (void)state;
    int32_t n_tok;
    eng_cs_vocab *v = vocab(&n_tok);
    eng_grammar *g = compile("root ::= [a-z]{9000} \"!\"\n");
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    char *text = sw_malloc(9001);
    memset(text, 'q', 9000);
    text[9000] = '!';
    assert_true(eng_constraint_feed(c, text, 8999));
    assert_false(eng_constraint_feed(c, "!", 1));
    assert_true(eng_constraint_feed(c, text + 8999, 2));
    assert_true(eng_constraint_is_closed(c));
    sw_free(text);
    eng_constraint_free(c);
    eng_grammar_free(g);
    /* a pattern whose automaton explodes: nodes over its pieces */
    g = compile("root ::= (\"a\" | \"b\")* \"a\" (\"a\" | \"b\"){30}\n");
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    const char *t = "bba" "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"; /* 30 after the a */
    assert_true(eng_constraint_feed(c, t, strlen(t)));
    assert_true(eng_constraint_is_complete(c));
    eng_constraint_free(c);
    eng_grammar_free(g);
    /* many of them: refused, in bounded time */
    char many[4096] = "root ::= e0";
    for (int i = 1; i < 10; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), " e%d", i);
    for (int i = 0; i < 10; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many),
                 "\ne%d ::= [a-c]* \"a\" [a-c]{18} \"%d\"", i, i);
    sw_error err;
    assert_int_equal(eng_grammar_from_gbnf(many, strlen(many), &g, &err), SW_ERANGE);
    assert_non_null(strstr(err.message, "too complex"));
    eng_cs_vocab_free(v);
}

static void test_alloc_faults(void **state)
{
    (void)state;
    for (long n = 0;; n++) {
        eng_regex_cache_clear(); /* every compile a miss: its allocations counted too */
        sw_alloc_fail_after(n);
        eng_grammar *g = NULL;
        int rc = eng_grammar_from_gbnf(tu_gbnf_json, strlen(tu_gbnf_json), &g, NULL);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            eng_grammar_free(g);
            break;
        }
        assert_true(rc == SW_ENOMEM || rc == SW_ERANGE);
        assert_null(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verdicts),     cmocka_unit_test(test_sampled),
        cmocka_unit_test(test_budget),       cmocka_unit_test(test_errors),
        cmocka_unit_test(test_large_parts),  cmocka_unit_test(test_alloc_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
