/* test_router_agent_edges.c - agent runs ("tool_execution": "server") fed
 * what a model on another engine, or a tool, may send at the edges, end to
 * end with a real `spillway serve`, real sockets and the real ledger:
 *
 *  - tool-call arguments that repeat a key: the router's schema check and
 *    the tool could read different values (the check the last one, the
 *    tool perhaps the first), so the call is invalid and never made;
 *  - a call id longer than the router keeps, whose cut falls inside a
 *    UTF-8 sequence: the call and its result must still be in the
 *    conversation the model sees next and in spillway.tool_steps;
 *  - a tool answer longer than the result cap (256 KiB): the tool
 *    answered, so its outcome is known: the result is cut, the run goes
 *    on, and a non-idempotent tool is not treated as "unknown outcome";
 *  - a tool that sends its answer (or its response head) a byte at a
 *    time, each read quick but the whole past the run's deadline: the run
 *    ends at the deadline (504 deadline_exceeded), as a tool call waits at
 *    most what is left;
 *  - a streamed reply in thousands of pieces (content and tool-call
 *    fragments): the call and the answer are put together whole;
 *  - a streamed generation with text and then a call in the same chunk
 *    (an engine without the worker's hold-back): the text may reach the
 *    client, the call's delta never does.
 *
 * The engine is an OpenAI-compatible server thread configured as a
 * kind = openai worker, so that a test chooses what "the model" sends; the
 * tool server is a thread that counts calls and keeps their bodies.
 */
#include "testutil.h"
#include "fake_server.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static char g_model[512];

/* The router's cap on a tool's answer (router_agent.c). */
#define RESULT_CAP ((size_t)256 << 10)

/* ---- the tool ---------------------------------------------------------- */

static pthread_mutex_t g_tool_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_tool_calls;
static char g_tool_body[256];
static atomic_size_t g_tool_answer_bytes; /* 0: "RESULT-n" */
static atomic_int g_tool_drip_ms;         /* > 0: the answer a byte at a time */
static atomic_bool g_tool_drip_head;      /* ... its head too */

/* 25 bytes, one every drip_ms: each read of the answer is quick, the
 * whole answer is not. Stops when the router hung up. */
static void drip_answer(int fd, int drip_ms)
{
    static const char body[] = "RESULT-dripped-slowly-25b";
    char head[160];
    int m = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     sizeof body - 1);
    if (atomic_load(&g_tool_drip_head)) {
        for (int i = 0; i < m; i++) {
            usleep((useconds_t)drip_ms * 1000);
            if (send(fd, head + i, 1, MSG_NOSIGNAL) != 1)
                return;
        }
    } else {
        fs_send_all(fd, head, (size_t)m);
    }
    for (size_t i = 0; i < sizeof body - 1; i++) {
        usleep((useconds_t)drip_ms * 1000);
        if (send(fd, body + i, 1, MSG_NOSIGNAL) != 1)
            return;
    }
}

static void tool_answer(fs_server *s, int fd, const char *req, const char *body)
{
    (void)s;
    (void)req;
    pthread_mutex_lock(&g_tool_mu);
    int n = ++g_tool_calls;
    snprintf(g_tool_body, sizeof g_tool_body, "%s", body);
    pthread_mutex_unlock(&g_tool_mu);
    int drip = atomic_load(&g_tool_drip_ms);
    if (drip > 0) {
        drip_answer(fd, drip);
        return;
    }
    size_t big = atomic_load(&g_tool_answer_bytes);
    if (big) {
        char *b = sw_malloc(big);
        assert_non_null(b);
        memset(b, 'x', big);
        fs_send_reply(fd, 200, "text/plain", b, big);
        sw_free(b);
        return;
    }
    char out[64];
    snprintf(out, sizeof out, "RESULT-%d", n);
    fs_send_reply(fd, 200, "text/plain", out, strlen(out));
}

static int tool_calls(void)
{
    pthread_mutex_lock(&g_tool_mu);
    int n = g_tool_calls;
    pthread_mutex_unlock(&g_tool_mu);
    return n;
}

static void tool_reset(size_t answer_bytes)
{
    pthread_mutex_lock(&g_tool_mu);
    g_tool_calls = 0;
    g_tool_body[0] = 0;
    pthread_mutex_unlock(&g_tool_mu);
    atomic_store(&g_tool_answer_bytes, answer_bytes);
    atomic_store(&g_tool_drip_ms, 0);
    atomic_store(&g_tool_drip_head, false);
}

/* ---- the scripted engine ---------------------------------------------- */

/* What "the model" answers to the generation that follows k tool results:
 * a call (name, arguments, id) or content. */
typedef struct gen_script {
    const char *name;
    const char *arguments;
    const char *id;
    const char *content;
} gen_script;

static const gen_script *g_script;
static int g_script_len;
static pthread_mutex_t g_eng_mu = PTHREAD_MUTEX_INITIALIZER;
static json_t *g_eng_requests; /* the bodies the engine got, in order */

/* One SSE event of a streamed chat chunk with the given delta. */
static void send_chunk(int fd, json_t *delta, const char *finish)
{
    json_t *c = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:o, s:s?}]}", "id", "chatcmpl-fake",
                          "object", "chat.completion.chunk", "created", 1, "model", "fake",
                          "choices", "index", 0, "delta", delta, "finish_reason", finish);
    char *s = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    assert_non_null(s);
    char hex[32];
    size_t n = strlen(s) + 8;
    int hn = snprintf(hex, sizeof hex, "%zx\r\n", n);
    fs_send_all(fd, hex, (size_t)hn);
    fs_send_all(fd, "data: ", 6);
    fs_send_all(fd, s, strlen(s));
    fs_send_all(fd, "\n\n\r\n", 4);
    free(s);
}

/* A streamed answer: the call's name and arguments, or the content, one
 * byte per chunk (as a token-by-token engine may send them). */
static void stream_answer(int fd, const gen_script *g)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    fs_send_all(fd, head, sizeof head - 1);
    send_chunk(fd, json_pack("{s:s}", "role", "assistant"), NULL);
    if (g && g->name && g->content) {
        /* text, then the whole call in the chunk that ends the text (as
         * an engine without hold-back may send it) */
        send_chunk(fd, json_pack("{s:s}", "content", g->content), NULL);
        send_chunk(fd,
                   json_pack("{s:s, s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "content", ".",
                             "tool_calls", "index", 0, "id", g->id ? g->id : "call_x", "type",
                             "function", "function", "name", g->name, "arguments", g->arguments),
                   NULL);
        send_chunk(fd, json_object(), "tool_calls");
    } else if (g && g->name) {
        send_chunk(fd,
                   json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", 0, "id",
                             g->id ? g->id : "call_x", "type", "function", "function", "name", "",
                             "arguments", ""),
                   NULL);
        for (const char *p = g->name; *p; p++)
            send_chunk(fd,
                       json_pack("{s:[{s:i, s:{s:s#}}]}", "tool_calls", "index", 0, "function",
                                 "name", p, (int)1),
                       NULL);
        for (const char *p = g->arguments; *p; p++)
            send_chunk(fd,
                       json_pack("{s:[{s:i, s:{s:s#}}]}", "tool_calls", "index", 0, "function",
                                 "arguments", p, (int)1),
                       NULL);
        send_chunk(fd, json_object(), "tool_calls");
    } else {
        const char *text = g ? g->content : "no script";
        for (const char *p = text; *p; p++)
            send_chunk(fd, json_pack("{s:s#}", "content", p, (int)1), NULL);
        send_chunk(fd, json_object(), "stop");
    }
    static const char usage[] =
        "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"fake\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,"
        "\"completion_tokens\":4,\"total_tokens\":7}}\n\n";
    char hex[32];
    int hn = snprintf(hex, sizeof hex, "%zx\r\n", sizeof usage - 1);
    fs_send_all(fd, hex, (size_t)hn);
    fs_send_all(fd, usage, sizeof usage - 1);
    fs_send_all(fd, "\r\n", 2);
    static const char done[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    fs_send_all(fd, done, sizeof done - 1);
}

static void engine_answer(fs_server *s, int fd, const char *req, const char *body)
{
    (void)s;
    (void)req;
    json_t *j = json_loads(body, 0, NULL);
    json_t *msgs = json_object_get(j, "messages");
    int k = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++)
        k += !strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")) ?: "",
                     "tool");
    bool stream = json_is_true(json_object_get(j, "stream"));
    pthread_mutex_lock(&g_eng_mu);
    json_array_append(g_eng_requests, j ? j : json_null());
    pthread_mutex_unlock(&g_eng_mu);
    const gen_script *g = k < g_script_len ? &g_script[k] : NULL;
    json_decref(j);
    if (stream) {
        stream_answer(fd, g);
        return;
    }
    json_t *msg = g && g->name
                      ? json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role", "assistant",
                                  "content", "tool_calls", "id", g->id ? g->id : "call_x",
                                  "type", "function", "function", "name", g->name, "arguments",
                                  g->arguments)
                      : json_pack("{s:s, s:s}", "role", "assistant", "content",
                                  g ? g->content : "no script");
    json_t *resp = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:o, s:s}], s:{s:i, s:i, s:i}}", "id",
                             "chatcmpl-fake", "object", "chat.completion", "created", 1, "model",
                             "fake", "choices", "index", 0, "message", msg, "finish_reason",
                             g && g->name ? "tool_calls" : "stop", "usage", "prompt_tokens", 3,
                             "completion_tokens", 4, "total_tokens", 7);
    char *out = json_dumps(resp, JSON_COMPACT);
    json_decref(resp);
    assert_non_null(out);
    fs_send_reply(fd, 200, "application/json", out, strlen(out));
    free(out);
}

static fs_server g_engine, g_tool;

/* ---- fixtures ---------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_model, sizeof g_model, "router-agent-edges.gguf", 29))
        return -1;
    g_eng_requests = json_array();
    fs_start(&g_tool, "edges-tool.sock", (size_t)4 << 20, true, tool_answer);
    fs_start(&g_engine, "edges-engine.sock", (size_t)4 << 20, true, engine_answer);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    fs_stop(&g_engine);
    fs_stop(&g_tool);
    json_decref(g_eng_requests);
    remove(g_model);
    return 0;
}

/* A router with the scripted engine and the tool lookup (not idempotent:
 * a second call would be a second effect). */
static void start_router(rh_router *r, const char *name, long ctx_limit)
{
    char rest[2048];
    snprintf(rest, sizeof rest,
             "[worker eng]\nkind = openai\nurl = unix:%s\nctx-limit = %ld\n"
             "[tool lookup]\ndescription = Looks up a word\nurl = unix:%s\n"
             "parameters = {\"type\":\"object\",\"properties\":{\"word\":{\"type\":\"string\","
             "\"maxLength\":8}},\"required\":[\"word\"]}\nidempotent = false\n"
             "timeout-ms = 10000\n",
             g_engine.path, ctx_limit, g_tool.path);
    assert_int_equal(rh_start(r, name, g_model, "max-tool-steps = 4\n", rest), 0);
    double t0 = tu_now_s();
    for (;;) {
        json_t *w = rh_worker_health(r, "eng");
        bool ready = !strcmp(json_string_value(json_object_get(w, "state")) ?: "", "ready");
        json_decref(w);
        if (ready)
            break;
        if (tu_now_s() - t0 > 30)
            fail_msg("the engine never became ready");
        usleep(50 * 1000);
    }
}

static void script(const gen_script *s, int n)
{
    g_script = s;
    g_script_len = n;
    pthread_mutex_lock(&g_eng_mu);
    json_array_clear(g_eng_requests);
    pthread_mutex_unlock(&g_eng_mu);
}

/* POSTs an agent run; the answer as JSON (status 200 asserted). */
static json_t *run_agent(const rh_router *r, bool stream)
{
    wc_response w;
    const char *body = stream ? "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                "\"tool_execution\":\"server\",\"stream\":true}"
                              : "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                "\"tool_execution\":\"server\"}";
    assert_int_equal(rh_req(r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    if (w.status != 200)
        fail_msg("agent run: %d %s", w.status, w.body ? w.body : "");
    json_t *j = stream ? json_pack("{s:s}", "text", w.body ? w.body : "") : rh_body_json(&w);
    wc_response_free(&w);
    assert_non_null(j);
    return j;
}

static json_t *steps_of(json_t *answer)
{
    return json_object_get(json_object_get(answer, "spillway"), "tool_steps");
}

/* The tool messages of engine request i: count, and the content and the
 * tool_call_id of the first. */
static int tool_msgs(int i, const char **content, const char **call_id)
{
    json_t *req = json_array_get(g_eng_requests, (size_t)i);
    json_t *msgs = json_object_get(req, "messages");
    int n = 0;
    for (size_t k = 0; k < json_array_size(msgs); k++) {
        json_t *m = json_array_get(msgs, k);
        if (strcmp(json_string_value(json_object_get(m, "role")) ?: "", "tool"))
            continue;
        if (n++ == 0) {
            *content = json_string_value(json_object_get(m, "content"));
            *call_id = json_string_value(json_object_get(m, "tool_call_id"));
        }
    }
    return n;
}

/* ---- duplicate keys ---------------------------------------------------- */

static const gen_script g_dup[] = {
    /* the last "word" passes maxLength 8; the first does not */
    {"lookup", "{\"word\":\"waytoolongword\",\"word\":\"ok\"}", NULL, NULL},
    {NULL, NULL, NULL, "final"},
};

static void test_duplicate_keys_not_called(void **state)
{
    (void)state;
    rh_router r;
    start_router(&r, "edges-dup", 1024);
    tool_reset(0);
    script(g_dup, 2);
    json_t *j = run_agent(&r, false);
    /* never called: the tool would have seen both values */
    assert_int_equal(tool_calls(), 0);
    json_t *st = steps_of(j);
    assert_int_equal(json_array_size(st), 1);
    const char *res = json_string_value(json_object_get(json_array_get(st, 0), "result"));
    assert_non_null(res);
    assert_true(!strncmp(res, "error:", 6));
    assert_non_null(strstr(res, "duplicate"));
    json_decref(j);
    rh_finish(&r);
}

/* ---- a call id cut inside a UTF-8 sequence ----------------------------- */

/* 62 ASCII bytes, then a 2-byte character at bytes 63-64: a 63-byte cut
 * falls inside it */
#define ID62 "call_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
static const gen_script g_long_id[] = {
    {"lookup", "{\"word\":\"ok\"}", ID62 "\xc3\xa9" "bc", NULL},
    {NULL, NULL, NULL, "final"},
};

static void test_long_call_id(void **state)
{
    (void)state;
    assert_int_equal(strlen(ID62), 62);
    rh_router r;
    start_router(&r, "edges-id", 1024);
    tool_reset(0);
    script(g_long_id, 2);
    json_t *j = run_agent(&r, false);
    assert_int_equal(tool_calls(), 1);
    /* the step is in the answer, and the model saw the call's result */
    json_t *st = steps_of(j);
    assert_int_equal(json_array_size(st), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(st, 0), "result")),
                        "RESULT-1");
    pthread_mutex_lock(&g_eng_mu);
    assert_int_equal(json_array_size(g_eng_requests), 2);
    const char *content = NULL, *call_id = NULL;
    assert_int_equal(tool_msgs(1, &content, &call_id), 1);
    assert_string_equal(content, "RESULT-1");
    /* the assistant message before it holds the call with the same id */
    json_t *msgs = json_object_get(json_array_get(g_eng_requests, 1), "messages");
    json_t *asst = NULL;
    for (size_t k = 0; k < json_array_size(msgs); k++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, k), "role")) ?: "",
                    "assistant"))
            asst = json_array_get(msgs, k);
    json_t *call = json_array_get(json_object_get(asst, "tool_calls"), 0);
    assert_non_null(call);
    assert_string_equal(json_string_value(json_object_get(call, "id")), call_id);
    /* cut before the character, not inside it */
    assert_true(!strncmp(call_id, ID62, strlen(call_id)));
    pthread_mutex_unlock(&g_eng_mu);
    json_decref(j);
    rh_finish(&r);
}

/* ---- a tool answer over the cap ---------------------------------------- */

static const gen_script g_one_call[] = {
    {"lookup", "{\"word\":\"ok\"}", NULL, NULL},
    {NULL, NULL, NULL, "final"},
};

static void test_big_tool_answer(void **state)
{
    (void)state;
    rh_router r;
    /* room for the cut answer in the next generation's prompt */
    start_router(&r, "edges-big", 1L << 22);
    tool_reset(RESULT_CAP * 4);
    script(g_one_call, 2);
    /* the tool answered (200): a known outcome, not unsafe_to_retry */
    json_t *j = run_agent(&r, false);
    assert_int_equal(tool_calls(), 1);
    json_t *st = steps_of(j);
    assert_int_equal(json_array_size(st), 1);
    const char *res = json_string_value(json_object_get(json_array_get(st, 0), "result"));
    assert_non_null(res);
    assert_int_equal(strlen(res), RESULT_CAP);
    assert_int_equal(strspn(res, "x"), RESULT_CAP);
    pthread_mutex_lock(&g_eng_mu);
    const char *content = NULL, *call_id = NULL;
    assert_int_equal(tool_msgs(1, &content, &call_id), 1);
    assert_int_equal(strlen(content), RESULT_CAP);
    pthread_mutex_unlock(&g_eng_mu);
    json_decref(j);
    rh_finish(&r);
}

/* ---- a tool that answers a byte at a time, past the deadline ---------- */

static void dripping_tool_run(bool head_too)
{
    rh_router r;
    start_router(&r, head_too ? "edges-driphead" : "edges-drip", 1024);
    tool_reset(0);
    /* 25 bytes x 240 ms: 6 s of answer (with its ~90-byte head dripped
     * too: 28 s), each read well within the tool's timeout-ms (10 s); the
     * run's deadline is 1.5 s */
    atomic_store(&g_tool_drip_ms, 240);
    atomic_store(&g_tool_drip_head, head_too);
    script(g_one_call, 2);
    double t0 = tu_now_s();
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", "X-Spillway-Deadline-Ms: 1500\r\n",
                            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                            "\"tool_execution\":\"server\"}",
                            &w),
                     0);
    char code[64];
    if (w.status != 504)
        fail_msg("a tool dripping its answer past the deadline: %d %s", w.status,
                 w.body ? w.body : "");
    /* the deadline (1.5 s) is what ended it, not the drip (6 s, 28 s):
     * a bound on the deadline's honesty, with a wide margin */
    if (tu_now_s() - t0 > 5.0)
        fail_msg("the run ended %.1f s after it began, its deadline was 1.5 s", tu_now_s() - t0);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "deadline_exceeded");
    /* it ended while the call waited (the outcome unknown), not after the
     * whole answer came in, 6 s later, before the next generation */
    json_t *ej = rh_body_json(&w);
    const char *msg =
        json_string_value(json_object_get(json_object_get(ej, "error"), "message"));
    assert_non_null(msg);
    if (!strstr(msg, "before tool step 1 (lookup) answered"))
        fail_msg("the run did not end while the tool call waited: %s", msg);
    json_decref(ej);
    wc_response_free(&w);
    assert_int_equal(tool_calls(), 1);
    /* the final generation never ran */
    pthread_mutex_lock(&g_eng_mu);
    assert_int_equal(json_array_size(g_eng_requests), 1);
    pthread_mutex_unlock(&g_eng_mu);
    rh_finish(&r);
}

static void test_deadline_bounds_a_dripping_tool(void **state)
{
    (void)state;
    dripping_tool_run(false);
}

/* the same with the response head a byte at a time: the head's reads are
 * bounded by the run's deadline too, not only by the per-read time-out */
static void test_deadline_bounds_a_dripping_head(void **state)
{
    (void)state;
    dripping_tool_run(true);
}

/* ---- text, then a call, in one streamed generation --------------------- */

static const gen_script g_text_then_call[] = {
    {"lookup", "{\"word\":\"ok\"}", "call_t", "Let me look"},
    {NULL, NULL, NULL, "done"},
};

static void test_stream_text_then_call(void **state)
{
    (void)state;
    rh_router r;
    start_router(&r, "edges-text-call", 1024);
    tool_reset(0);
    script(g_text_then_call, 2);
    json_t *j = run_agent(&r, true);
    assert_int_equal(tool_calls(), 1);
    /* the client sees text and one finish, never a tool-call delta (the
     * run's calls are in spillway.tool_steps) */
    const char *sse = json_string_value(json_object_get(j, "text"));
    int n_finish = 0;
    char text[256] = "";
    for (const char *p = sse; (p = strstr(p, "data: ")); p += 6) {
        if (!strncmp(p + 6, "[DONE]", 6))
            continue;
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        json_t *c = json_loadb(p + 6, (size_t)(e - p - 6), 0, NULL);
        assert_non_null(c);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (json_object_get(json_object_get(ch, "delta"), "tool_calls"))
            fail_msg("a tool-call delta reached the client: %.*s", (int)(e - p - 6), p + 6);
        n_finish += json_is_string(json_object_get(ch, "finish_reason"));
        json_t *t = json_object_get(json_object_get(ch, "delta"), "content");
        if (json_is_string(t) && strlen(text) + json_string_length(t) < sizeof text)
            strcat(text, json_string_value(t));
        json_decref(c);
    }
    assert_int_equal(n_finish, 1);
    /* what went out as it came: the first generation's text too (no
     * hold-back on that engine), then the answer */
    assert_string_equal(text, "Let me look.done");
    json_decref(j);
    rh_finish(&r);
}

/* ---- a streamed reply in many pieces ----------------------------------- */

static char g_long_word_args[64];
static char g_long_text[6001];
static gen_script g_pieces[2];

static void test_stream_in_pieces(void **state)
{
    (void)state;
    snprintf(g_long_word_args, sizeof g_long_word_args, "{\"word\":\"okay\"}");
    for (size_t i = 0; i < sizeof g_long_text - 1; i++)
        g_long_text[i] = (char)('a' + i % 26);
    g_long_text[sizeof g_long_text - 1] = 0;
    g_pieces[0] = (gen_script){"lookup", g_long_word_args, "call_p", NULL};
    g_pieces[1] = (gen_script){NULL, NULL, NULL, g_long_text};
    rh_router r;
    start_router(&r, "edges-pieces", 1024);
    tool_reset(0);
    script(g_pieces, 2);
    json_t *j = run_agent(&r, true);
    /* the call, put together from one-byte fragments, was made whole */
    assert_int_equal(tool_calls(), 1);
    assert_string_equal(g_tool_body, g_long_word_args);
    /* the answer's text, from the content deltas of the stream */
    const char *sse = json_string_value(json_object_get(j, "text"));
    size_t cap = strlen(g_long_text) + 1, n = 0;
    char *text = sw_malloc(cap);
    assert_non_null(text);
    bool finished = false, done = false;
    for (const char *p = sse; (p = strstr(p, "data: ")); p += 6) {
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        if (!strncmp(p + 6, "[DONE]", 6)) {
            done = true;
            continue;
        }
        json_t *c = json_loadb(p + 6, (size_t)(e - p - 6), 0, NULL);
        assert_non_null(c);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        json_t *t = json_object_get(json_object_get(ch, "delta"), "content");
        if (json_is_string(t) && json_string_length(t)) {
            assert_true(n + json_string_length(t) < cap);
            memcpy(text + n, json_string_value(t), json_string_length(t));
            n += json_string_length(t);
        }
        if (json_is_string(json_object_get(ch, "finish_reason"))) {
            finished = true;
            json_t *st = json_object_get(json_object_get(c, "spillway"), "tool_steps");
            assert_int_equal(json_array_size(st), 1);
            assert_string_equal(
                json_string_value(json_object_get(json_array_get(st, 0), "result")), "RESULT-1");
        }
        json_decref(c);
    }
    text[n] = 0;
    assert_true(finished && done);
    assert_string_equal(text, g_long_text);
    sw_free(text);
    json_decref(j);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duplicate_keys_not_called),
        cmocka_unit_test(test_long_call_id),
        cmocka_unit_test(test_big_tool_answer),
        cmocka_unit_test(test_deadline_bounds_a_dripping_tool),
        cmocka_unit_test(test_deadline_bounds_a_dripping_head),
        cmocka_unit_test(test_stream_in_pieces),
        cmocka_unit_test(test_stream_text_then_call),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
