/* test_textbuf.c - common/textbuf.h against snprintf, the oracle: numbers
 * at their limits, padding, and running out of room (sticky, cut,
 * always NUL-terminated). */
#include "testutil.h"

#include "common/textbuf.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void test_numbers_match_snprintf(void **state)
{
    (void)state;
    static const uint64_t u[] = {0, 1, 9, 10, 99, 100, 12345, UINT32_MAX, (uint64_t)INT64_MAX,
                                 UINT64_MAX};
    static const int64_t i[] = {0, -1, 1, -10, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    char got[64], want[64];
    sw_tb t;
    for (size_t k = 0; k < sizeof u / sizeof u[0]; k++) {
        sw_tb_init(&t, got, sizeof got);
        sw_tb_u64(&t, u[k]);
        snprintf(want, sizeof want, "%" PRIu64, u[k]);
        assert_string_equal(got, want);
        sw_tb_init(&t, got, sizeof got);
        sw_tb_hex(&t, u[k]);
        snprintf(want, sizeof want, "%" PRIx64, u[k]);
        assert_string_equal(got, want);
        for (int w = 0; w <= 20; w += 3) {
            sw_tb_init(&t, got, sizeof got);
            sw_tb_u64_pad(&t, u[k], w);
            snprintf(want, sizeof want, "%0*" PRIu64, w, u[k]);
            assert_string_equal(got, want);
        }
    }
    for (size_t k = 0; k < sizeof i / sizeof i[0]; k++) {
        sw_tb_init(&t, got, sizeof got);
        sw_tb_i64(&t, i[k]);
        snprintf(want, sizeof want, "%" PRId64, i[k]);
        assert_string_equal(got, want);
    }
}

static void test_appends_and_overflow(void **state)
{
    (void)state;
    char b[8];
    sw_tb t;
    sw_tb_init(&t, b, sizeof b);
    SW_TB_LIT(&t, "ab");
    sw_tb_str(&t, "cd");
    sw_tb_u64(&t, 7);
    assert_true(sw_tb_ok(&t));
    assert_string_equal(b, "abcd7");
    assert_int_equal(t.len, 5);
    sw_tb_str(&t, "xyz"); /* 8 bytes with the NUL: one too many */
    assert_false(sw_tb_ok(&t));
    assert_string_equal(b, "abcd7xy");
    assert_int_equal(t.len, 7);
    sw_tb_str(&t, "q"); /* still full, still terminated */
    assert_false(sw_tb_ok(&t));
    assert_string_equal(b, "abcd7xy");
    sw_tb_init(&t, b, 1); /* room for the NUL only */
    assert_true(sw_tb_ok(&t));
    sw_tb_u64(&t, 5);
    assert_false(sw_tb_ok(&t));
    assert_string_equal(b, "");
    sw_tb_init(&t, b, 0); /* no room at all: nothing is written */
    assert_false(sw_tb_ok(&t));
    sw_tb_str(&t, "x");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers_match_snprintf),
        cmocka_unit_test(test_appends_and_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
