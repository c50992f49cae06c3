/* test_worker_api.c - end-to-end: a real `spillway worker` on a unix socket
 * answers like `spillway run` does for the same prompt and settings
 * (non-stream and stream, greedy and seeded), frames SSE strictly, keeps
 * stop strings out of the stream, resumes exactly, and serves /v1/models,
 * /tokenize, /health and /metrics. */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define MAXTOK 512

static char g_model[512];
static wc_worker g_w;

static int setup(void **state)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 7;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-api.gguf"));
    if (eng_model_make(&p, g_model, NULL) != 0 || !tu_spillway_bin())
        return -1;
    static const char *const args[] = {"--max-seqs", "4", "--threads", "1", "--ctx-limit", "256",
                                       NULL};
    return wc_worker_start(&g_w, g_model, args, NULL, 30, NULL);
}

static int teardown(void **state)
{
    int st = wc_worker_stop(&g_w);
    remove(g_model);
    wc_worker_kill_all();
    return st == 0 ? 0 : -1; /* SIGTERM drains and exits 0 */
}

static int post(const char *path, const char *body, wc_response *r)
{
    return wc_request(g_w.socket_path, "POST", path, body, 30000, r);
}

/* Worker tokens for a body equal `spillway run`'s for the same settings. */
static void check_same_as_run(const char *prompt, const char *const *run_args,
                              const char *sampling_json, int n)
{
    int ref[MAXTOK], got[MAXTOK];
    int n_ref = wc_run_tokens(g_model, prompt, run_args, ref, MAXTOK);
    assert_true(n_ref > 0);
    assert_true(n_ref <= n);
    for (int stream = 0; stream < 2; stream++) {
        char body[1024];
        wc_response r;
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"stream\":%s,%s}", prompt,
                 n, stream ? "true" : "false", sampling_json);
        assert_int_equal(post("/v1/completions", body, &r), 0);
        assert_int_equal(r.status, 200);
        char ct[128];
        assert_true(wc_header(&r, "Content-Type", ct, sizeof ct));
        assert_string_equal(ct, stream ? "text/event-stream" : "application/json");
        int n_got = wc_tokens_of(&r, stream, got, MAXTOK, NULL, NULL, 0);
        assert_int_equal(n_got, n_ref);
        assert_memory_equal(got, ref, (size_t)n_ref * sizeof(int));
        wc_response_free(&r);
    }
}

static void test_greedy_equals_run(void **state)
{
    static const char *const args[] = {"-n", "40", "--temp", "0", NULL};
    check_same_as_run("Once upon a time", args, "\"temperature\":0", 40);
}

static void test_seeded_equals_run(void **state)
{
    static const char *const args[] = {"-n", "48", "--temp", "0.9", "--top-k", "30", "--top-p",
                                       "0.9", "--min-p", "0.02", "--seed", "1234",
                                       "--presence-penalty", "0.5", "--frequency-penalty", "0.25",
                                       "--repeat-penalty", "1.1", NULL};
    check_same_as_run("The little dog", args,
                      "\"temperature\":0.9,\"top_k\":30,\"top_p\":0.9,\"min_p\":0.02,\"seed\":1234,"
                      "\"presence_penalty\":0.5,\"frequency_penalty\":0.25,\"repeat_penalty\":1.1",
                      48);
}

/* Chat on a model without a template: the ChatML fallback, whose rendering
 * (docs/chat-templates.md) is given to `spillway run` as plain text (the
 * tiny vocabulary has no ChatML control tokens). */
static void test_chat_equals_run(void **state)
{
    static const char *const args[] = {"-n", "24", "--temp", "0", "--ignore-eos", NULL};
    int ref[MAXTOK], got[MAXTOK];
    int n_ref = wc_run_tokens(g_model,
                              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                              "Tell me a story<|im_end|>\n<|im_start|>assistant\n",
                              args, ref, MAXTOK);
    assert_int_equal(n_ref, 24);
    for (int stream = 0; stream < 2; stream++) {
        char body[1024];
        wc_response r;
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                 "{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":24,"
                 "\"temperature\":0,\"ignore_eos\":true,\"stream\":%s}",
                 stream ? "true" : "false");
        assert_int_equal(post("/v1/chat/completions", body, &r), 0);
        assert_int_equal(r.status, 200);
        int n = wc_tokens_of(&r, stream, got, MAXTOK, NULL, NULL, 0);
        /* the ChatML stop string may end it early; what came must match */
        assert_true(n > 0 && n <= n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof(int));
        wc_response_free(&r);
    }
}

/* The stream's framing and chunk shapes, as an OpenAI client reads them. */
static void test_stream_shape(void **state)
{
    wc_response r;
    char **ev;
    assert_int_equal(post("/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                          "{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":6,"
                          "\"temperature\":0,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true}}",
                          &r),
                     0);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    int n = wc_sse_parse(r.body, r.body_len, &ev);
    assert_true(n >= 4);
    assert_string_equal(ev[n - 1], "[DONE]");
    char id[128] = "";
    int finish_seen = 0, usage_seen = 0;
    for (int i = 0; i < n - 1; i++) {
        json_t *j = json_loads(ev[i], 0, NULL);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "object")),
                            "chat.completion.chunk");
        assert_true(json_is_integer(json_object_get(j, "created")));
        assert_true(json_is_string(json_object_get(j, "model")));
        if (i == 0)
            snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
        assert_string_equal(json_string_value(json_object_get(j, "id")), id);
        json_t *choices = json_object_get(j, "choices");
        if (json_object_get(j, "usage")) {
            usage_seen++;
            assert_int_equal(json_array_size(choices), 0);
            assert_int_equal(i, n - 2); /* the usage chunk comes last */
            json_t *u = json_object_get(j, "usage");
            assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 6);
            assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")),
                             json_integer_value(json_object_get(u, "prompt_tokens")) + 6);
        } else {
            json_t *c0 = json_array_get(choices, 0);
            assert_int_equal(json_integer_value(json_object_get(c0, "index")), 0);
            assert_true(json_is_object(json_object_get(c0, "delta")));
            if (i == 0)
                assert_string_equal(json_string_value(json_object_get(
                                        json_object_get(c0, "delta"), "role")),
                                    "assistant");
            json_t *fr = json_object_get(c0, "finish_reason");
            if (json_is_string(fr)) {
                finish_seen++;
                assert_string_equal(json_string_value(fr), "length");
            } else {
                assert_true(json_is_null(fr));
            }
        }
        json_decref(j);
    }
    assert_int_equal(finish_seen, 1);
    assert_int_equal(usage_seen, 1);
    wc_sse_free(ev, n);
    wc_response_free(&r);
}

/* logit_bias: +100 on one id makes greedy decoding pick it every step,
 * -100 on the greedy first token makes another one first (stream and
 * not); malformed maps are 400 with param logit_bias. */
static void test_logit_bias(void **state)
{
    (void)state;
    wc_response r;
    int toks[MAXTOK], plain[MAXTOK];
    const char *base = "\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,"
                       "\"ignore_eos\":true";
    char body[512];
    snprintf(body, sizeof body, "{%s}", base);
    assert_int_equal(post("/v1/completions", body, &r), 0);
    assert_int_equal(wc_tokens_of(&r, false, plain, MAXTOK, NULL, NULL, 0), 6);
    wc_response_free(&r);
    int forced = plain[0] == 300 ? 301 : 300;
    for (int stream = 0; stream < 2; stream++) {
        snprintf(body, sizeof body, "{%s,\"stream\":%s,\"logit_bias\":{\"%d\":100}}", base,
                 stream ? "true" : "false", forced);
        assert_int_equal(post("/v1/completions", body, &r), 0);
        assert_int_equal(r.status, 200);
        assert_int_equal(wc_tokens_of(&r, stream, toks, MAXTOK, NULL, NULL, 0), 6);
        for (int i = 0; i < 6; i++)
            assert_int_equal(toks[i], forced);
        wc_response_free(&r);
        snprintf(body, sizeof body, "{%s,\"stream\":%s,\"logit_bias\":{\"%d\":-100}}", base,
                 stream ? "true" : "false", plain[0]);
        assert_int_equal(post("/v1/completions", body, &r), 0);
        assert_int_equal(r.status, 200);
        assert_int_equal(wc_tokens_of(&r, stream, toks, MAXTOK, NULL, NULL, 0), 6);
        assert_int_not_equal(toks[0], plain[0]);
        wc_response_free(&r);
    }
    /* the last: the message quotes the key cut to 32 bytes, inside an
     * '\u00e9': the response must still be a JSON error naming the param */
    const char *bad[] = {"[1]", "{\"abc\":1}", "{\"5\":101}", "{\"5\":\"x\"}", "{\"1024\":1}",
                         "{\"-1\":1}", "{\"05\":1}", "{\"\":1}",
                         "{\"a\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
                         "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "{%s,\"logit_bias\":%s}", base, bad[i]);
        assert_int_equal(post("/v1/completions", body, &r), 0);
        if (r.status != 400)
            fail_msg("logit_bias %s: status %d", bad[i], r.status);
        assert_non_null(strstr(r.body, "\"param\":\"logit_bias\""));
        wc_response_free(&r);
    }
}

/* OpenAI's other prompt and content forms: a completions prompt as token
 * ids (or a one-element array of them) generates what the same text does;
 * chat content as an array of text parts is the parts joined with "\n";
 * a non-text part, several prompts, ids out of range, echo, best_of > 1
 * and a suffix: 400 (the last three accepted at their no-op values). */
static void test_prompt_and_content_forms(void **state)
{
    (void)state;
    wc_response r;
    int want[MAXTOK], got[MAXTOK];
    assert_int_equal(post("/tokenize", "{\"content\":\"Once upon a time\",\"add_special\":true}",
                          &r),
                     0);
    json_t *tj = json_loads(r.body, 0, NULL);
    char *ids = json_dumps(json_object_get(tj, "tokens"), JSON_COMPACT);
    size_t n_ids = json_array_size(json_object_get(tj, "tokens"));
    json_decref(tj);
    wc_response_free(&r);
    assert_true(n_ids > 2);
    assert_int_equal(post("/v1/completions",
                          "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}", &r),
                     0);
    assert_int_equal(wc_tokens_of(&r, false, want, MAXTOK, NULL, NULL, 0), 8);
    wc_response_free(&r);
    char body[1024];
    for (int nested = 0; nested < 2; nested++) {
        snprintf(body, sizeof body, "{\"prompt\":%s%s%s,\"max_tokens\":8,\"temperature\":0}",
                 nested ? "[" : "", ids, nested ? "]" : "");
        assert_int_equal(post("/v1/completions", body, &r), 0);
        assert_int_equal(r.status, 200);
        assert_int_equal(wc_tokens_of(&r, false, got, MAXTOK, NULL, NULL, 0), 8);
        assert_memory_equal(got, want, 8 * sizeof(int));
        json_t *j = json_loads(r.body, 0, NULL);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                            "prompt_tokens")),
                         (json_int_t)n_ids);
        json_decref(j);
        wc_response_free(&r);
    }
    free(ids);

    const char *plain = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\\nthere\"}],"
                        "\"max_tokens\":8,\"temperature\":0}";
    const char *parts = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                        "\"text\":\"Hello\"},{\"type\":\"text\",\"text\":\"there\"}]}],"
                        "\"max_tokens\":8,\"temperature\":0}";
    assert_int_equal(post("/v1/chat/completions", plain, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *a = json_loads(r.body, 0, NULL);
    wc_response_free(&r);
    assert_int_equal(post("/v1/chat/completions", parts, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *b = json_loads(r.body, 0, NULL);
    wc_response_free(&r);
    /* the same prompt tokens (the second takes the first's cached blocks) */
    json_t *ua = json_object_get(a, "usage"), *ub = json_object_get(b, "usage");
    assert_true(json_equal(json_object_get(ua, "prompt_tokens"), json_object_get(ub, "prompt_tokens")));
    assert_true(json_equal(json_object_get(ua, "completion_tokens"),
                           json_object_get(ub, "completion_tokens")));
    assert_true(json_equal(json_object_get(json_object_get(a, "spillway"), "token_ids"),
                           json_object_get(json_object_get(b, "spillway"), "token_ids")));
    json_decref(a);
    json_decref(b);

    const char *bad[][2] = {
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
         "\"image_url\":{\"url\":\"http://x/y.png\"}}]}]}"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}"},
        {"/v1/completions", "{\"prompt\":[\"a\",\"b\"]}"},
        {"/v1/completions", "{\"prompt\":[1,2,1024]}"},
        {"/v1/completions", "{\"prompt\":[1,2.5]}"},
        {"/v1/completions", "{\"prompt\":[]}"},
        {"/v1/completions", "{\"prompt\":\"Hi\",\"echo\":true,\"logprobs\":1}"},
        {"/v1/completions", "{\"prompt\":\"Hi\",\"best_of\":3}"},
        {"/v1/completions", "{\"prompt\":\"Hi\",\"suffix\":\"end\"}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(post(bad[i][0], bad[i][1], &r), 0);
        if (r.status != 400)
            fail_msg("%s: status %d", bad[i][1], r.status);
        wc_response_free(&r);
    }
    assert_int_equal(post("/v1/completions",
                          "{\"prompt\":\"Hi\",\"max_tokens\":2,\"echo\":false,\"best_of\":1,"
                          "\"suffix\":null}",
                          &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
}

/* A stop string never reaches the client, not even its beginning, and the
 * text ends right before its first occurrence in the unstopped text. */
static void test_stop_strings(void **state)
{
    wc_response r;
    char *full = NULL, *text = NULL, finish[32];
    int toks[MAXTOK];
    assert_int_equal(post("/v1/completions",
                          "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}", &r),
                     0);
    assert_true(wc_tokens_of(&r, false, toks, MAXTOK, &full, finish, sizeof finish) > 0);
    wc_response_free(&r);
    size_t len = strlen(full);
    assert_true(len > 12);
    /* A stop string made of the text's 6 bytes from the middle (a
     * boundary-crossing one with high probability). */
    char stop[8];
    memcpy(stop, full + len / 2, 6);
    stop[6] = '\0';
    size_t cut = (size_t)(strstr(full, stop) - full);
    for (int stream = 0; stream < 2; stream++) {
        char body[512];
        json_t *js = json_string(stop);
        char *jstop = json_dumps(js, JSON_ENCODE_ANY);
        snprintf(body, sizeof body,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,"
                 "\"stream\":%s,\"stop\":[\"zzzz\",%s]}",
                 stream ? "true" : "false", jstop);
        free(jstop);
        json_decref(js);
        assert_int_equal(post("/v1/completions", body, &r), 0);
        assert_int_equal(r.status, 200);
        assert_true(wc_tokens_of(&r, stream, toks, MAXTOK, &text, finish, sizeof finish) > 0);
        assert_string_equal(finish, "stop");
        assert_int_equal(strlen(text), cut);
        assert_memory_equal(text, full, cut);
        sw_free(text);
        wc_response_free(&r);
    }
    sw_free(full);
}

/* resume with the first k tokens continues exactly as the uninterrupted
 * generation, greedy and seeded. */
static void test_resume(void **state)
{
    static const char *const settings[] = {
        "\"temperature\":0",
        "\"temperature\":1.0,\"top_k\":0,\"top_p\":1,\"min_p\":0,\"seed\":99",
    };
    for (int s = 0; s < 2; s++) {
        for (int stream = 0; stream < 2; stream++) {
            int full[MAXTOK], rest[MAXTOK];
            char body[4096];
            wc_response r;
            snprintf(body, sizeof body,
                     "{\"prompt\":\"The little dog\",\"max_tokens\":30,\"ignore_eos\":true,%s}",
                     settings[s]);
            assert_int_equal(post("/v1/completions", body, &r), 0);
            int n_full = wc_tokens_of(&r, false, full, MAXTOK, NULL, NULL, 0);
            wc_response_free(&r);
            assert_int_equal(n_full, 30);
            int k = 11;
            int len = snprintf(body, sizeof body,
                               "{\"prompt\":\"The little dog\",\"max_tokens\":%d,\"stream\":%s,"
                               "\"ignore_eos\":true,%s,\"resume\":{\"draws\":%d,\"tokens\":[",
                               30 - k, stream ? "true" : "false", settings[s], k);
            for (int i = 0; i < k; i++)
                len += snprintf(body + len, sizeof body - (size_t)len, "%s%d", i ? "," : "",
                                full[i]);
            snprintf(body + len, sizeof body - (size_t)len, "]}}");
            assert_int_equal(post("/v1/completions", body, &r), 0);
            assert_int_equal(r.status, 200);
            int n_rest = wc_tokens_of(&r, stream, rest, MAXTOK, NULL, NULL, 0);
            wc_response_free(&r);
            assert_int_equal(n_rest, 30 - k);
            assert_memory_equal(rest, full + k, (size_t)(30 - k) * sizeof(int));
        }
    }
}

/* A stream resumed while text was held back as the possible start of a
 * stop string: the resumed worker is told how much text the client has
 * (resume.text_bytes) and gives back the held part, so the client's text
 * is the uninterrupted run's, byte for byte. */
static void test_resume_held_stop_text(void **state)
{
    (void)state;
    enum { N = 24, CAP = 64 };
    const char *base = "\"prompt\":\"The little dog\",\"temperature\":0,\"ignore_eos\":true";
    char body[4096];
    wc_response r;
    char *texts[CAP];
    int ids[CAP];
    snprintf(body, sizeof body, "{%s,\"max_tokens\":%d,\"stream\":true}", base, N);
    assert_int_equal(post("/v1/completions", body, &r), 0);
    int nc = wc_stream_chunks(&r, texts, ids, CAP);
    wc_response_free(&r);
    /* the token chunks: one token each; find token k > 3 with new text */
    int k = -1;
    for (int i = 4; i < nc - 2 && k < 0; i++)
        if (ids[i] >= 0 && strlen(texts[i]) > strlen(texts[i - 1]))
            k = i;
    assert_true(k > 0);
    char *full = sw_strdup(texts[nc - 1]);
    char *tok_text = sw_strdup(texts[k] + strlen(texts[k - 1]));
    int toks[CAP];
    for (int i = 0; i <= k; i++)
        toks[i] = ids[i];
    for (int i = 0; i < nc; i++)
        sw_free(texts[i]);
    /* a stop string that starts with token k's text and never occurs */
    char stop[256];
    snprintf(stop, sizeof stop, "%s~#~never", tok_text);
    json_t *js = json_string(stop);
    char *jstop = json_dumps(js, JSON_ENCODE_ANY);
    json_decref(js);
    snprintf(body, sizeof body, "{%s,\"max_tokens\":%d,\"stream\":true,\"stop\":[%s]}", base, N,
             jstop);
    assert_int_equal(post("/v1/completions", body, &r), 0);
    nc = wc_stream_chunks(&r, texts, ids, CAP);
    wc_response_free(&r);
    assert_string_equal(texts[nc - 1], full); /* the stop never matched */
    /* what the client had when token k's chunk came: k's text held back */
    int ck = -1;
    for (int i = 0, seen = 0; i < nc && ck < 0; i++)
        if (ids[i] >= 0 && seen++ == k)
            ck = i;
    assert_true(ck >= 0);
    char *sent = sw_strdup(texts[ck]);
    for (int i = 0; i < nc; i++)
        sw_free(texts[i]);
    assert_true(strlen(sent) + strlen(tok_text) <= strlen(full));
    assert_memory_not_equal(full + strlen(sent), "~#~", 3);
    int len = snprintf(body, sizeof body,
                       "{%s,\"max_tokens\":%d,\"stream\":true,\"stop\":[%s],"
                       "\"resume\":{\"draws\":%d,\"text_bytes\":%zu,\"tokens\":[",
                       base, N - (k + 1), jstop, k + 1, strlen(sent));
    for (int i = 0; i <= k; i++)
        len += snprintf(body + len, sizeof body - (size_t)len, "%s%d", i ? "," : "", toks[i]);
    snprintf(body + len, sizeof body - (size_t)len, "]}}");
    free(jstop);
    assert_int_equal(post("/v1/completions", body, &r), 0);
    assert_int_equal(r.status, 200);
    nc = wc_stream_chunks(&r, texts, ids, CAP);
    wc_response_free(&r);
    assert_true(nc > 0);
    size_t sl = strlen(sent);
    char *joined = sw_malloc(sl + strlen(texts[nc - 1]) + 1);
    memcpy(joined, sent, sl);
    strcpy(joined + sl, texts[nc - 1]);
    assert_string_equal(joined, full);
    for (int i = 0; i < nc; i++)
        sw_free(texts[i]);
    sw_free(joined);
    sw_free(sent);
    sw_free(tok_text);
    sw_free(full);
}

static void test_logprobs(void **state)
{
    wc_response r;
    assert_int_equal(post("/v1/completions",
                          "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,\"logprobs\":3}",
                          &r),
                     0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 5);
    assert_int_equal(json_array_size(json_object_get(lp, "token_logprobs")), 5);
    assert_int_equal(json_array_size(json_object_get(lp, "top_logprobs")), 5);
    for (size_t i = 0; i < 5; i++) {
        json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), i);
        double chosen = json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), i));
        assert_true(json_object_size(top) >= 1 && json_object_size(top) <= 3);
        /* greedy: the chosen token is the most likely one */
        const char *key;
        json_t *v;
        double best = -1e30;
        json_object_foreach(top, key, v) best = json_real_value(v) > best ? json_real_value(v) : best;
        assert_true(chosen <= 0.0);
        assert_true(chosen >= best - 1e-6);
    }
    json_decref(j);
    wc_response_free(&r);

    assert_int_equal(post("/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
                          "\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}",
                          &r),
                     0);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    json_t *content = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(json_array_size(content), 3);
    json_t *e0 = json_array_get(content, 0);
    assert_true(json_is_string(json_object_get(e0, "token")));
    assert_true(json_is_array(json_object_get(e0, "bytes")));
    assert_int_equal(json_array_size(json_object_get(e0, "top_logprobs")), 2);
    json_decref(j);
    wc_response_free(&r);
}

static void test_models_tokenize_health_metrics(void **state)
{
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "GET", "/v1/models", NULL, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    const char *id = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    assert_string_equal(id, "spillway-synthetic"); /* general.name of model_make */
    json_decref(j);
    wc_response_free(&r);
    /* OpenAI's retrieve-model: the id (percent-encoded or not), else 404 */
    const char *paths[] = {"/v1/models/spillway-synthetic", "/v1/models/spillway%2Dsynthetic"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(wc_request(g_w.socket_path, "GET", paths[i], NULL, 5000, &r), 0);
        assert_int_equal(r.status, 200);
        j = json_loads(r.body, 0, NULL);
        assert_string_equal(json_string_value(json_object_get(j, "id")), "spillway-synthetic");
        assert_string_equal(json_string_value(json_object_get(j, "object")), "model");
        json_decref(j);
        wc_response_free(&r);
    }
    assert_int_equal(wc_request(g_w.socket_path, "GET", "/v1/models/other", NULL, 5000, &r), 0);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "model_not_found"));
    wc_response_free(&r);

    /* the worker's own id is accepted as "model" */
    assert_int_equal(post("/v1/completions",
                          "{\"model\":\"spillway-synthetic\",\"prompt\":\"Hi\",\"max_tokens\":2}", &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);

    /* /tokenize equals the prompt tokens `spillway run` uses (minus BOS) */
    char *out = NULL;
    int status;
    const char *argv[] = {tu_spillway_bin(), "run", "-m", g_model, "-p", "Once upon a time",
                          "-n", "1", "--json", NULL};
    assert_int_equal(tu_run_capture((char *const *)argv, 30, &out, &status), 0);
    json_t *ref = json_loads(out, 0, NULL);
    sw_free(out);
    assert_int_equal(post("/tokenize", "{\"content\":\"Once upon a time\",\"add_special\":true}", &r),
                     0);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    assert_true(json_equal(json_object_get(j, "tokens"), json_object_get(ref, "prompt_tokens")));
    json_decref(j);
    json_decref(ref);
    wc_response_free(&r);

    assert_int_equal(wc_request(g_w.socket_path, "GET", "/health", NULL, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "ready");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "slots"), "max")), 4);
    /* tiny model: 2 layers x 2 KV heads x 16 dims x K,V x f16 = 256 bytes */
    assert_int_equal(json_integer_value(json_object_get(j, "kv_bytes_per_token")), 2 * 2 * 16 * 2 * 2);
    assert_true(json_real_value(json_object_get(j, "decode_tokens_per_second")) > 0);
    assert_true(json_real_value(json_object_get(j, "prefill_tokens_per_second")) > 0);
    json_decref(j);
    wc_response_free(&r);

    assert_int_equal(wc_request(g_w.socket_path, "GET", "/metrics", NULL, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "spillway_worker_requests_total{outcome=\"ok\"} "));
    assert_non_null(strstr(r.body, "spillway_worker_slots_max 4\n"));
    wc_response_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_run),
        cmocka_unit_test(test_seeded_equals_run),
        cmocka_unit_test(test_chat_equals_run),
        cmocka_unit_test(test_stream_shape),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_prompt_and_content_forms),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_resume_held_stop_text),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_models_tokenize_health_metrics),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
