/* test_worker_bignum.c - end-to-end: JSON schemas with numbers past 64
 * bits on a real `spillway worker` serving a random tiny model, over HTTP.
 *
 * Sampled at temperature 1, a random model writes anything it is allowed
 * to, so every reply that keeps to the bounds is the constraint's doing.
 * The bounds (2^64 and 10^23) are written in the body as integer literals
 * that jansson cannot hold; the replies' digits are compared with them as
 * strings, exactly. A const and an enum past 64 bits come back verbatim;
 * such a number outside a schema is a 400 naming the field.
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];
static wc_worker g_w;

#define LO "18446744073709551616"     /* 2^64 */
#define HI "100000000000000000000000" /* 10^23 */

static int setup(void **state)
{
    (void)state;
    return wc_worker_start_made(&g_w, "worker-bignum.gguf", 29, 512, g_model, sizeof g_model);
}

static int teardown(void **state)
{
    (void)state;
    return wc_worker_stop_made(&g_w, g_model);
}

/* POSTs a completions body whose response_format schema is `schema`
 * (text); the choice's text (caller frees) or, for a non-200, the body. */
static char *complete(const char *schema, int seed, int want_status)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Number:\",\"seed\":%d,\"temperature\":1,\"max_tokens\":60,"
             "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
             "\"schema\":%s}}}",
             seed, schema);
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions", body, 60000, &r), 0);
    if (r.status != want_status)
        fail_msg("status %d: %s", r.status, r.body);
    char *out = NULL;
    if (want_status == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
        out = strdup(json_string_value(json_object_get(choice, "text")));
        json_decref(j);
    } else {
        out = strdup(r.body);
    }
    wc_response_free(&r);
    assert_non_null(out);
    return out;
}

/* Compares two magnitudes written as digits without leading zeros. */
static int mag_cmp(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la != lb)
        return la < lb ? -1 : 1;
    return strcmp(a, b);
}

static void test_bounds(void **state)
{
    (void)state;
    int lengths[32] = {0};
    for (int seed = 1; seed <= 8; seed++) {
        char *t = complete("{\"type\":\"integer\",\"minimum\":" LO ",\"maximum\":" HI "}", seed,
                           200);
        size_t n = strlen(t);
        if (n == 0 || strspn(t, "0123456789") != n || t[0] == '0')
            fail_msg("seed %d: not a positive integer: '%s'", seed, t);
        if (mag_cmp(t, LO) < 0 || mag_cmp(t, HI) > 0)
            fail_msg("seed %d: %s is outside [%s, %s]", seed, t, LO, HI);
        printf("  seed %d: %s\n", seed, t);
        lengths[n < 32 ? n : 31]++;
        free(t);
    }
    /* all of them past 64 bits, by the bounds */
    for (int i = 0; i < 20; i++)
        assert_int_equal(lengths[i], 0);
    /* negative and exclusive: (-10^23, -2^64] */
    for (int seed = 1; seed <= 4; seed++) {
        char *t = complete("{\"type\":\"integer\",\"exclusiveMinimum\":-" HI ",\"maximum\":-" LO
                           "}",
                           seed, 200);
        if (t[0] != '-' || strspn(t + 1, "0123456789") != strlen(t + 1) || t[1] == '0')
            fail_msg("seed %d: not a negative integer: '%s'", seed, t);
        if (mag_cmp(t + 1, LO) < 0 || mag_cmp(t + 1, HI) >= 0)
            fail_msg("seed %d: %s is outside (-%s, -%s]", seed, t, HI, LO);
        free(t);
    }
}

static void test_const_enum(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 3; seed++) {
        char *t = complete("{\"const\":123456789012345678901234567890}", seed, 200);
        assert_string_equal(t, "123456789012345678901234567890");
        free(t);
        t = complete("{\"enum\":[" LO ",-98765432109876543210]}", seed, 200);
        if (strcmp(t, LO) != 0 && strcmp(t, "-98765432109876543210") != 0)
            fail_msg("seed %d: '%s' is not in the enum", seed, t);
        free(t);
        /* in an object, beside other properties */
        t = complete("{\"type\":\"object\",\"properties\":{\"id\":{\"const\":" LO "}},"
                     "\"required\":[\"id\"],\"additionalProperties\":false}",
                     seed, 200);
        json_error_t je;
        json_t *j = json_loads(t, 0, &je);
        assert_null(j); /* jansson itself cannot read it back */
        assert_non_null(strstr(t, "\"id\":" LO));
        free(t);
    }
}

static void test_refused(void **state)
{
    (void)state;
    /* a real past a double in a bound: the schema's typed 400 */
    char *t = complete("{\"type\":\"integer\",\"maximum\":1e400}", 1, 400);
    assert_non_null(strstr(t, "\"param\":\"response_format\""));
    assert_non_null(strstr(t, "past a double"));
    free(t);
    /* outside a schema: a 400 naming the field */
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"hi\",\"max_tokens\":" LO "}", 60000, &r),
                     0);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "\"param\":\"max_tokens\""));
    assert_non_null(strstr(r.body, "64 bits"));
    wc_response_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_const_enum),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
