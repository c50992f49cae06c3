/* test_worker_messages.c - end-to-end: Anthropic's Messages API
 * (POST /v1/messages, /v1/messages/count_tokens) on a real
 * `spillway worker` over HTTP.
 *
 * A Messages request is served as the chat request it translates to, so
 * each answer is checked against the chat answer of the same request
 * (same text, the finish reason mapped, the same prompt tokens): plain
 * text with a system prompt, a multi-turn conversation, stop_sequences
 * (stop_reason stop_sequence and the string), max_tokens, tool use with
 * tool_choice any / tool / none and a tool_result round trip, thinking
 * blocks of a Qwen3-family worker (the thought forced by a grammar, as
 * test_worker_reasoning does), every stream read strictly
 * (messages_check.h) and equal to the non-stream answer; count_tokens;
 * refusals in Anthropic's error shape, after which the worker still
 * serves.
 */
#include "testutil.h"
#include "messages_check.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];
static wc_worker g_plain, g_qwen3;

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 23;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-messages.gguf"));
    if (eng_model_make(&p, g_model, NULL) != 0 || !tu_spillway_bin())
        return -1;
    const char *const a1[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024", NULL};
    const char *const a2[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024",
                              "--chat-template", "qwen3", NULL};
    if (wc_worker_start(&g_plain, g_model, a1, NULL, 30, NULL) != 0)
        return -1;
    return wc_worker_start(&g_qwen3, g_model, a2, NULL, 30, NULL);
}

static int teardown(void **state)
{
    (void)state;
    int a = wc_worker_stop(&g_plain), b = wc_worker_stop(&g_qwen3);
    remove(g_model);
    wc_worker_kill_all();
    return a == 0 && b == 0 ? 0 : -1;
}

/* POSTs text to path; the response (the caller frees it). */
static void post_raw(const wc_worker *w, const char *path, const char *text, int want_status,
                     wc_response *r)
{
    assert_int_equal(wc_request(w->socket_path, "POST", path, text, 60000, r), 0);
    if (r->status != want_status)
        fail_msg("%s: status %d, not %d: %s", path, r->status, want_status, r->body);
}

/* POSTs body (consumed) to path: the JSON answer, or for a stream the
 * Message the stream tells (checked strictly). */
static json_t *post(const wc_worker *w, const char *path, json_t *body, int want_status)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    wc_response r;
    post_raw(w, path, s, want_status, &r);
    free(s);
    json_t *j;
    if (strstr(r.headers, "text/event-stream")) {
        char why[256] = "";
        j = mc_stream_message(r.body, r.body_len, why, sizeof why);
        if (!j)
            fail_msg("a malformed Messages stream (%s):\n%s", why, r.body);
    } else {
        j = json_loads(r.body, 0, NULL);
        if (!j)
            fail_msg("not JSON: %s", r.body);
    }
    wc_response_free(&r);
    return j;
}

static json_t *messages(const char *model_unused_user_text)
{
    return json_pack("[{s:s, s:s}]", "role", "user", "content", model_unused_user_text);
}

/* The text of a Message's text blocks (sw_free). */
static char *text_of(json_t *m)
{
    return mc_blocks_text(m, "text");
}

/* The error type of an Anthropic error answer. */
static const char *error_type(json_t *j)
{
    assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
    const char *t = json_string_value(json_object_get(json_object_get(j, "error"), "type"));
    assert_non_null(t);
    assert_non_null(json_string_value(json_object_get(json_object_get(j, "error"), "message")));
    return t;
}

static void check_message_shape(json_t *m)
{
    const char *id = json_string_value(json_object_get(m, "id"));
    assert_non_null(id);
    assert_memory_equal(id, "msg_", 4);
    assert_string_equal(json_string_value(json_object_get(m, "type")), "message");
    assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
    assert_non_null(json_string_value(json_object_get(m, "model")));
    assert_true(json_is_array(json_object_get(m, "content")));
    assert_non_null(json_string_value(json_object_get(m, "stop_reason")));
    json_t *u = json_object_get(m, "usage");
    assert_true(json_integer_value(json_object_get(u, "input_tokens")) > 0);
    assert_true(json_is_integer(json_object_get(u, "output_tokens")));
}

/* Plain text with a system prompt: the chat answer's text, max_tokens as
 * the stop reason, usage as the chat's; the stream tells the same
 * Message; count_tokens counts the same prompt. */
static void test_text_system_stream(void **state)
{
    (void)state;
    json_t *m = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:f, s:s, s:o}", "model", "spillway-synthetic",
                               "max_tokens", 8, "temperature", 0.0, "system", "Be brief.",
                               "messages", messages("Tell a story")),
                     200);
    check_message_shape(m);
    json_t *c = post(&g_plain, "/v1/chat/completions",
                     json_pack("{s:i, s:f, s:[{s:s, s:s}, {s:s, s:s}]}", "max_tokens", 8,
                               "temperature", 0.0, "messages", "role", "system", "content",
                               "Be brief.", "role", "user", "content", "Tell a story"),
                     200);
    json_t *cmsg = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message");
    char *text = text_of(m);
    assert_string_equal(text, json_string_value(json_object_get(cmsg, "content")));
    const char *finish = json_string_value(
        json_object_get(json_array_get(json_object_get(c, "choices"), 0), "finish_reason"));
    assert_string_equal(json_string_value(json_object_get(m, "stop_reason")),
                        strcmp(finish, "length") == 0 ? "max_tokens" : "end_turn");
    assert_null(json_string_value(json_object_get(m, "stop_sequence")));
    json_t *u = json_object_get(m, "usage"), *cu = json_object_get(c, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")),
                     json_integer_value(json_object_get(cu, "prompt_tokens")));
    assert_int_equal(json_integer_value(json_object_get(u, "output_tokens")),
                     json_integer_value(json_object_get(cu, "completion_tokens")));
    /* streamed: the same Message */
    json_t *s = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:f, s:s, s:o, s:b}", "model", "spillway-synthetic",
                               "max_tokens", 8, "temperature", 0.0, "system", "Be brief.",
                               "messages", messages("Tell a story"), "stream", 1),
                     200);
    char *stext = text_of(s);
    assert_string_equal(stext, text);
    assert_string_equal(json_string_value(json_object_get(s, "stop_reason")),
                        json_string_value(json_object_get(m, "stop_reason")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "usage"),
                                                        "output_tokens")),
                     json_integer_value(json_object_get(u, "output_tokens")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "usage"),
                                                        "input_tokens")),
                     json_integer_value(json_object_get(u, "input_tokens")));
    /* count_tokens: the prompt as /v1/messages prefills it */
    json_t *n = post(&g_plain, "/v1/messages/count_tokens",
                     json_pack("{s:s, s:s, s:o}", "model", "spillway-synthetic", "system",
                               "Be brief.", "messages", messages("Tell a story")),
                     200);
    assert_int_equal(json_integer_value(json_object_get(n, "input_tokens")),
                     json_integer_value(json_object_get(u, "input_tokens")));
    sw_free(text);
    sw_free(stext);
    json_decref(m);
    json_decref(c);
    json_decref(s);
    json_decref(n);
}

/* A conversation of several turns (system as blocks, content as blocks)
 * renders the prompt its chat form does. */
static void test_multi_turn(void **state)
{
    (void)state;
    json_t *m = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:[{s:s, s:s}], s:[{s:s, s:s}, {s:s, s:[{s:s, s:s}]}, "
                               "{s:s, s:[{s:s, s:s}, {s:s, s:s}]}]}",
                               "model", "spillway-synthetic", "max_tokens", 4, "system", "type",
                               "text", "text", "You are terse.", "messages", "role", "user",
                               "content", "Hello", "role", "assistant", "content", "type",
                               "text", "text", "Hi there", "role", "user", "content", "type",
                               "text", "text", "How are", "type", "text", "text", "you?"),
                     200);
    check_message_shape(m);
    json_t *c = post(&g_plain, "/v1/chat/completions",
                     json_pack("{s:i, s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}]}",
                               "max_tokens", 4, "messages", "role", "system", "content",
                               "You are terse.", "role", "user", "content", "Hello", "role",
                               "assistant", "content", "Hi there", "role", "user", "content",
                               "How are\nyou?"),
                     200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "usage"),
                                                        "input_tokens")),
                     json_integer_value(json_object_get(json_object_get(c, "usage"),
                                                        "prompt_tokens")));
    json_decref(m);
    json_decref(c);
}

/* stop_sequences: the answer ends before the string, stop_reason
 * stop_sequence names it; streamed the same. */
static void test_stop_sequence(void **state)
{
    (void)state;
    json_t *m = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:f, s:o}", "model", "spillway-synthetic",
                               "max_tokens", 16, "temperature", 0.0, "messages",
                               messages("Once upon a time")),
                     200);
    char *full = text_of(m);
    json_decref(m);
    /* the third word of the uninterrupted text as the stop string */
    const char *w = full;
    for (int k = 0; k < 2 && w; k++)
        w = strchr(w + 1, ' ');
    assert_non_null(w);
    const char *we = strchr(w + 1, ' ');
    char stop[64];
    snprintf(stop, sizeof stop, "%.*s", (int)(we ? we - w : (long)strlen(w)), w);
    for (int stream = 0; stream < 2; stream++) {
        json_t *s = post(&g_plain, "/v1/messages",
                         json_pack("{s:s, s:i, s:f, s:o, s:[s], s:b}", "model",
                                   "spillway-synthetic", "max_tokens", 16, "temperature", 0.0,
                                   "messages", messages("Once upon a time"), "stop_sequences",
                                   stop, "stream", stream),
                         200);
        assert_string_equal(json_string_value(json_object_get(s, "stop_reason")),
                            "stop_sequence");
        assert_string_equal(json_string_value(json_object_get(s, "stop_sequence")), stop);
        char *t = text_of(s);
        assert_int_equal(strlen(t), (size_t)(strstr(full, stop) - full));
        assert_memory_equal(t, full, strlen(t));
        sw_free(t);
        json_decref(s);
    }
    /* max_tokens: stop_reason max_tokens, that many output tokens */
    for (int stream = 0; stream < 2; stream++) {
        json_t *s = post(&g_plain, "/v1/messages",
                         json_pack("{s:s, s:i, s:f, s:o, s:b}", "model", "spillway-synthetic",
                                   "max_tokens", 3, "temperature", 0.0, "messages",
                                   messages("Once upon a time"), "stream", stream),
                         200);
        assert_string_equal(json_string_value(json_object_get(s, "stop_reason")), "max_tokens");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "usage"),
                                                            "output_tokens")),
                         3);
        json_decref(s);
    }
    sw_free(full);
}

static json_t *weather_tools(void)
{
    return json_pack("[{s:s, s:s, s:{s:s, s:{s:{s:s, s:i}}, s:[s]}}, {s:s, s:{s:s, s:{s:{s:s, "
                     "s:i}}, s:[s]}}]",
                     "name", "get_weather", "description", "The weather in a city",
                     "input_schema", "type", "object", "properties", "city", "type", "string",
                     "maxLength", 8, "required", "city", "name", "get_time", "input_schema",
                     "type", "object", "properties", "zone", "type", "string", "maxLength", 6,
                     "required", "zone");
}

/* The tool_use block of a Message (asserted: exactly one, and no text). */
static json_t *tool_use_of(json_t *m, const char *want_name)
{
    json_t *content = json_object_get(m, "content"), *tu = NULL;
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *b = json_array_get(content, i);
        if (strcmp(json_string_value(json_object_get(b, "type")), "tool_use") == 0) {
            assert_null(tu);
            tu = b;
        }
    }
    assert_non_null(tu);
    assert_string_equal(json_string_value(json_object_get(tu, "name")), want_name);
    assert_true(json_string_length(json_object_get(tu, "id")) > 0);
    assert_true(json_is_object(json_object_get(tu, "input")));
    assert_string_equal(json_string_value(json_object_get(m, "stop_reason")), "tool_use");
    return tu;
}

/* Tools: any -> a call of one of them, tool -> that one (streamed: the
 * same input, as input_json_delta pieces), none -> text; then the call
 * and its tool_result sent back are rendered as the chat form's
 * assistant tool_calls and tool message are. */
static void test_tool_use_round_trip(void **state)
{
    (void)state;
    json_t *m = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:o, s:{s:s}, s:o}", "model", "spillway-synthetic",
                               "max_tokens", 64, "tools", weather_tools(), "tool_choice", "type",
                               "any", "messages", messages("Weather in Paris?")),
                     200);
    json_t *tu = tool_use_of(m, json_string_value(json_object_get(
                                    json_array_get(json_object_get(m, "content"), 0), "name")));
    const char *name = json_string_value(json_object_get(tu, "name"));
    assert_true(strcmp(name, "get_weather") == 0 || strcmp(name, "get_time") == 0);
    json_decref(m);
    for (int stream = 0; stream < 2; stream++) {
        json_t *n = post(&g_plain, "/v1/messages",
                         json_pack("{s:s, s:i, s:f, s:o, s:{s:s, s:s}, s:o, s:b}", "model",
                                   "spillway-synthetic", "max_tokens", 64, "temperature", 0.0,
                                   "tools", weather_tools(), "tool_choice", "type", "tool",
                                   "name", "get_time", "messages", messages("Time?"), "stream",
                                   stream),
                         200);
        json_t *call = tool_use_of(n, "get_time");
        assert_true(json_is_string(json_object_get(json_object_get(call, "input"), "zone")));
        static json_t *first_input;
        if (!stream) {
            first_input = json_deep_copy(json_object_get(call, "input"));
        } else {
            assert_true(json_equal(first_input, json_object_get(call, "input")));
            json_decref(first_input);
        }
        json_decref(n);
    }
    json_t *none = post(&g_plain, "/v1/messages",
                        json_pack("{s:s, s:i, s:o, s:{s:s}, s:o}", "model", "spillway-synthetic",
                                  "max_tokens", 4, "tools", weather_tools(), "tool_choice",
                                  "type", "none", "messages", messages("Weather?")),
                        200);
    assert_string_equal(json_string_value(
                            json_object_get(json_array_get(json_object_get(none, "content"), 0),
                                            "type")),
                        "text");
    json_decref(none);
    /* the round trip: the call and its result sent back */
    json_t *turns = json_pack(
        "[{s:s, s:s}, {s:s, s:[{s:s, s:s}, {s:s, s:s, s:s, s:{s:s}}]}, {s:s, s:[{s:s, s:s, "
        "s:s}]}]",
        "role", "user", "content", "Weather in Paris?", "role", "assistant", "content", "type",
        "text", "text", "Let me look.", "type", "tool_use", "id", "toolu_01", "name",
        "get_weather", "input", "city", "Paris", "role", "user", "content", "type",
        "tool_result", "tool_use_id", "toolu_01", "content", "18 C, sunny");
    json_t *r = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:o, s:O}", "model", "spillway-synthetic",
                               "max_tokens", 6, "tools", weather_tools(), "messages", turns),
                     200);
    check_message_shape(r);
    json_t *chat_tools = json_pack(
        "[{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s, s:i}}, s:[s]}}}, {s:s, s:{s:s, s:{s:s, "
        "s:{s:{s:s, s:i}}, s:[s]}}}]",
        "type", "function", "function", "name", "get_weather", "description",
        "The weather in a city", "parameters", "type", "object", "properties", "city", "type",
        "string", "maxLength", 8, "required", "city", "type", "function", "function", "name",
        "get_time", "parameters", "type", "object", "properties", "zone", "type", "string",
        "maxLength", 6, "required", "zone");
    json_t *c = post(
        &g_plain, "/v1/chat/completions",
        json_pack("{s:i, s:o, s:[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}, {s:s, "
                  "s:s, s:s}]}",
                  "max_tokens", 6, "tools", chat_tools, "messages", "role", "user", "content",
                  "Weather in Paris?", "role", "assistant", "content", "Let me look.",
                  "tool_calls", "id", "toolu_01", "type", "function", "function", "name",
                  "get_weather", "arguments", "{\"city\":\"Paris\"}", "role", "tool",
                  "tool_call_id", "toolu_01", "content", "18 C, sunny"),
        200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "usage"),
                                                        "input_tokens")),
                     json_integer_value(json_object_get(json_object_get(c, "usage"),
                                                        "prompt_tokens")));
    /* count_tokens counts the tools and the turns too */
    json_t *n = post(&g_plain, "/v1/messages/count_tokens",
                     json_pack("{s:s, s:o, s:O}", "model", "spillway-synthetic", "tools",
                               weather_tools(), "messages", turns),
                     200);
    assert_int_equal(json_integer_value(json_object_get(n, "input_tokens")),
                     json_integer_value(json_object_get(json_object_get(r, "usage"),
                                                        "input_tokens")));
    json_decref(n);
    json_decref(turns);
    json_decref(r);
    json_decref(c);
}

/* A thinking model (the Qwen3 family, the thought forced by a grammar):
 * a thinking block, then the text block; streamed the same. */
static void test_thinking(void **state)
{
    (void)state;
    const char *grammar = "root ::= \"<think>\\n\" [a-z]{2,8} \"\\n</think>\\n\\n\" [a-z]{1,6}\n";
    json_t *ms[2];
    for (int stream = 0; stream < 2; stream++) {
        ms[stream] = post(&g_qwen3, "/v1/messages",
                          json_pack("{s:s, s:i, s:f, s:i, s:s, s:{s:s, s:i}, s:o, s:b}", "model",
                                    "spillway-synthetic", "max_tokens", 40, "temperature", 1.0,
                                    "seed", 5, "grammar", grammar, "thinking", "type", "enabled",
                                    "budget_tokens", 1024, "messages", messages("think"),
                                    "stream", stream),
                          200);
        json_t *content = json_object_get(ms[stream], "content");
        assert_int_equal(json_array_size(content), 2);
        json_t *t = json_array_get(content, 0), *x = json_array_get(content, 1);
        assert_string_equal(json_string_value(json_object_get(t, "type")), "thinking");
        assert_true(json_string_length(json_object_get(t, "thinking")) >= 2);
        assert_non_null(json_object_get(t, "signature"));
        assert_string_equal(json_string_value(json_object_get(x, "type")), "text");
        assert_true(json_string_length(json_object_get(x, "text")) >= 1);
        assert_string_equal(json_string_value(json_object_get(ms[stream], "stop_reason")),
                            "end_turn");
    }
    assert_true(json_equal(json_object_get(ms[0], "content"), json_object_get(ms[1], "content")));
    json_decref(ms[0]);
    json_decref(ms[1]);
    /* a thought sent back in an assistant turn is accepted */
    json_t *back = post(&g_qwen3, "/v1/messages",
                        json_pack("{s:s, s:i, s:[{s:s, s:s}, {s:s, s:[{s:s, s:s, s:s}, {s:s, "
                                  "s:s}]}, {s:s, s:s}]}",
                                  "model", "spillway-synthetic", "max_tokens", 2, "messages",
                                  "role", "user", "content", "a", "role", "assistant", "content",
                                  "type", "thinking", "thinking", "hmm", "signature", "",
                                  "type", "text", "text", "b", "role", "user", "content", "c"),
                        200);
    json_decref(back);
}

/* Refusals: each in Anthropic's shape with its HTTP status; the worker
 * still serves after them. */
static void test_errors(void **state)
{
    (void)state;
    static const struct {
        const char *path, *body;
        int status;
        const char *type;
    } cases[] = {
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"hi\"}]}", 400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"system\",\"content\":\"hi\"}]}", 400,
         "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"robot\",\"content\":\"hi\"}]}", 400,
         "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"no-such-model\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"user\",\"content\":\"hi\"}]}", 404, "not_found_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"messages\":[]}",
         400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":0,\"messages\":[{"
                         "\"role\":\"user\",\"content\":\"hi\"}]}", 400,
         "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"tool_choice\":{"
                         "\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}"
                         "]}", 400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"tools\":[{"
                         "\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
                         "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400,
         "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}", 400,
         "invalid_request_error"},
        {"/v1/messages", "{\"model\":", 400, "invalid_request_error"},
        {"/v1/messages", "[1,2]", 400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"temperature\":"
                         "\"hot\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400,
         "invalid_request_error"},
        {"/v1/messages/count_tokens", "{\"model\":\"spillway-synthetic\",\"messages\":[{"
                                      "\"role\":\"user\",\"content\":[{\"type\":\"document\"}]"
                                      "}]}", 400, "invalid_request_error"},
        {"/v1/messages/count_tokens", "{\"model\":\"other\",\"messages\":[{\"role\":\"user\","
                                      "\"content\":\"hi\"}]}", 404, "not_found_error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wc_response r;
        post_raw(&g_plain, cases[i].path, cases[i].body, cases[i].status, &r);
        json_t *j = json_loads(r.body, 0, NULL);
        if (!j)
            fail_msg("case %zu: not JSON: %s", i, r.body);
        assert_string_equal(error_type(j), cases[i].type);
        json_decref(j);
        wc_response_free(&r);
    }
    /* GET is not the method */
    wc_response r;
    assert_int_equal(wc_request(g_plain.socket_path, "GET", "/v1/messages", NULL, 10000, &r), 0);
    assert_int_equal(r.status, 405);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_string_equal(error_type(j), "invalid_request_error");
    json_decref(j);
    wc_response_free(&r);
    /* still serving */
    json_t *m = post(&g_plain, "/v1/messages",
                     json_pack("{s:s, s:i, s:o}", "model", "spillway-synthetic", "max_tokens", 2,
                               "messages", messages("hi")),
                     200);
    check_message_shape(m);
    json_decref(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_system_stream),
        cmocka_unit_test(test_multi_turn),
        cmocka_unit_test(test_stop_sequence),
        cmocka_unit_test(test_tool_use_round_trip),
        cmocka_unit_test(test_thinking),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
