/* test_regex_cache.c - the process's cache of compiled patterns
 * (eng_regex_compile_cached, src/grammar/regex_cache.c).
 *
 * What the cache hands out must be what a fresh compile gives: the same
 * automaton (walked state by state against a fresh one), the same refusal
 * with the same code and message, and never a remembered out-of-memory.
 * Its bounds hold (entries, bytes), an evicted automaton stays alive for
 * the grammars that hold it (ASan checks the use and the frees), and
 * threads compiling, releasing and evicting at once agree on every answer
 * (`make test-tsan` runs this test under ThreadSanitizer).
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/regex.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_patterns[] = {
    "^abc$",
    "^[a-c]+$",
    "^(ab)*$",
    "^\\d{3}-\\d{4}$",
    "^\\p{L}+$",
    "[0-9a-f]{8}",
    "^(?:a|bc){2}$",
    "^a{2,4}$",
    "^.$",
    "^(\\p{L}|[0-9]){2,5}@[a-z]+$",
    "^(?!^b)(?=[a-z]*\\d)[a-z\\d]{2,5}$",
    "^[^\"\\\\]*$",
    "",
    "x|y|z",
    "^\\s*(true|false|null)\\s*$",
};
#define N_PATTERNS (sizeof g_patterns / sizeof *g_patterns)

/* Texts each pattern is matched on in the threads' test. */
static const char *const g_texts[] = {"abc", "ab", "123-4567", "caf\xc3\xa9", "deadbeef",
                                      "bca", "aaa", "x", "a1b2@xy", "a1", "", " true "};
#define N_TEXTS (sizeof g_texts / sizeof *g_texts)

static eng_regex *fresh(const char *pattern)
{
    eng_regex *re = NULL;
    sw_error err;
    if (eng_regex_compile(pattern, strlen(pattern), &re, &err))
        fail_msg("/%s/: %s", pattern, err.message);
    return re;
}

static eng_regex *cached(const char *pattern)
{
    eng_regex *re = NULL;
    sw_error err;
    if (eng_regex_compile_cached(pattern, strlen(pattern), &re, &err))
        fail_msg("/%s/ (cached): %s", pattern, err.message);
    assert_non_null(re);
    return re;
}

/* a and b accept the same strings state by state: walked together from
 * their starts, every pair agrees on each byte's step and on every flag. */
static void assert_same_automaton(const eng_regex *a, const eng_regex *b)
{
    int32_t n = eng_regex_n_states(a);
    assert_int_equal(n, eng_regex_n_states(b));
    int32_t *pair = malloc((size_t)n * sizeof *pair); /* a's state -> b's */
    int32_t *queue = malloc((size_t)n * sizeof *queue);
    assert_non_null(pair);
    assert_non_null(queue);
    for (int32_t i = 0; i < n; i++)
        pair[i] = -1;
    int32_t head = 0, tail = 0;
    pair[eng_regex_start(a)] = eng_regex_start(b);
    queue[tail++] = eng_regex_start(a);
    while (head < tail) {
        int32_t sa = queue[head++], sb = pair[sa];
        assert_int_equal(eng_regex_accepting(a, sa), eng_regex_accepting(b, sb));
        assert_int_equal(eng_regex_can_accept(a, sa), eng_regex_can_accept(b, sb));
        assert_int_equal(eng_regex_pending(a, sa), eng_regex_pending(b, sb));
        assert_int_equal(eng_regex_universal(a, sa), eng_regex_universal(b, sb));
        for (int c = 0; c < 256; c++) {
            int32_t ta = eng_regex_step(a, sa, (uint8_t)c), tb = eng_regex_step(b, sb, (uint8_t)c);
            assert_int_equal(ta < 0, tb < 0);
            if (ta < 0)
                continue;
            if (pair[ta] < 0) {
                pair[ta] = tb;
                queue[tail++] = ta;
            }
            assert_int_equal(pair[ta], tb);
        }
    }
    free(pair);
    free(queue);
}

static void test_same_as_fresh(void **state)
{
    (void)state;
    eng_regex_cache_clear();
    eng_regex_cache_stats s0, s1;
    eng_regex_cache_stats_get(&s0);
    for (size_t i = 0; i < N_PATTERNS; i++) {
        eng_regex *f = fresh(g_patterns[i]);
        eng_regex *c1 = cached(g_patterns[i]); /* compiled and kept */
        eng_regex *c2 = cached(g_patterns[i]); /* found */
        assert_ptr_equal(c1, c2);
        assert_same_automaton(f, c1);
        eng_regex_free(f);
        eng_regex_free(c1);
        assert_same_automaton(c2, c2); /* still alive with one holder gone */
        eng_regex_free(c2);
    }
    eng_regex_cache_stats_get(&s1);
    assert_int_equal(s1.misses - s0.misses, N_PATTERNS);
    assert_int_equal(s1.hits - s0.hits, N_PATTERNS);
    assert_int_equal(s1.entries, N_PATTERNS);
    assert_true(s1.bytes > 0);

    /* a pattern is its bytes: one more byte, or an embedded NUL, is another */
    eng_regex *a = cached("^ab$"), *b = NULL;
    sw_error err;
    assert_int_equal(eng_regex_compile_cached("^ab$\0", 5, &b, &err), SW_OK);
    assert_ptr_not_equal(a, b);
    assert_false(eng_regex_match(b, "ab", 2));
    assert_true(eng_regex_match(a, "ab", 2));
    eng_regex_free(a);
    eng_regex_free(b);
    eng_regex_cache_clear();
    eng_regex_cache_stats_get(&s1);
    assert_int_equal(s1.entries, 0);
    assert_int_equal(s1.bytes, 0);
}

static void test_refusals(void **state)
{
    (void)state;
    eng_regex_cache_clear();
    static const char *const refused[] = {"(a)\\1", "[z-a]", "\\p{Script=Greek}",
                                          "(", "a{100001}", "\xff",
                                          /* over the work bound: SW_ERANGE */
                                          "^(a|b)*a(a|b){20}$"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const char *p = refused[i];
        eng_regex *re = NULL;
        sw_error want, got;
        int code = eng_regex_compile(p, strlen(p), &re, &want);
        assert_int_not_equal(code, SW_OK);
        assert_int_not_equal(code, SW_ENOMEM);
        assert_null(re);
        for (int round = 0; round < 2; round++) { /* compiled, then found */
            eng_regex_cache_stats s0, s1;
            eng_regex_cache_stats_get(&s0);
            memset(&got, 0, sizeof got);
            re = (eng_regex *)&got; /* must be reset to NULL */
            assert_int_equal(eng_regex_compile_cached(p, strlen(p), &re, &got), code);
            assert_null(re);
            assert_int_equal(got.code, code);
            assert_string_equal(got.message, want.message);
            eng_regex_cache_stats_get(&s1);
            assert_int_equal(s1.hits - s0.hits, round == 1);
            assert_int_equal(s1.misses - s0.misses, round == 0);
        }
        /* no error to fill in: the code alone */
        assert_int_equal(eng_regex_compile_cached(p, strlen(p), &re, NULL), code);
    }
}

/* Out of memory is the moment's, not the pattern's: never remembered. */
static void test_no_memory_not_kept(void **state)
{
    (void)state;
    const char *p = "^(\\p{L}|[0-9]){2,5}@[a-z]+$";
    int failures = 0;
    for (long n = 0;; n++) {
        eng_regex_cache_clear();
        eng_regex *re = NULL;
        sw_alloc_fail_after(n);
        int rc = eng_regex_compile_cached(p, strlen(p), &re, NULL);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            assert_true(eng_regex_match(re, "ab@cd", 5));
            eng_regex_free(re);
            break;
        }
        assert_int_equal(rc, SW_ENOMEM);
        assert_null(re);
        failures++;
        /* the next call compiles it (a miss), and succeeds */
        eng_regex_cache_stats s0, s1;
        eng_regex_cache_stats_get(&s0);
        eng_regex *again = cached(p);
        eng_regex_cache_stats_get(&s1);
        assert_int_equal(s1.misses - s0.misses, 1);
        eng_regex_free(again);
    }
    assert_true(failures > 10);
    /* the key's own allocation failing: the automaton is returned, not kept */
    eng_regex_cache_clear();
    long total = 0;
    for (long n = 0;; n++) {
        eng_regex *re = NULL;
        sw_alloc_fail_after(n);
        int rc = eng_regex_compile(p, strlen(p), &re, NULL);
        sw_alloc_fail_after(-1);
        eng_regex_free(re);
        if (rc == SW_OK) {
            total = n;
            break;
        }
    }
    eng_regex *re = NULL;
    sw_alloc_fail_after(total); /* every allocation of the compile, none after */
    int rc = eng_regex_compile_cached(p, strlen(p), &re, NULL);
    sw_alloc_fail_after(-1);
    assert_int_equal(rc, SW_OK);
    assert_true(eng_regex_match(re, "ab@cd", 5));
    eng_regex_cache_stats s;
    eng_regex_cache_stats_get(&s);
    assert_int_equal(s.entries, 0);
    eng_regex_free(re);
}

static void test_bounds(void **state)
{
    (void)state;
    eng_regex_cache_clear();
    eng_regex_cache_limit(64, 0);
    eng_regex *first = cached("^a{1}b$"); /* held across its eviction */
    char p[64];
    for (int i = 2; i <= 300; i++) {
        snprintf(p, sizeof p, "^a{%d}b$", i);
        eng_regex_free(cached(p));
        eng_regex_cache_stats s;
        eng_regex_cache_stats_get(&s);
        assert_true(s.entries <= 64);
    }
    assert_true(eng_regex_match(first, "ab", 2)); /* evicted, still whole */
    assert_false(eng_regex_match(first, "aab", 3));
    eng_regex_free(first);

    /* least recently used first: a pattern found again outlives the rest */
    eng_regex_cache_clear();
    eng_regex_free(cached("^keep$"));
    for (int i = 0; i < 200; i++) {
        snprintf(p, sizeof p, "^x{%d}$", i + 1);
        eng_regex_free(cached(p));
        eng_regex_free(cached("^keep$"));
    }
    eng_regex_cache_stats s0, s1;
    eng_regex_cache_stats_get(&s0);
    assert_true(s0.evictions > 0);
    eng_regex_free(cached("^keep$"));
    eng_regex_cache_stats_get(&s1);
    assert_int_equal(s1.hits - s0.hits, 1);

    /* the byte bound, and a pattern over a quarter of it is never kept */
    eng_regex_cache_clear();
    eng_regex_cache_limit(ENG_REGEX_CACHE_ENTRIES, 64 << 10);
    for (int i = 1; i <= 150; i++) {
        snprintf(p, sizeof p, "^[a-z]{%d}$", i);
        eng_regex_free(cached(p));
        eng_regex_cache_stats_get(&s1);
        assert_true(s1.bytes <= (size_t)64 << 10);
    }
    assert_true(s1.evictions > s0.evictions);
    eng_regex_cache_clear();
    eng_regex_cache_limit(0, 4 << 10);
    eng_regex_free(cached("^[a-z]{200}$")); /* 200-odd states: > 1 KiB */
    eng_regex_cache_stats_get(&s1);
    assert_int_equal(s1.entries, 0);
    /* a smaller bound evicts at once */
    eng_regex_cache_limit(ENG_REGEX_CACHE_ENTRIES, ENG_REGEX_CACHE_BYTES);
    for (size_t i = 0; i < N_PATTERNS; i++)
        eng_regex_free(cached(g_patterns[i]));
    eng_regex_cache_limit(3, 0);
    eng_regex_cache_stats_get(&s1);
    assert_int_equal(s1.entries, 3);
    eng_regex_cache_limit(ENG_REGEX_CACHE_ENTRIES, 0);
    eng_regex_cache_clear();
}

/* ---- threads ------------------------------------------------------------ */

static bool g_want[N_PATTERNS][N_TEXTS];

typedef struct worker {
    pthread_t thread;
    unsigned seed;
    bool evicts; /* also clears and shrinks the cache as it goes */
    int wrong;
} worker;

static void *compile_loop(void *arg)
{
    worker *w = arg;
    eng_regex *held[8] = {0};
    for (int it = 0; it < 600; it++) {
        size_t k = (size_t)rand_r(&w->seed) % N_PATTERNS;
        eng_regex *re = NULL;
        if (eng_regex_compile_cached(g_patterns[k], strlen(g_patterns[k]), &re, NULL)) {
            w->wrong++;
            continue;
        }
        for (size_t t = 0; t < N_TEXTS; t++)
            if (eng_regex_match(re, g_texts[t], strlen(g_texts[t])) != g_want[k][t])
                w->wrong++;
        size_t slot = (size_t)it % 8; /* some held a while, across evictions */
        eng_regex_free(held[slot]);
        held[slot] = re;
        if (w->evicts && it % 50 == 0)
            eng_regex_cache_clear();
        if (w->evicts && it % 50 == 25)
            eng_regex_cache_limit(4 + (size_t)it % 7, 0);
    }
    for (int i = 0; i < 8; i++)
        eng_regex_free(held[i]);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_PATTERNS; k++) {
        eng_regex *re = fresh(g_patterns[k]);
        for (size_t t = 0; t < N_TEXTS; t++)
            g_want[k][t] = eng_regex_match(re, g_texts[t], strlen(g_texts[t]));
        eng_regex_free(re);
    }
    eng_regex_cache_clear();
    worker w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (worker){.seed = 1234u + (unsigned)i, .evicts = i == 0};
        assert_int_equal(pthread_create(&w[i].thread, NULL, compile_loop, &w[i]), 0);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(w[i].thread, NULL);
        assert_int_equal(w[i].wrong, 0);
    }
    eng_regex_cache_stats s;
    eng_regex_cache_stats_get(&s);
    assert_true(s.hits > 0);
    assert_true(s.evictions > 0);
    eng_regex_cache_limit(ENG_REGEX_CACHE_ENTRIES, 0);
    eng_regex_cache_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_fresh), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_no_memory_not_kept), cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
