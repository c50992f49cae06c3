/* test_worker_reasoning.c - end-to-end: a thinking family's reply split into
 * reasoning_content and content by a real `spillway worker` over HTTP.
 *
 * A tiny random model cannot be made to think, so its text is forced with
 * a grammar (GBNF, the `grammar` field): "<think>\n...\n</think>\n\n..." for
 * a worker serving the Qwen3 family (--chat-template qwen3), and
 * "...</think>..." for one serving DeepSeek-R1's (the prompt opened the
 * thought). The split is checked non-stream and stream (the deltas add up
 * to the non-stream answer of the same seed), with reasoning_format none
 * (the text as generated), cut by max_tokens inside the thought
 * (finish_reason length, all reasoning), resumed mid-thought (the
 * continuation's deltas still reasoning_content, the whole equal to the
 * uninterrupted stream), and refused values (400 naming the parameter).
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512], g_oss_model[512];
static wc_worker g_qwen3, g_r1, g_oss, g_oss_real;

/* A gpt-oss-like file: the made model with its last pieces turned into
 * harmony's control tokens, <|return|> as EOS, and a template with
 * harmony's markers (so the family is detected, not named). */
static const char *const g_harmony_tokens[] = {
    "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
    "<|constrain|>",
};
#define N_HARMONY 7
static int32_t g_harmony_id[N_HARMONY];

static int make_harmony_model(const char *src, const char *dst)
{
    eng_gguf *g = NULL;
    sw_error err;
    if (eng_gguf_open(src, &g, &err))
        return -1;
    eng_gguf_writer *w = eng_gguf_writer_create();
    int64_t kt = eng_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t ky = eng_gguf_find_key(g, "tokenizer.ggml.token_type");
    uint64_t n = 0;
    eng_gguf_value_type et;
    int rc = w && kt >= 0 && ky >= 0 ? SW_OK : SW_EINVAL;
    if (!rc)
        rc = eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &err);
    char **pieces = sw_calloc(n ? n : 1, sizeof *pieces);
    int32_t *types = sw_calloc(n ? n : 1, sizeof *types);
    for (uint64_t i = 0; !rc && i < n; i++) {
        const char *p;
        size_t len;
        rc = eng_gguf_arr_str(g, kt, i, &p, &len);
        if (!rc)
            rc = eng_gguf_arr_i32(g, ky, i, &types[i]);
        pieces[i] = sw_strndup(p, len);
    }
    for (int k = 0; !rc && k < N_HARMONY; k++) {
        uint64_t id = n - N_HARMONY + (uint64_t)k;
        sw_free(pieces[id]);
        pieces[id] = sw_strdup(g_harmony_tokens[k]);
        types[id] = 3; /* CONTROL */
        g_harmony_id[k] = (int32_t)id;
    }
    for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        if (strcmp(key, "tokenizer.ggml.tokens") && strcmp(key, "tokenizer.ggml.token_type") &&
            strcmp(key, "tokenizer.ggml.eos_token_id"))
            rc = eng_gguf_writer_copy_kv(w, g, i, key);
    }
    if (!rc)
        rc = eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                         (const char *const *)pieces, n);
    if (!rc)
        rc = eng_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, n);
    if (!rc)
        rc = eng_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)g_harmony_id[4]);
    if (!rc)
        rc = eng_gguf_writer_set_str(
            w, "tokenizer.chat_template",
            "{{- \"<|start|>system<|message|>\" }}{%- for message in loop_messages -%}"
            "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + "
            "\"<|end|>\" }}{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant"
            "{%- endif -%}");
    for (int64_t i = 0; !rc && i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        rc = eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                        t->size_bytes);
    }
    if (!rc)
        rc = eng_gguf_writer_write(w, dst, &err);
    for (uint64_t i = 0; i < n; i++)
        sw_free(pieces[i]);
    sw_free(pieces);
    sw_free(types);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    return rc ? -1 : 0;
}

static const char *const g_think =
    "root ::= \"<think>\\n\" [a-z]{2,8} \"\\n</think>\\n\\n\" [a-z]{1,6}\n";
static const char *const g_open = "root ::= [a-z]{2,8} \"</think>\\n\\n\" [a-z]{1,6}\n";

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 31;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-reasoning.gguf"));
    if (eng_model_make(&p, g_model, NULL) != 0 || !tu_spillway_bin())
        return -1;
    const char *const a1[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024",
                              "--chat-template", "qwen3", NULL};
    const char *const a2[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024",
                              "--chat-template", "deepseek-r1", NULL};
    const char *const a3[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024",
                              "--chat-template", "harmony", NULL};
    if (wc_worker_start(&g_qwen3, g_model, a1, NULL, 30, NULL) != 0 ||
        wc_worker_start(&g_r1, g_model, a2, NULL, 30, NULL) != 0)
        return -1;
    snprintf(g_oss_model, sizeof g_oss_model, "%s", tu_tmp_path("worker-reasoning-oss.gguf"));
    const char *const a4[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024", NULL};
    if (make_harmony_model(g_model, g_oss_model) != 0 ||
        wc_worker_start(&g_oss, g_model, a3, NULL, 30, NULL) != 0)
        return -1;
    return wc_worker_start(&g_oss_real, g_oss_model, a4, NULL, 30, NULL);
}

static int teardown(void **state)
{
    (void)state;
    int a = wc_worker_stop(&g_qwen3), b = wc_worker_stop(&g_r1), c = wc_worker_stop(&g_oss);
    int d = wc_worker_stop(&g_oss_real);
    remove(g_model);
    remove(g_oss_model);
    wc_worker_kill_all();
    return a == 0 && b == 0 && c == 0 && d == 0 ? 0 : -1;
}

/* POSTs a chat body (consumed); the parsed JSON, or for a stream the body
 * as a JSON string. */
static json_t *post(const wc_worker *w, json_t *body, int want_status)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "POST", "/v1/chat/completions", s, 60000, &r), 0);
    free(s);
    if (r.status != want_status)
        fail_msg("status %d: %s", r.status, r.body);
    json_t *j = want_status == 200 && strstr(r.headers, "text/event-stream")
                    ? json_string(r.body)
                    : json_loads(r.body, 0, NULL);
    if (!j)
        fail_msg("not JSON: %s", r.body);
    wc_response_free(&r);
    return j;
}

static json_t *chat_body(const char *grammar, int seed, int max_tokens, bool stream)
{
    return json_pack("{s:[{s:s, s:s}], s:i, s:i, s:b, s:s, s:f}", "messages", "role", "user",
                     "content", "think", "seed", seed, "max_tokens", max_tokens, "stream", stream,
                     "grammar", grammar, "temperature", 1.0);
}

typedef struct reply {
    char reasoning[512];
    char content[512];
    bool has_reasoning_field;
    char finish[32];
    int ids[128];
    int n_ids;
    int n_chunks_after_content_with_reasoning; /* reasoning deltas after content began */
} reply;

static void cat(char *dst, size_t cap, const char *s)
{
    if (s)
        snprintf(dst + strlen(dst), cap - strlen(dst), "%s", s);
}

static void read_message(json_t *j, reply *out)
{
    memset(out, 0, sizeof *out);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    json_t *rc = json_object_get(msg, "reasoning_content");
    out->has_reasoning_field = rc != NULL;
    cat(out->reasoning, sizeof out->reasoning, json_string_value(rc));
    cat(out->content, sizeof out->content, json_string_value(json_object_get(msg, "content")));
    cat(out->finish, sizeof out->finish,
        json_string_value(json_object_get(choice, "finish_reason")));
}

static void read_stream(json_t *j, reply *out)
{
    memset(out, 0, sizeof *out);
    const char *body = json_string_value(j);
    char **ev = NULL;
    int n = wc_sse_parse(body, strlen(body), &ev);
    assert_true(n >= 2);
    assert_string_equal(ev[n - 1], "[DONE]");
    for (int i = 0; i < n - 1; i++) {
        json_t *e = json_loads(ev[i], 0, NULL);
        assert_non_null(e);
        assert_null(json_object_get(e, "error"));
        json_t *choice = json_array_get(json_object_get(e, "choices"), 0);
        json_t *d = json_object_get(choice, "delta");
        const char *rc = json_string_value(json_object_get(d, "reasoning_content"));
        if (rc) {
            out->has_reasoning_field = true;
            if (out->content[0])
                out->n_chunks_after_content_with_reasoning++;
        }
        cat(out->reasoning, sizeof out->reasoning, rc);
        cat(out->content, sizeof out->content, json_string_value(json_object_get(d, "content")));
        cat(out->finish, sizeof out->finish,
            json_string_value(json_object_get(choice, "finish_reason")));
        json_t *ids = json_object_get(json_object_get(e, "spillway"), "token_ids");
        for (size_t k = 0; k < json_array_size(ids) && out->n_ids < 128; k++)
            out->ids[out->n_ids++] = (int)json_integer_value(json_array_get(ids, k));
        json_decref(e);
    }
    wc_sse_free(ev, n);
}

static bool all_lower(const char *s, size_t lo, size_t hi)
{
    size_t n = strlen(s);
    for (const char *p = s; *p; p++)
        if (*p < 'a' || *p > 'z')
            return false;
    return n >= lo && n <= hi;
}

static void test_split_qwen3(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 3; seed++) {
        reply a, b;
        json_t *j = post(&g_qwen3, chat_body(g_think, seed, 60, false), 200);
        read_message(j, &a);
        json_decref(j);
        assert_string_equal(a.finish, "stop");
        if (!all_lower(a.reasoning, 2, 8) || !all_lower(a.content, 1, 6))
            fail_msg("seed %d: reasoning '%s' content '%s'", seed, a.reasoning, a.content);
        j = post(&g_qwen3, chat_body(g_think, seed, 60, true), 200);
        read_stream(j, &b);
        json_decref(j);
        /* the deltas add up to the same answer, thought first */
        assert_string_equal(b.reasoning, a.reasoning);
        assert_string_equal(b.content, a.content);
        assert_string_equal(b.finish, "stop");
        assert_int_equal(b.n_chunks_after_content_with_reasoning, 0);
    }
}

static void test_split_deepseek_open(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 2; seed++) {
        reply a, b;
        json_t *j = post(&g_r1, chat_body(g_open, seed, 60, false), 200);
        read_message(j, &a);
        json_decref(j);
        if (!all_lower(a.reasoning, 2, 8) || !all_lower(a.content, 1, 6))
            fail_msg("seed %d: reasoning '%s' content '%s'", seed, a.reasoning, a.content);
        j = post(&g_r1, chat_body(g_open, seed, 60, true), 200);
        read_stream(j, &b);
        json_decref(j);
        assert_string_equal(b.reasoning, a.reasoning);
        assert_string_equal(b.content, a.content);
    }
}

/* reasoning_format none: the text as generated, no reasoning_content. */
static void test_format_none(void **state)
{
    (void)state;
    reply a, b;
    json_t *body = chat_body(g_think, 2, 60, false);
    json_object_set_new(body, "reasoning_format", json_string("none"));
    json_t *j = post(&g_qwen3, body, 200);
    read_message(j, &a);
    json_decref(j);
    assert_false(a.has_reasoning_field);
    assert_memory_equal(a.content, "<think>\n", 8);
    assert_non_null(strstr(a.content, "\n</think>\n\n"));
    body = chat_body(g_think, 2, 60, true);
    json_object_set_new(body, "reasoning_format", json_string("none"));
    j = post(&g_qwen3, body, 200);
    read_stream(j, &b);
    json_decref(j);
    assert_false(b.has_reasoning_field);
    assert_string_equal(b.content, a.content);
    /* and "deepseek" asked for explicitly is the default's split */
    body = chat_body(g_think, 2, 60, false);
    json_object_set_new(body, "reasoning_format", json_string("deepseek"));
    j = post(&g_qwen3, body, 200);
    read_message(j, &b);
    json_decref(j);
    assert_true(strstr(a.content, b.reasoning) != NULL && b.reasoning[0]);
}

/* A thought never closed within max_tokens: reasoning, finish length. */
static void test_unclosed_at_max_tokens(void **state)
{
    (void)state;
    /* at least one letter after "<think>\n" (at most 8 tokens) */
    static const char *const g_long = "root ::= \"<think>\\n\" [a-z] [a-z ]*\n";
    int cut = 0;
    for (int seed = 1; seed <= 3; seed++) {
        for (int stream = 0; stream < 2; stream++) {
            reply a;
            json_t *j = post(&g_qwen3, chat_body(g_long, seed, 12, stream), 200);
            if (stream)
                read_stream(j, &a);
            else
                read_message(j, &a);
            json_decref(j);
            if (strcmp(a.finish, "length") != 0)
                continue;
            cut++;
            assert_true(a.reasoning[0] != '\0');
            assert_string_equal(a.content, "");
            assert_null(strchr(a.reasoning, '<'));
        }
    }
    assert_true(cut >= 2);
}

/* A stream resumed after k tokens inside the thought: the resumed
 * worker's deltas continue as reasoning_content, and the two parts add up
 * to the uninterrupted stream. */
static void test_resume_mid_thought(void **state)
{
    (void)state;
    reply full;
    json_t *j = post(&g_qwen3, chat_body(g_think, 5, 60, true), 200);
    read_stream(j, &full);
    json_decref(j);
    assert_true(full.n_ids >= 4);
    /* the first token that gave reasoning text: cut right after it; what
     * the client had then is the stream's text up to that chunk */
    int k = 0;
    char head[512] = "";
    {
        j = post(&g_qwen3, chat_body(g_think, 5, 60, true), 200);
        const char *body = json_string_value(j);
        char **ev = NULL;
        int n = wc_sse_parse(body, strlen(body), &ev);
        int ids_seen = 0;
        for (int i = 0; i < n - 1 && !k; i++) {
            json_t *e = json_loads(ev[i], 0, NULL);
            json_t *d = json_object_get(json_array_get(json_object_get(e, "choices"), 0), "delta");
            ids_seen += (int)json_array_size(
                json_object_get(json_object_get(e, "spillway"), "token_ids"));
            assert_null(json_object_get(d, "content") &&
                                json_string_length(json_object_get(d, "content")) > 0
                            ? d
                            : NULL);
            if (json_string_length(json_object_get(d, "reasoning_content")) > 0) {
                k = ids_seen;
                cat(head, sizeof head, json_string_value(json_object_get(d, "reasoning_content")));
            }
            json_decref(e);
        }
        wc_sse_free(ev, n);
        json_decref(j);
    }
    assert_true(k > 0 && k < full.n_ids);
    json_t *body = chat_body(g_think, 5, 60 - k, true);
    json_t *toks = json_array();
    for (int i = 0; i < k; i++)
        json_array_append_new(toks, json_integer(full.ids[i]));
    json_object_set_new(body, "resume", json_pack("{s:o, s:i}", "tokens", toks, "draws", k));
    reply rest;
    j = post(&g_qwen3, body, 200);
    read_stream(j, &rest);
    json_decref(j);
    /* the continuation starts in the thought */
    assert_true(rest.reasoning[0] != '\0' || strlen(head) == strlen(full.reasoning));
    char joined[1024];
    snprintf(joined, sizeof joined, "%s%s", head, rest.reasoning);
    assert_string_equal(joined, full.reasoning);
    assert_string_equal(rest.content, full.content);
    assert_string_equal(rest.finish, "stop");
}

/* A stream cut while the resumed worker must give back text the client
 * never got (held by the first as a possible stop string, as
 * resume.text_bytes says): here the resumed tokens run to the end of the
 * thought's closing "\n</think>\n\n", and the client is said to have only
 * the thought's text. The splitter is fed only what the client had, so the
 * closing tags given back end the thought again, and what follows is
 * content (fed everything, it would take the tags given back for content).
 * No grammar: with one the engine holds nothing back. */
static void test_resume_held_text(void **state)
{
    (void)state;
    json_t *j = post(&g_qwen3, chat_body(g_think, 6, 60, true), 200);
    const char *body = json_string_value(j);
    char **ev = NULL;
    int n = wc_sse_parse(body, strlen(body), &ev);
    int ids[128], n_ids = 0, k = 0;
    long bytes = 0, bytes_thought = 0;
    for (int i = 0; i < n - 1 && !k; i++) {
        json_t *e = json_loads(ev[i], 0, NULL);
        json_t *d = json_object_get(json_array_get(json_object_get(e, "choices"), 0), "delta");
        json_t *sp = json_object_get(e, "spillway");
        json_t *t = json_object_get(sp, "token_ids");
        if (json_array_size(t) == 1) {
            if (json_object_get(d, "content")) {
                k = n_ids; /* the tokens before the answer's first */
            } else {
                ids[n_ids++] = (int)json_integer_value(json_array_get(t, 0));
                bytes += (long)json_integer_value(json_object_get(sp, "text_bytes"));
                if (json_object_get(d, "reasoning_content"))
                    bytes_thought = bytes;
            }
        }
        json_decref(e);
    }
    wc_sse_free(ev, n);
    json_decref(j);
    assert_true(k > 0 && bytes_thought > 0 && bytes > bytes_thought);
    json_t *b = json_pack("{s:[{s:s, s:s}], s:i, s:i, s:b, s:f, s:[s]}", "messages", "role",
                          "user", "content", "think", "seed", 6, "max_tokens", 4, "stream", 1,
                          "temperature", 1.0, "stop", "XYZ");
    json_t *toks = json_array();
    for (int i = 0; i < k; i++)
        json_array_append_new(toks, json_integer(ids[i]));
    json_object_set_new(b, "resume", json_pack("{s:o, s:i, s:I}", "tokens", toks, "draws", k,
                                               "text_bytes", (json_int_t)bytes_thought));
    reply rest;
    j = post(&g_qwen3, b, 200);
    read_stream(j, &rest);
    json_decref(j);
    if (rest.reasoning[0] || strstr(rest.content, "think>"))
        fail_msg("after the closing tags given back: reasoning '%s' content '%s'",
                 rest.reasoning, rest.content);
}

/* enable_thinking false renders the empty thought: the prompt is longer
 * by its tokens, and the reply is split the same way. */
static void test_enable_thinking_false(void **state)
{
    (void)state;
    json_t *a = post(&g_qwen3, chat_body(g_think, 1, 60, false), 200);
    json_t *body = chat_body(g_think, 1, 60, false);
    json_object_set_new(body, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
    json_t *b = post(&g_qwen3, body, 200);
    json_t *ua = json_object_get(a, "usage"), *ub = json_object_get(b, "usage");
    json_int_t pa = json_integer_value(json_object_get(ua, "prompt_tokens"));
    json_int_t pb = json_integer_value(json_object_get(ub, "prompt_tokens"));
    /* "<think>\n\n</think>\n\n" is 19 bytes: byte tokens, or fewer merged */
    assert_true(pb > pa);
    json_decref(a);
    json_decref(b);
}

/* ---- gpt-oss (harmony) --------------------------------------------------
 * The tiny model's vocabulary has no harmony control tokens, so its markers
 * are plain text here; a reply is put in the model's mouth as resumed
 * tokens (resume: the text a first worker had generated), and the worker
 * goes on from it: its splitter reads the resumed text first. */

static json_t *tokenize(const wc_worker *w, const char *text)
{
    json_t *b = json_pack("{s:s}", "content", text);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "POST", "/tokenize", s, 60000, &r), 0);
    free(s);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    wc_response_free(&r);
    json_t *t = json_incref(json_object_get(j, "tokens"));
    json_decref(j);
    return t;
}

static json_t *oss_body(const char *said, int max_tokens, bool stream, bool tools)
{
    json_t *b = json_pack("{s:[{s:s, s:s}, {s:s, s:s}], s:i, s:i, s:b, s:{s:o}}", "messages",
                          "role", "system", "content", "Be brief.", "role", "user", "content",
                          "Weather in Paris?", "seed", 1, "max_tokens", max_tokens, "stream",
                          stream, "resume", "tokens", tokenize(&g_oss, said));
    if (tools)
        json_object_set_new(
            b, "tools",
            json_pack("[{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}}, s:[s]}}}]", "type", "function",
                      "function", "name", "get_weather", "description", "Current weather.",
                      "parameters", "type", "object", "properties", "city", "type", "string",
                      "required", "city"));
    return b;
}

/* A commentary message to=functions.get_weather is a tool call; the
 * analysis before it the reasoning the client already had. */
static void test_harmony_tool_call(void **state)
{
    (void)state;
    const char *said = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                       "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                       "<|message|>{\"city\":\"Paris\"}<|call|>";
    for (int stream = 0; stream < 2; stream++) {
        json_t *j = post(&g_oss, oss_body(said, 1, stream, true), 200);
        json_t *calls = NULL, *choice = NULL;
        const char *finish = NULL;
        if (!stream) {
            choice = json_array_get(json_object_get(j, "choices"), 0);
            calls = json_object_get(json_object_get(choice, "message"), "tool_calls");
            finish = json_string_value(json_object_get(choice, "finish_reason"));
            assert_true(json_is_null(json_object_get(json_object_get(choice, "message"),
                                                     "content")));
            assert_string_equal(finish, "tool_calls");
        } else {
            const char *body = json_string_value(j);
            char **ev = NULL;
            int n = wc_sse_parse(body, strlen(body), &ev);
            for (int i = 0; i < n - 1; i++) {
                json_t *e = json_loads(ev[i], 0, NULL);
                json_t *c = json_array_get(json_object_get(e, "choices"), 0);
                json_t *tc = json_object_get(json_object_get(c, "delta"), "tool_calls");
                if (tc) {
                    assert_null(calls);
                    calls = json_incref(tc);
                }
                if (json_is_string(json_object_get(c, "finish_reason")))
                    assert_string_equal(
                        json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
                json_decref(e);
            }
            wc_sse_free(ev, n);
        }
        assert_int_equal(json_array_size(calls), 1);
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                            "{\"city\":\"Paris\"}");
        if (stream)
            json_decref(calls);
        json_decref(j);
    }
}

/* Resumed inside the analysis channel: the new text is reasoning; with
 * reasoning_format none it is content, markers included. */
static void test_harmony_resumed_analysis(void **state)
{
    (void)state;
    const char *said = "<|channel|>analysis<|message|>The user wants";
    reply a;
    json_t *j = post(&g_oss, oss_body(said, 4, true, false), 200);
    read_stream(j, &a);
    json_decref(j);
    assert_string_equal(a.finish, "length");
    assert_string_equal(a.content, "");
    j = post(&g_oss, oss_body(said, 4, false, false), 200);
    reply b;
    read_message(j, &b);
    json_decref(j);
    assert_string_equal(b.reasoning, a.reasoning);
    json_t *body = oss_body("<|channel|>final<|message|>Sunny", 2, false, false);
    json_object_set_new(body, "reasoning_format", json_string("none"));
    j = post(&g_oss, body, 200);
    read_message(j, &b);
    json_decref(j);
    assert_false(b.has_reasoning_field);
    assert_string_equal(b.finish, "length");
}

/* Qwen3 calls a tool after its thought (the Hermes syntax in the
 * content): the reply is given as resumed tokens and ended by EOS, which
 * logit_bias forces; the call is parsed from the content, not from the
 * thought before it. */
static void test_qwen3_tool_call_after_thought(void **state)
{
    (void)state;
    const char *said = "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
                       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                       "</tool_call>";
    for (int stream = 0; stream < 2; stream++) {
        json_t *b = json_pack("{s:[{s:s, s:s}], s:i, s:b, s:{s:o}, s:{s:i}}", "messages", "role",
                              "user", "content", "Weather in Paris?", "max_tokens", 3, "stream",
                              stream, "resume", "tokens", tokenize(&g_qwen3, said), "logit_bias",
                              "2", 100);
        json_object_set_new(
            b, "tools",
            json_pack("[{s:s, s:{s:s, s:{s:s, s:{s:{s:s}}}}}]", "type", "function", "function",
                      "name", "get_weather", "parameters", "type", "object", "properties",
                      "city", "type", "string"));
        json_t *j = post(&g_qwen3, b, 200);
        json_t *calls = NULL;
        char finish[32] = "", content[256] = "";
        if (!stream) {
            json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
            calls = json_incref(json_object_get(json_object_get(choice, "message"), "tool_calls"));
            cat(finish, sizeof finish, json_string_value(json_object_get(choice, "finish_reason")));
        } else {
            const char *body = json_string_value(j);
            char **ev = NULL;
            int n = wc_sse_parse(body, strlen(body), &ev);
            for (int i = 0; i < n - 1; i++) {
                json_t *e = json_loads(ev[i], 0, NULL);
                json_t *c = json_array_get(json_object_get(e, "choices"), 0);
                json_t *d = json_object_get(c, "delta");
                if (json_object_get(d, "tool_calls"))
                    calls = json_incref(json_object_get(d, "tool_calls"));
                cat(content, sizeof content, json_string_value(json_object_get(d, "content")));
                cat(finish, sizeof finish, json_string_value(json_object_get(c, "finish_reason")));
                json_decref(e);
            }
            wc_sse_free(ev, n);
        }
        assert_string_equal(finish, "tool_calls");
        assert_string_equal(content, "");
        assert_int_equal(json_array_size(calls), 1);
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                            "{\"city\":\"Paris\"}");
        json_decref(calls);
        json_decref(j);
    }
}

/* Harmony with its markers as control tokens (which the detokenizer
 * shows as nothing): the family is recognised in the template (the worker
 * has no --chat-template; only harmony splits this way), the
 * worker feeds the markers to the splitter, stops on <|call|> and
 * <|return|>, and does not stop on <|end|> (it only ends the analysis). A
 * reply is given as resumed tokens; logit_bias forces the next token. */
enum { H_START, H_CHANNEL, H_MESSAGE, H_END, H_RETURN, H_CALL, H_CONSTRAIN };

static void add_text(json_t *ids, const char *text)
{
    json_t *t = tokenize(&g_oss_real, text);
    json_array_extend(ids, t);
    json_decref(t);
}

static json_t *real_body(json_t *resume_ids, int force, int max_tokens, bool stream)
{
    json_t *b = json_pack("{s:[{s:s, s:s}], s:i, s:i, s:b, s:{s:o}}", "messages", "role", "user",
                          "content", "Weather in Paris?", "seed", 1, "max_tokens", max_tokens,
                          "stream", stream, "resume", "tokens", resume_ids);
    char id[16];
    snprintf(id, sizeof id, "%d", g_harmony_id[force]);
    json_object_set_new(b, "logit_bias", json_pack("{s:i}", id, 100));
    return b;
}

static void test_harmony_control_tokens(void **state)
{
    (void)state;
    /* the analysis, then a call cut before <|call|>, which the bias forces */
    json_t *ids = json_array();
    json_array_append_new(ids, json_integer(g_harmony_id[H_CHANNEL]));
    add_text(ids, "analysis");
    json_array_append_new(ids, json_integer(g_harmony_id[H_MESSAGE]));
    add_text(ids, "Need the weather.");
    json_array_append_new(ids, json_integer(g_harmony_id[H_END]));
    json_array_append_new(ids, json_integer(g_harmony_id[H_START]));
    add_text(ids, "assistant");
    json_array_append_new(ids, json_integer(g_harmony_id[H_CHANNEL]));
    add_text(ids, "commentary to=functions.get_weather ");
    json_array_append_new(ids, json_integer(g_harmony_id[H_CONSTRAIN]));
    add_text(ids, "json");
    json_array_append_new(ids, json_integer(g_harmony_id[H_MESSAGE]));
    add_text(ids, "{\"city\":\"Paris\"}");
    json_t *b = real_body(ids, H_CALL, 5, false);
    json_object_set_new(
        b, "tools",
        json_pack("[{s:s, s:{s:s, s:{s:s, s:{s:{s:s}}}}}]", "type", "function", "function",
                  "name", "get_weather", "parameters", "type", "object", "properties", "city",
                  "type", "string"));
    json_t *j = post(&g_oss_real, b, 200);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    json_t *fn = json_object_get(
        json_array_get(json_object_get(json_object_get(choice, "message"), "tool_calls"), 0),
        "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                        "{\"city\":\"Paris\"}");
    /* <|call|> stopped it: one token */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "completion_tokens")), 1);
    json_decref(j);

    /* inside the analysis, <|end|> forced: the marker is no text, and
     * generation goes on after it (<|end|> ends a message, not the turn) */
    for (int stream = 0; stream < 2; stream++) {
        ids = json_array();
        json_array_append_new(ids, json_integer(g_harmony_id[H_CHANNEL]));
        add_text(ids, "analysis");
        json_array_append_new(ids, json_integer(g_harmony_id[H_MESSAGE]));
        add_text(ids, "Thinking");
        reply r;
        j = post(&g_oss_real, real_body(ids, H_END, 3, stream), 200);
        if (stream)
            read_stream(j, &r);
        else
            read_message(j, &r);
        json_decref(j);
        assert_string_equal(r.finish, "length");
        assert_string_equal(r.reasoning, "");
        assert_string_equal(r.content, "");
    }
    /* with reasoning_format none the markers are content */
    ids = json_array();
    json_array_append_new(ids, json_integer(g_harmony_id[H_CHANNEL]));
    add_text(ids, "final");
    json_array_append_new(ids, json_integer(g_harmony_id[H_MESSAGE]));
    b = real_body(ids, H_END, 1, false);
    json_object_set_new(b, "reasoning_format", json_string("none"));
    reply r;
    j = post(&g_oss_real, b, 200);
    read_message(j, &r);
    json_decref(j);
    assert_string_equal(r.content, "<|end|>");
}

static void expect_400(json_t *body, const char *param)
{
    json_t *j = post(&g_qwen3, body, 400);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), param);
    json_decref(j);
}

static void test_bad_values(void **state)
{
    (void)state;
    json_t *b = chat_body(g_think, 1, 60, false);
    json_object_set_new(b, "reasoning_format", json_string("parsed"));
    expect_400(b, "reasoning_format");
    b = chat_body(g_think, 1, 60, false);
    json_object_set_new(b, "reasoning_format", json_integer(1));
    expect_400(b, "reasoning_format");
    b = chat_body(g_think, 1, 60, false);
    json_object_set_new(b, "chat_template_kwargs", json_pack("{s:s}", "enable_thinking", "no"));
    expect_400(b, "chat_template_kwargs");
    b = chat_body(g_think, 1, 60, false);
    json_object_set_new(b, "chat_template_kwargs", json_string("x"));
    expect_400(b, "chat_template_kwargs");
    b = chat_body(g_think, 1, 60, false);
    json_object_set_new(b, "reasoning_effort", json_string("max"));
    expect_400(b, "reasoning_effort");
    b = json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:i}, {s:s, s:s}]}", "messages", "role", "user",
                  "content", "a", "role", "assistant", "content", "b", "reasoning_content", 5,
                  "role", "user", "content", "c");
    expect_400(b, "messages");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_qwen3),
        cmocka_unit_test(test_split_deepseek_open),
        cmocka_unit_test(test_format_none),
        cmocka_unit_test(test_unclosed_at_max_tokens),
        cmocka_unit_test(test_resume_mid_thought),
        cmocka_unit_test(test_resume_held_text),
        cmocka_unit_test(test_enable_thinking_false),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_harmony_tool_call),
        cmocka_unit_test(test_harmony_resumed_analysis),
        cmocka_unit_test(test_harmony_control_tokens),
        cmocka_unit_test(test_qwen3_tool_call_after_thought),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
