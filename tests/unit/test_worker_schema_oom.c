/* test_worker_schema_oom.c - a response_format schema whose compile runs
 * out of memory is answered as the worker answers every lost allocation,
 * 500 internal_error "out of memory", never a 400 that blames the schema.
 *
 * The request parser (wk__parse_request, what the worker's HTTP thread
 * runs on a body) is given a completions body with a valid json_schema
 * response_format, on a scratch server with the built-in vocabulary of a
 * `model make` model; every allocation it makes is failed in turn
 * (sw_alloc_fail_after). A refusal that names response_format is the bug
 * (the schema is valid: the unfaulted parse accepts it); the ones that
 * failed inside the compile must say 500 internal_error. The HTTP thread
 * also turns any refusal during which an allocation failed into a 500
 * (worker_http.c), so over a socket both answers look alike: the parser's
 * own answer is what this test holds to.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "grammar/constrain.h"
#include "modelgen/model_make.h"
#include "text/tokenizer.h"
#include "worker/worker-impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BODY                                                                                    \
    "{\"prompt\":\"hello\",\"max_tokens\":200,\"response_format\":{\"type\":\"json_schema\","  \
    "\"json_schema\":{\"name\":\"t\",\"schema\":{\"type\":\"object\",\"properties\":{\"when\":"  \
    "{\"type\":\"string\",\"format\":\"date\"},\"n\":{\"type\":\"integer\",\"minimum\":1,"      \
    "\"maximum\":99},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]}}},"         \
    "\"required\":[\"when\",\"n\"]}}}}"

static void test_schema_oom_is_500(void **state)
{
    (void)state;
    eng_model_make_params mp = eng_model_make_default_params();
    void *image = NULL;
    size_t size = 0;
    eng_gguf *gg = NULL;
    eng_tokenizer *tok = NULL;
    sw_error err;
    mp.n_layer = 1;
    assert_int_equal(eng_model_make_to_memory(&mp, &image, &size, &err), SW_OK);
    assert_int_equal(eng_gguf_open_memory(image, size, &gg, &err), SW_OK);
    assert_int_equal(eng_tokenizer_load(gg, &tok, &err), SW_OK);
    eng_gguf_close(gg);
    sw_free(image);

    wk_server *s = sw_calloc(1, sizeof *s);
    assert_non_null(s);
    s->tok = tok;
    s->n_ctx = 1024;
    snprintf(s->model_id, sizeof s->model_id, "oom-test");
    assert_int_equal(eng_cs_vocab_create(tok, &s->cs_vocab, &err), SW_OK);

    json_error_t je;
    json_t *body = json_loads(BODY, 0, &je);
    assert_non_null(body);

    /* unfaulted: accepted, a constrained JSON reply */
    wk_req *r = sw_calloc(1, sizeof *r);
    wk_parse_error p;
    assert_non_null(r);
    memset(&p, 0, sizeof p);
    if (!wk__parse_request(s, body, false, r, &p))
        fail_msg("the unfaulted body is refused: %d %s", p.status, p.msg);
    assert_int_equal(r->output, WK_OUT_JSON);
    wk_req_free(r);

    int in_compile = 0, elsewhere = 0;
    for (long n = 0;; n++) {
        r = sw_calloc(1, sizeof *r);
        assert_non_null(r);
        memset(&p, 0, sizeof p);
        sw_alloc_fail_after(n);
        bool ok = wk__parse_request(s, body, false, r, &p);
        sw_alloc_fail_after(-1);
        wk_req_free(r);
        if (ok)
            break;
        if (p.param && strcmp(p.param, "response_format") == 0)
            fail_msg("allocation %ld failed: answered %d %s (param response_format): %s", n,
                     p.status, p.code ? p.code : "?", p.msg);
        if (p.status == 500) {
            assert_string_equal(p.code, "internal_error");
            assert_string_equal(p.msg, "out of memory");
            in_compile++;
        } else {
            elsewhere++; /* the HTTP thread answers these 500 too (see above) */
        }
        assert_true(n < 1000000);
    }
    print_message("failed allocations: %d in the schema's compile (500), %d elsewhere\n",
                  in_compile, elsewhere);
    /* the sweep reached the compile */
    assert_true(in_compile > 0);

    json_decref(body);
    eng_cs_vocab_free(s->cs_vocab);
    sw_free(s);
    eng_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_oom_is_500),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
