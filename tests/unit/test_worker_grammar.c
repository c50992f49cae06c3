/* test_worker_grammar.c - end-to-end: the `grammar` field (GBNF, as
 * llama-server takes it) on a real `spillway worker` serving a random tiny
 * model, over HTTP.
 *
 * Sampled at temperature 1, a random model writes anything it is allowed
 * to, so every reply that matches is the constraint's doing: completions
 * and chat, non-stream and stream, are checked against the grammar by a
 * hand-written matcher of this file (not the engine's) and by the GBNF
 * reference matcher. A grammar that does not parse is a 400 naming the
 * line and column, and one beside a JSON response_format or forced tools,
 * or one whose shortest text does not fit max_tokens, a 400 naming the
 * param.
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "grammar/gbnf.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];
static wc_worker g_w;

/* A call like f(12, g(3, x), "hi"): nesting through recursion. */
static const char *const g_call =
    "root ::= call\n"
    "call ::= name \"(\" ( arg ( \", \" arg )* )? \")\"\n"
    "arg  ::= call | [0-9]{1,3} | \"x\" | \"\\\"\" [a-z ]{0,6} \"\\\"\"\n"
    "name ::= [a-h]\n";

static int setup(void **state)
{
    (void)state;
    return wc_worker_start_made(&g_w, "worker-grammar.gguf", 23, 1024, g_model, sizeof g_model);
}

static int teardown(void **state)
{
    (void)state;
    return wc_worker_stop_made(&g_w, g_model);
}

/* ---- a matcher for g_call, by hand ---------------------------------------- */

static bool m_call(const char **s, int depth);

static bool m_arg(const char **s, int depth)
{
    const char *p = *s;
    if (*p >= 'a' && *p <= 'h' && p[1] == '(')
        return m_call(s, depth + 1);
    if (*p == 'x') {
        *s = p + 1;
        return true;
    }
    if (*p == '"') {
        int n = 0;
        for (p++; (*p >= 'a' && *p <= 'z') || *p == ' '; p++)
            n++;
        if (*p != '"' || n > 6)
            return false;
        *s = p + 1;
        return true;
    }
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 4)
        p++, digits++;
    if (digits < 1 || digits > 3)
        return false;
    *s = p;
    return true;
}

static bool m_call(const char **s, int depth)
{
    const char *p = *s;
    if (depth > 64 || !(*p >= 'a' && *p <= 'h') || p[1] != '(')
        return false;
    p += 2;
    if (*p != ')') {
        for (;;) {
            if (!m_arg(&p, depth))
                return false;
            if (strncmp(p, ", ", 2) != 0)
                break;
            p += 2;
        }
    }
    if (*p != ')')
        return false;
    *s = p + 1;
    return true;
}

static void check_call(const char *text)
{
    const char *p = text;
    if (!m_call(&p, 0) || *p)
        fail_msg("not a call: '%s'", text);
    eng_gbnf *g = NULL;
    assert_int_equal(eng_gbnf_parse(g_call, strlen(g_call), &g, NULL), SW_OK);
    assert_true(eng_gbnf_match(g, text, strlen(text)));
    eng_gbnf_free(g);
}

/* ---- requests ------------------------------------------------------------ */

static json_t *post(const char *path, json_t *body, int want_status)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", path, s, 60000, &r), 0);
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

static void test_completions(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 4; seed++) {
        json_t *j = post("/v1/completions",
                         json_pack("{s:s, s:i, s:i, s:s}", "prompt", "Call:", "seed", seed,
                                   "max_tokens", 40, "grammar", g_call),
                         200);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
        check_call(json_string_value(json_object_get(choice, "text")));
        json_decref(j);
    }
}

static void test_chat_stream(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 3; seed++) {
        json_t *j = post("/v1/chat/completions",
                         json_pack("{s:[{s:s, s:s}], s:i, s:i, s:b, s:s}", "messages", "role",
                                   "user", "content", "a date", "seed", seed, "max_tokens", 30,
                                   "stream", 1, "grammar",
                                   "root ::= year \"-\" month \"-\" day\n"
                                   "year ::= \"20\" [0-9] [0-9]\n"
                                   "month ::= \"0\" [1-9] | \"1\" [0-2]\n"
                                   "day ::= \"0\" [1-9] | [12] [0-9] | \"3\" [01]\n"),
                         200);
        const char *body = json_string_value(j);
        char **ev = NULL;
        int n = wc_sse_parse(body, strlen(body), &ev);
        assert_true(n >= 2);
        char text[256] = "";
        for (int i = 0; i < n - 1; i++) {
            json_t *e = json_loads(ev[i], 0, NULL);
            json_t *d = json_object_get(json_array_get(json_object_get(e, "choices"), 0), "delta");
            const char *c = json_string_value(json_object_get(d, "content"));
            if (c)
                snprintf(text + strlen(text), sizeof text - strlen(text), "%s", c);
            json_decref(e);
        }
        assert_string_equal(ev[n - 1], "[DONE]");
        wc_sse_free(ev, n);
        int y, mo, d;
        char tail;
        if (sscanf(text, "20%2d-%2d-%2d%c", &y, &mo, &d, &tail) != 3 || strlen(text) != 10 ||
            mo < 1 || mo > 12 || d < 1 || d > 31)
            fail_msg("not a date: '%s'", text);
        json_decref(j);
    }
}

static void expect_400(const char *path, json_t *body, const char *param, const char *words)
{
    json_t *j = post(path, body, 400);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (strcmp(json_string_value(json_object_get(e, "param")), param) != 0 ||
        !strstr(msg, words))
        fail_msg("param %s, message '%s'", json_string_value(json_object_get(e, "param")), msg);
    json_decref(j);
}

static void test_bad_grammars(void **state)
{
    (void)state;
    const char *cmpl = "/v1/completions", *chat = "/v1/chat/completions";
    expect_400(cmpl, json_pack("{s:s, s:s}", "prompt", "x", "grammar", "root ::= \"a\"\nb ::= [x"),
               "grammar", "line 2, column");
    expect_400(cmpl, json_pack("{s:s, s:s}", "prompt", "x", "grammar", "root ::= root \"a\" | \"b\""),
               "grammar", "left-recursive");
    expect_400(cmpl, json_pack("{s:s, s:i}", "prompt", "x", "grammar", 7), "grammar", "string");
    expect_400(chat,
               json_pack("{s:[{s:s, s:s}], s:s, s:{s:s}}", "messages", "role", "user", "content",
                         "x", "grammar", "root ::= \"a\"", "response_format", "type",
                         "json_object"),
               "grammar", "response_format");
    expect_400(chat,
               json_pack("{s:[{s:s, s:s}], s:s, s:[{s:s, s:{s:s}}], s:s}", "messages", "role",
                         "user", "content", "x", "grammar", "root ::= \"a\"", "tools", "type",
                         "function", "function", "name", "f", "tool_choice", "required"),
               "grammar", "tools");
    expect_400(cmpl, json_pack("{s:s, s:s, s:i}", "prompt", "x", "grammar", "root ::= [a-z]{20}",
                               "max_tokens", 5),
               "max_tokens", "grammar needs at least 20");
    /* an empty grammar is none (llama-server's reading) */
    json_t *j = post(cmpl, json_pack("{s:s, s:s, s:i}", "prompt", "x", "grammar", "",
                                     "max_tokens", 2),
                     200);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions),
        cmocka_unit_test(test_chat_stream),
        cmocka_unit_test(test_bad_grammars),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
