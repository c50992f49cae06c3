/* test_cors.c - a browser page on another origin calling spillway: the
 * CORS preflight (OPTIONS, answered before any key is asked for) and the
 * Access-Control-Allow-Origin of every answer, on a real worker and a real
 * router over their sockets. Allowed origins: any by default ("*"), or a
 * configured list (the origin is echoed, with Vary: Origin); an origin
 * outside the list gets no CORS header, so the browser keeps the answer
 * from the page. */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <stdio.h>
#include <string.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "cors.gguf", 11);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}

/* method path on sock with extra header lines and a body (or NULL). */
static void raw_request(const char *sock, const char *method, const char *path,
                        const char *headers, const char *body, wc_response *w)
{
    char raw[2048];
    int n = snprintf(raw, sizeof raw,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu\r\n"
                     "\r\n%s",
                     method, path, headers, body ? strlen(body) : (size_t)0, body ? body : "");
    assert_true(n > 0 && (size_t)n < sizeof raw);
    assert_int_equal(wc_raw(sock, raw, (size_t)n, 30000, w), 0);
}

static bool has_header(const wc_response *w, const char *name)
{
    char v[512];
    return wc_header(w, name, v, sizeof v);
}

static void assert_header(const wc_response *w, const char *name, const char *want)
{
    char v[512];
    if (!wc_header(w, name, v, sizeof v))
        fail_msg("no %s header in:\n%s", name, w->headers);
    if (strcmp(v, want))
        fail_msg("%s: '%s', expected '%s'", name, v, want);
}

/* A preflight from origin for a POST with the headers a chat page sends. */
static void preflight(const char *sock, const char *origin, wc_response *w)
{
    char h[512];
    snprintf(h, sizeof h,
             "Origin: %s\r\nAccess-Control-Request-Method: POST\r\n"
             "Access-Control-Request-Headers: authorization, content-type\r\n",
             origin);
    raw_request(sock, "OPTIONS", "/v1/chat/completions", h, NULL, w);
}

static const char *chat_body =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3}";

static void test_worker_any_origin(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--max-seqs", "2", "--ctx-limit", "256", NULL};
    wc_worker wk;
    assert_int_equal(wc_worker_start(&wk, g_model, args, NULL, 60, NULL), 0);
    wc_response w;
    preflight(wk.socket_path, "http://page.example:3000", &w);
    assert_int_equal(w.status, 204);
    assert_header(&w, "Access-Control-Allow-Origin", "*");
    assert_header(&w, "Access-Control-Allow-Headers", "authorization, content-type");
    assert_header(&w, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    assert_true(has_header(&w, "Access-Control-Max-Age"));
    wc_response_free(&w);
    /* the request itself, streamed and not: the page may read the answer */
    raw_request(wk.socket_path, "POST", "/v1/chat/completions",
                "Origin: http://page.example:3000\r\nContent-Type: application/json\r\n", chat_body,
                &w);
    assert_int_equal(w.status, 200);
    assert_header(&w, "Access-Control-Allow-Origin", "*");
    assert_true(has_header(&w, "Access-Control-Expose-Headers"));
    wc_response_free(&w);
    raw_request(wk.socket_path, "POST", "/v1/chat/completions",
                "Origin: http://page.example:3000\r\n",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
                "\"stream\":true}",
                &w);
    assert_int_equal(w.status, 200);
    assert_true(strstr(w.body, "data: [DONE]") != NULL);
    assert_header(&w, "Access-Control-Allow-Origin", "*");
    wc_response_free(&w);
    /* errors too (the page reads the typed error) */
    raw_request(wk.socket_path, "POST", "/v1/chat/completions", "Origin: http://p.example\r\n",
                "{\"messages\":[]}", &w);
    assert_int_equal(w.status, 400);
    assert_header(&w, "Access-Control-Allow-Origin", "*");
    wc_response_free(&w);
    /* without an Origin (not a browser) nothing changes */
    raw_request(wk.socket_path, "GET", "/v1/models", "", NULL, &w);
    assert_int_equal(w.status, 200);
    assert_false(has_header(&w, "Access-Control-Allow-Origin"));
    wc_response_free(&w);
    assert_int_equal(wc_worker_stop(&wk), 0);
}

static void test_worker_listed_origins(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--ctx-limit", "256", "--cors-origins",
                          "https://app.example, http://localhost:5173", NULL};
    wc_worker wk;
    assert_int_equal(wc_worker_start(&wk, g_model, args, NULL, 60, NULL), 0);
    wc_response w;
    preflight(wk.socket_path, "http://localhost:5173", &w);
    assert_int_equal(w.status, 204);
    assert_header(&w, "Access-Control-Allow-Origin", "http://localhost:5173");
    assert_header(&w, "Vary", "Origin");
    wc_response_free(&w);
    preflight(wk.socket_path, "https://evil.example", &w);
    assert_int_equal(w.status, 204);
    assert_false(has_header(&w, "Access-Control-Allow-Origin"));
    assert_false(has_header(&w, "Access-Control-Allow-Methods"));
    wc_response_free(&w);
    raw_request(wk.socket_path, "GET", "/v1/models", "Origin: https://evil.example\r\n", NULL, &w);
    assert_int_equal(w.status, 200); /* served: only the browser withholds it */
    assert_false(has_header(&w, "Access-Control-Allow-Origin"));
    wc_response_free(&w);
    raw_request(wk.socket_path, "GET", "/v1/models", "Origin: https://app.example\r\n", NULL, &w);
    assert_header(&w, "Access-Control-Allow-Origin", "https://app.example");
    wc_response_free(&w);
    assert_int_equal(wc_worker_stop(&wk), 0);

    /* a list that is not origins is refused at start */
    const char *bad[] = {"--cors-origins", "https://*.example", NULL};
    int st = 0;
    assert_int_equal(wc_worker_start(&wk, g_model, bad, NULL, 20, &st), -1);
    assert_int_equal(st, 2);
}

static void test_router(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "cors", g_model,
                              "api-keys = cors-key-0123456789\n"
                              "cors-origins = https://app.example\n",
                              "[worker cpu]\nthreads = 1\nctx-limit = 256\n"),
                     0);
    const char *auth = "Authorization: Bearer cors-key-0123456789\r\n";
    wc_response w;
    /* the preflight carries no key and is answered */
    preflight(r.sock, "https://app.example", &w);
    assert_int_equal(w.status, 204);
    assert_header(&w, "Access-Control-Allow-Origin", "https://app.example");
    assert_header(&w, "Vary", "Origin");
    assert_header(&w, "Access-Control-Allow-Headers", "authorization, content-type");
    wc_response_free(&w);
    preflight(r.sock, "https://other.example", &w);
    assert_int_equal(w.status, 204);
    assert_false(has_header(&w, "Access-Control-Allow-Origin"));
    wc_response_free(&w);
    /* the request: with the key, and without it (a 401 the page can read) */
    char h[512];
    snprintf(h, sizeof h, "%sOrigin: https://app.example\r\n", auth);
    raw_request(r.sock, "POST", "/v1/chat/completions", h, chat_body, &w);
    assert_int_equal(w.status, 200);
    assert_header(&w, "Access-Control-Allow-Origin", "https://app.example");
    assert_true(strstr(w.headers, "X-Request-Id") != NULL);
    wc_response_free(&w);
    raw_request(r.sock, "POST", "/v1/chat/completions",
                h, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
                   "\"stream\":true}",
                &w);
    assert_int_equal(w.status, 200);
    assert_header(&w, "Access-Control-Allow-Origin", "https://app.example");
    wc_response_free(&w);
    raw_request(r.sock, "POST", "/v1/chat/completions", "Origin: https://app.example\r\n",
                chat_body, &w);
    assert_int_equal(w.status, 401);
    assert_header(&w, "Access-Control-Allow-Origin", "https://app.example");
    wc_response_free(&w);
    /* another origin: served to a client that is not a browser, no header */
    snprintf(h, sizeof h, "%sOrigin: https://other.example\r\n", auth);
    raw_request(r.sock, "GET", "/v1/models", h, NULL, &w);
    assert_int_equal(w.status, 200);
    assert_false(has_header(&w, "Access-Control-Allow-Origin"));
    wc_response_free(&w);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_any_origin),
        cmocka_unit_test(test_worker_listed_origins),
        cmocka_unit_test(test_router),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
