/* test_router_health_edges.c - what a worker's /health may say that the
 * router passes on, end to end: a real `spillway serve` with an
 * unmanaged worker (url = unix:...) that is a server thread here, so the
 * test chooses its /health text.
 *
 *  - a rates_source that is not one of the documented words (none,
 *    calibration, measured), long and not ASCII: the router's /health
 *    still lists the worker (a cut inside a UTF-8 character made the
 *    entry vanish) and says "none" for it;
 *  - a ctx_limit past 32 bits (2^32 + 512): read as unknown (0), not
 *    wrapped to 512.
 */
#include "testutil.h"
#include "fake_server.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[512];

static fs_server g_fake;

/* 12 two-byte characters: 24 bytes, more than the router keeps (15) */
#define ODD_SOURCE "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9" \
                   "\xc3\xa9\xc3\xa9\xc3\xa9"

/* Answers every request with a spillway worker's /health (ready, rates,
 * the odd rates_source). */
static void fake_answer(fs_server *s, int fd, const char *req, const char *body)
{
    (void)s;
    (void)req;
    (void)body;
    static const char health[] =
        "{\"status\":\"ready\",\"model\":\"fake\",\"ctx_limit\":4294967808,"
        "\"prefill_tokens_per_second\":100.0,\"decode_tokens_per_second\":10.0,"
        "\"rates_source\":\"" ODD_SOURCE "\"}";
    fs_send_reply(fd, 200, "application/json", health, sizeof health - 1);
}

static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_model, sizeof g_model, "router-health-edges.gguf", 31))
        return -1;
    fs_start(&g_fake, "health-fake.sock", 4096, false, fake_answer);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    fs_stop(&g_fake);
    remove(g_model);
    return 0;
}

static void test_odd_rates_source(void **state)
{
    (void)state;
    assert_int_equal(strlen(ODD_SOURCE), 24);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker fake]\nurl = unix:%s\n", g_fake.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "health-odd", g_model, NULL, rest), 0);
    /* the worker is listed (rh_worker_health fails the test otherwise),
     * ready, with its rates and a documented rates_source */
    json_t *w = rh_worker_health(&r, "fake");
    assert_string_equal(json_string_value(json_object_get(w, "state")), "ready");
    assert_true(json_number_value(json_object_get(w, "decode_tokens_per_second")) > 0);
    assert_string_equal(json_string_value(json_object_get(w, "rates_source")), "none");
    assert_int_equal(json_integer_value(json_object_get(w, "ctx_limit")), 0);
    json_decref(w);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_odd_rates_source),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
