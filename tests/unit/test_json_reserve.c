/* test_json_reserve.c - jansson never sees a NULL, even when malloc
 * really runs dry (alloc.c, jansson's reserve).
 *
 * jansson 2.14's lexer drops a byte it cannot append to a token and then
 * decodes past the token's end: with the fourth allocation of
 * {"abcdefghijklmn":1} failing, that is a read and a write past a 16-byte
 * block (valgrind and ASan both see it). Here malloc's NULL is stood in
 * for at every allocation of a parse and of a dump in turn: each call
 * must fail as a whole (out of memory), its blocks must have come from
 * the reserve and gone back to it, and the ASan build must see nothing. */
#include "testutil.h"

#include "common/alloc.h"

#include <jansson.h>
#include <string.h>

/* Allocations jansson makes for one parse of text (none failing). */
static long parse_allocations(const char *text)
{
    long before = sw_alloc_count();
    json_t *j = sw_json_loads(text, 0, NULL);
    long n = sw_alloc_count() - before;
    assert_non_null(j);
    json_decref(j);
    return n;
}

static void refuse_each_allocation_of(const char *text)
{
    json_t *whole = sw_json_loads(text, 0, NULL);
    assert_non_null(whole);
    long n = parse_allocations(text);
    assert_true(n > 0);
    for (long i = 0; i <= n; i++) {
        long blocks = sw_alloc_json_reserve_blocks();
        json_error_t error;
        sw_alloc_test_refuse_system(i);
        json_t *j = sw_json_loads(text, 0, &error);
        sw_alloc_test_refuse_system(-1);
        if (i < n) {
            /* the refused allocation was answered from the reserve, and the
             * call failed as a whole, whatever jansson made of it */
            assert_null(j);
            assert_true(sw_json_error_oom(&error));
            assert_true(sw_alloc_json_reserve_blocks() > blocks);
        } else {
            /* past the parse's last allocation: nothing refused */
            assert_non_null(j);
            assert_true(json_equal(j, whole));
            assert_int_equal(sw_alloc_json_reserve_blocks(), blocks);
            json_decref(j);
        }
        assert_int_equal(sw_alloc_json_reserve_live(), 0);
    }
    json_decref(whole);
}

static void test_token_growth(void **state)
{
    (void)state;
    /* the key's token buffer grows at 15 bytes: the case that overflowed */
    refuse_each_allocation_of("{\"abcdefghijklmn\":1}");
    refuse_each_allocation_of("{\"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ\":"
                              "\"abcdefghijklmnopqrstuvwxyz0123456789\"}");
}

static void test_chat_body(void **state)
{
    (void)state;
    refuse_each_allocation_of(
        "{\"model\":\"demo\",\"stream\":true,\"max_tokens\":64,\"messages\":["
        "{\"role\":\"system\",\"content\":\"You are a helpful assistant who answers briefly.\"},"
        "{\"role\":\"user\",\"content\":\"What is the weather like in Paris today, and tomorrow?\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}}}],\"stop\":[\"\\n\\n\",\"END\"],\"temperature\":0.7}");
}

static void test_dump(void **state)
{
    (void)state;
    json_t *j = sw_json_loads("{\"a_long_enough_key_to_grow\":[1,2,3,\"a string value that grows the "
                              "output buffer more than once\"],\"b\":{\"c\":null}}",
                              0, NULL);
    assert_non_null(j);
    char *whole = sw_json_dumps(j, JSON_COMPACT);
    assert_non_null(whole);
    long before = sw_alloc_count();
    free(sw_json_dumps(j, JSON_COMPACT));
    long n = sw_alloc_count() - before;
    assert_true(n > 0);
    for (long i = 0; i < n; i++) {
        sw_alloc_test_refuse_system(i);
        char *s = sw_json_dumps(j, JSON_COMPACT);
        sw_alloc_test_refuse_system(-1);
        assert_null(s); /* never a text with a part left out */
        assert_int_equal(sw_alloc_json_reserve_live(), 0);
    }
    free(whole);
    json_decref(j);
}

int main(void)
{
    sw_alloc_hook_jansson();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_growth),
        cmocka_unit_test(test_chat_body),
        cmocka_unit_test(test_dump),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
