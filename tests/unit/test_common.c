/* test_common.c - error table, allocation hook, arena, byte-size parsing,
 * UTF-8 repair. */
#include "testutil.h"

#include "common/alloc.h"
#include "common/arena.h"
#include "common/error.h"
#include "common/utf8.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static void test_error_messages(void **state)
{
    (void)state;
    sw_error err;
    assert_string_equal(sw_strerror(SW_OK), "success");
    assert_string_equal(sw_strerror(SW_EDEVOOM), "device out of memory");
    assert_string_equal(sw_strerror(-9999), "unknown error");
    assert_string_equal(sw_status_name(SW_EFORMAT), "EFORMAT");
    assert_int_equal(sw_error_set(&err, SW_EFORMAT, "key %s broken", "x"), SW_EFORMAT);
    assert_int_equal(err.code, SW_EFORMAT);
    assert_string_equal(err.message, "key x broken");
    assert_int_equal(sw_error_set(NULL, SW_EIO, "ignored"), SW_EIO);
}

static void test_alloc_fail_after(void **state)
{
    (void)state;
    sw_alloc_fail_after(2);
    void *a = sw_malloc(16);
    void *b = sw_malloc(16);
    void *c = sw_malloc(16); /* the third call from now fails */
    void *d = sw_malloc(16); /* and only that one */
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c);
    assert_non_null(d);
    sw_free(a);
    sw_free(b);
    sw_free(d);
    sw_alloc_fail_after(0);
    assert_null(sw_strdup("x"));
    assert_null(sw_calloc(SIZE_MAX / 2, 4)); /* overflow, not a huge malloc */
    sw_alloc_fail_after(-1);
    char *e = sw_strdup("hello");
    assert_string_equal(e, "hello");
    sw_free(e);
}

/* Fault scopes: only the allocations made while a scope is current
 * count, the one asked for fails (once), the count is published for
 * /metrics, and the thread's failure count moves. */
static void test_alloc_scope(void **state)
{
    (void)state;
    sw_alloc_scope scope;
    sw_alloc_scope_init(&scope, 2);
    void *outside = sw_malloc(8); /* before the scope: not counted */
    long failures = sw_alloc_thread_failures();
    sw_alloc_scope *prev = sw_alloc_scope_swap(&scope);
    void *a = sw_malloc(8), *b = sw_calloc(2, 8), *c = sw_malloc(8), *d = sw_realloc(NULL, 8);
    assert_ptr_equal(sw_alloc_scope_swap(prev), &scope);
    void *after = sw_malloc(8);
    assert_non_null(outside);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c);
    assert_non_null(d);
    assert_non_null(after);
    assert_int_equal(scope.calls, 4);
    assert_true(scope.failed);
    assert_int_equal(sw_alloc_thread_failures(), failures + 1);
    sw_alloc_scope_publish(&scope);
    char m[512];
    assert_true(sw_alloc_scope_metrics(m, sizeof m) > 0);
    assert_non_null(strstr(m, "spillway_fault_scope_allocations 4\n"));
    assert_non_null(strstr(m, "spillway_fault_allocations_failed_total "));
    sw_free(outside);
    sw_free(a);
    sw_free(b);
    sw_free(d);
    sw_free(after);

    long n = 0;
    assert_true(sw_alloc_scope_parse("alloc_fail_after:17", &n));
    assert_int_equal(n, 17);
    assert_true(sw_alloc_scope_parse("alloc_fail_after:-1", &n));
    assert_int_equal(n, -1);
    static const char *const bad[] = {"", "alloc_fail_after", "alloc_fail_after:", "x:1",
                                      "alloc_fail_after:1x", "alloc_fail_after:-2",
                                      "alloc_fail_after:99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(sw_alloc_scope_parse(bad[i], &n));

    /* the engine thread's form: its own kind, refused by the plain parse
     * (the router has no engine thread) */
    sw_alloc_thread thread = SW_ALLOC_THREAD_REQUEST;
    assert_true(sw_alloc_scope_parse_on("alloc_fail_after:engine:5", &thread, &n));
    assert_int_equal(thread, SW_ALLOC_THREAD_ENGINE);
    assert_int_equal(n, 5);
    assert_true(sw_alloc_scope_parse_on("alloc_fail_after:7", &thread, &n));
    assert_int_equal(thread, SW_ALLOC_THREAD_REQUEST);
    assert_false(sw_alloc_scope_parse("alloc_fail_after:engine:5", &n));
    assert_false(sw_alloc_scope_parse_on("alloc_fail_after:engine:", &thread, &n));
    assert_false(sw_alloc_scope_parse_on("alloc_fail_after:router:1", &thread, &n));
    /* its count is published as its own series */
    sw_alloc_scope engine;
    sw_alloc_scope_init_on(&engine, SW_ALLOC_THREAD_ENGINE, -1);
    prev = sw_alloc_scope_swap(&engine);
    void *e = sw_malloc(8);
    sw_alloc_scope_swap(prev);
    assert_non_null(e);
    sw_free(e);
    sw_alloc_scope_publish(&engine);
    assert_true(sw_alloc_scope_metrics(m, sizeof m) > 0);
    assert_non_null(strstr(m, "spillway_fault_scope_allocations 4\n"));
    assert_non_null(strstr(m, "spillway_fault_scope_allocations{thread=\"engine\"} 1\n"));
}

/* jansson through the hook: a call during which an allocation failed
 * fails as a whole (the loads say out of memory; a syntax error does
 * not), and the same call succeeds once the failure is spent. */
static void test_json_wrappers(void **state)
{
    (void)state;
    static const char text[] = "{\"key\":\"a value longer than sixteen bytes\",\"n\":[1,2,3]}";
    json_error_t e;
    long k = 0;
    for (;; k++) {
        long before = sw_alloc_count();
        sw_alloc_fail_after(k);
        json_t *j = sw_json_loads(text, 0, &e);
        bool fired = sw_alloc_count() - before > k;
        sw_alloc_fail_after(-1);
        if (!fired) {
            assert_non_null(j);
            char *s = sw_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
            assert_string_equal(s, text);
            free(s);
            for (long d = 0;; d++) { /* and every allocation of the dump */
                before = sw_alloc_count();
                sw_alloc_fail_after(d);
                s = sw_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
                fired = sw_alloc_count() - before > d;
                sw_alloc_fail_after(-1);
                if (!fired) {
                    assert_string_equal(s, text);
                    free(s);
                    break;
                }
                assert_null(s);
            }
            json_decref(j);
            break;
        }
        assert_null(j);
        assert_true(sw_json_error_oom(&e));
    }
    assert_true(k > 3);
    assert_null(sw_json_loadb("{\"a\":", 6, 0, &e));
    assert_false(sw_json_error_oom(&e));
}

static void test_arena(void **state)
{
    (void)state;
    sw_arena *arena = sw_arena_create(64 * 1024);
    assert_non_null(arena);
    for (int i = 0; i < 100; i++) {
        unsigned char *p = sw_arena_alloc(arena, 100, 64);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (int j = 0; j < 100; j++)
            assert_int_equal(p[j], 0);
        memset(p, 0xab, 100);
    }
    assert_int_equal(sw_arena_used(arena), 100 * 100);
    /* Over the cap: refused, not grown. */
    assert_null(sw_arena_alloc(arena, 128 * 1024, 8));
    sw_arena_reset(arena);
    assert_int_equal(sw_arena_used(arena), 0);
    char *s = sw_arena_strndup(arena, "abcdef", 3);
    assert_string_equal(s, "abc");
    /* A failing host allocation is a NULL, not a crash. */
    sw_alloc_fail_after(0);
    assert_null(sw_arena_alloc(arena, 32 * 1024, 8));
    sw_alloc_fail_after(-1);
    sw_arena_destroy(arena);
}

/* sw_utf8_repair: well-formed text is untouched; every byte of a broken
 * sequence (cut, overlong, surrogate, past U+10FFFF, stray continuation)
 * becomes '?', and the length never changes. */
static void test_utf8_repair(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain ascii", "plain ascii"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"cut \xc3", "cut ?"},                       /* a 2-byte sequence cut */
        {"cut \xe2\x82", "cut ??"},                 /* a 3-byte one */
        {"a\xe2\x82" "b", "a??b"},                     /* cut in the middle */
        {"\x80x", "?x"},                             /* a stray continuation */
        {"\xc0\xaf", "??"},                         /* an overlong '/' */
        {"\xed\xa0\x80", "???"},                   /* a surrogate */
        {"\xf4\x90\x80\x80", "????"},             /* past U+10FFFF */
        {"\xff\xfe", "??"},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", cases[i].in);
        sw_utf8_repair(buf);
        if (strcmp(buf, cases[i].out) != 0)
            fail_msg("case %zu: got '%s', want '%s'", i, buf, cases[i].out);
    }
}

/* sw_utf8_cut never ends inside a character; sw_utf8_sequence bounds its
 * look at avail bytes. */
static void test_utf8_cut(void **state)
{
    (void)state;
    const char s[] = "a\xc3\xa9\xe2\x82\xac" "b"; /* a, e-acute (2), euro (3), b */
    size_t len = sizeof s - 1;
    static const size_t want[] = {0, 1, 1, 3, 3, 3, 6, 7, 7};
    for (size_t n = 0; n <= len + 1; n++)
        assert_int_equal(sw_utf8_cut(s, len, n), want[n]);
    assert_int_equal(sw_utf8_sequence(s + 3, 3), 3);
    assert_int_equal(sw_utf8_sequence(s + 3, 2), 0); /* cut by avail */
    assert_int_equal(sw_utf8_sequence("\0", 1), 1);
    assert_int_equal(sw_utf8_sequence(s, 0), 0);
}

int main(void)
{
    sw_alloc_hook_jansson(); /* as the binary does: jansson's allocations counted */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_alloc_fail_after),
        cmocka_unit_test(test_alloc_scope),
        cmocka_unit_test(test_json_wrappers),
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_utf8_repair),
        cmocka_unit_test(test_utf8_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
