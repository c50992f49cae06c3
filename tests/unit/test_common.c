/* test_common.c - error table, allocation hook, arena, byte-size parsing,
 * UTF-8 repair. */
#include "testutil.h"

#include "common/alloc.h"
#include "common/arena.h"
#include "common/error.h"
#include "common/utf8.h"

#include <stdint.h>
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_alloc_fail_after),
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_utf8_repair),
        cmocka_unit_test(test_utf8_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
