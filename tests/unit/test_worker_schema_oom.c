/* test_worker_schema_oom.c - a request body whose parse runs out of
 * memory is answered as the worker answers every lost allocation, 500
 * internal_error "out of memory", never a 400 that blames the body.
 *
 * The request parser (wk__parse_request, what the worker's HTTP thread
 * runs on a body) is given valid bodies - a completions body with a
 * json_schema response_format; a chat body with content parts, tools,
 * stop strings and logit_bias; a GBNF grammar - on a scratch server with
 * the built-in vocabulary of a `model make` model; every allocation it
 * makes is failed in turn (sw_alloc_fail_after), up to the first parse
 * that succeeds. Each refusal must be 500 internal_error "out of memory"
 * naming no parameter (the unfaulted parse accepts the body, so any other
 * answer blames it wrongly). The HTTP thread also turns any refusal
 * during which an allocation failed into a 500 (worker_http.c), so over a
 * socket both answers look alike: the parser's own answer is what this
 * test holds to.
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

#define CHAT_BODY                                                                               \
    "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\","         \
    "\"content\":[{\"type\":\"text\",\"text\":\"what is the\"},{\"type\":\"text\",\"text\":"    \
    "\" weather\"}]}],\"max_tokens\":300,\"stop\":[\"\\n\\n\",\"END\"],\"logit_bias\":"         \
    "{\"5\":-100,\"7\":2.5},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"          \
    "\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"   \
    "\"string\"}},\"required\":[\"city\"]}}}]}"

#define GRAMMAR_BODY                                                                            \
    "{\"prompt\":\"hello\",\"max_tokens\":64,\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\" "  \
    "| [0-9]+\"}"

static const struct {
    const char *json;
    bool chat;
    int output; /* what the unfaulted parse makes of it */
} BODIES[] = {
    {BODY, false, WK_OUT_JSON},
    {CHAT_BODY, true, WK_OUT_TOOL_AUTO},
    {GRAMMAR_BODY, false, WK_OUT_GRAMMAR},
};

/* Fails every allocation of the parse of body b in turn; returns how many
 * were refused (each checked to be the 500). */
static int sweep_body(wk_server *s, size_t b)
{
    json_error_t je;
    json_t *body = json_loads(BODIES[b].json, 0, &je);
    if (!body)
        fail_msg("body %zu: %s", b, je.text);
    bool chat = BODIES[b].chat;

    /* unfaulted: accepted */
    wk_req *r = sw_calloc(1, sizeof *r);
    wk_parse_error p;
    assert_non_null(r);
    memset(&p, 0, sizeof p);
    if (!wk__parse_request(s, body, chat, r, &p))
        fail_msg("body %zu: the unfaulted body is refused: %d %s", b, p.status, p.msg);
    assert_int_equal(r->output, BODIES[b].output);
    wk_req_free(r);

    int refused = 0;
    for (long n = 0;; n++) {
        r = sw_calloc(1, sizeof *r);
        assert_non_null(r);
        memset(&p, 0, sizeof p);
        sw_alloc_fail_after(n);
        bool ok = wk__parse_request(s, body, chat, r, &p);
        sw_alloc_fail_after(-1);
        wk_req_free(r);
        if (ok)
            break;
        if (p.status != 500 || !p.code || strcmp(p.code, "internal_error") ||
            strcmp(p.msg, "out of memory") || p.param)
            fail_msg("body %zu, allocation %ld failed: answered %d %s (param %s): %s", b, n,
                     p.status, p.code ? p.code : "?", p.param ? p.param : "none", p.msg);
        refused++;
        assert_true(n < 1000000);
    }
    json_decref(body);
    return refused;
}

static void test_parse_oom_is_500(void **state)
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

    for (size_t b = 0; b < sizeof BODIES / sizeof *BODIES; b++) {
        int refused = sweep_body(s, b);
        print_message("body %zu: %d failed allocations, each answered 500 out of memory\n", b,
                      refused);
        /* the parse allocates: the sweep failed something */
        assert_true(refused > 5);
    }

    eng_cs_vocab_free(s->cs_vocab);
    sw_free(s);
    eng_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_oom_is_500),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
