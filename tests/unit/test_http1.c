/* test_http1.c - HTTP/1.1 framing (src/api/http1.c): the value and line
 * rules, the response head, and the incremental body decoder, which must
 * give the same body however the bytes are cut. */
#include "testutil.h"

#include "api/http1.h"
#include "common/alloc.h"

#include <stdio.h>
#include <string.h>

static void test_values(void **state)
{
    (void)state;
    int64_t n;
    assert_true(api_http_content_length("42", 2, &n) && n == 42);
    assert_true(api_http_content_length("0 \t", 3, &n) && n == 0);
    assert_false(api_http_content_length("", 0, &n));
    assert_false(api_http_content_length("+1", 2, &n));
    assert_false(api_http_content_length("1 2", 3, &n));
    assert_false(api_http_content_length("0x10", 4, &n));
    assert_false(api_http_content_length("1234567890123456789", 19, &n)); /* past 18 digits */

    assert_true(api_http_has_token("keep-alive, Close", 17, "close"));
    assert_true(api_http_has_token(" close ", 7, "close"));
    assert_false(api_http_has_token("closed", 6, "close"));
    assert_false(api_http_has_token("", 0, "close"));
    assert_true(api_http_has_token("gzip, chunked", 13, "chunked"));

    int st, minor;
    assert_true(api_http_status_line("HTTP/1.1 200 OK", 15, &st, &minor) && st == 200 && minor == 1);
    assert_true(api_http_status_line("HTTP/1.0 503", 12, &st, &minor) && st == 503 && minor == 0);
    assert_false(api_http_status_line("HTTP/1.1 20 OK", 14, &st, &minor));
    assert_false(api_http_status_line("HTTP/2 200 OK", 13, &st, &minor));
    assert_false(api_http_status_line("HTTP/1.1 600 X", 14, &st, &minor));
    assert_false(api_http_status_line("HTTP/1.1 2000", 13, &st, &minor));

    assert_true(api_http_chunk_size("1a", 2, &n) && n == 26);
    assert_true(api_http_chunk_size("10;name=v", 9, &n) && n == 16);
    assert_true(api_http_chunk_size("0 ", 2, &n) && n == 0);
    assert_false(api_http_chunk_size("", 0, &n));
    assert_false(api_http_chunk_size("g", 1, &n));
    assert_false(api_http_chunk_size("1 2", 3, &n));
    assert_false(api_http_chunk_size("1000000000000000", 16, &n));

    const char *fields = "Content-Type:  text/plain \r\nbroken line\r\nX-A:b\r\n";
    const char *v;
    size_t vn;
    assert_true(api_http_find_field(fields, fields + strlen(fields), "content-type", &v, &vn));
    assert_int_equal(vn, 10);
    assert_memory_equal(v, "text/plain", 10);
    assert_true(api_http_find_field(fields, fields + strlen(fields), "x-a", &v, &vn) && vn == 1);
    assert_false(api_http_find_field(fields, fields + strlen(fields), "broken line", &v, &vn));
}

/* Decodes raw cut into pieces of `step` bytes: what a client that reads
 * a little at a time sees. Returns the body (sw_free) or NULL. */
static char *decode_in_steps(const char *raw, size_t len, size_t step, size_t *body_len,
                             api_http_response *r)
{
    size_t have = 0, at = 0, got = 0;
    char *body = sw_malloc(len + 1);
    api_http_body b;
    bool head = false;
    while (have < len || at < have) {
        if (have < len)
            have = have + step < len ? have + step : len;
        if (!head) {
            int h = api_http_response_head(raw, have, 65536, r);
            if (h < 0) {
                sw_free(body);
                return NULL;
            }
            if (h == 0)
                continue;
            head = true;
            at = r->head_len;
            api_http_body_init(&b, r);
        }
        long k;
        const char *d;
        size_t dn;
        while (!b.done && (k = api_http_body_next(&b, raw + at, have - at, &d, &dn)) > 0) {
            memcpy(body + got, d, dn);
            got += dn;
            at += (size_t)k;
        }
        if (!b.done && k < 0) {
            sw_free(body);
            return NULL;
        }
        if (b.done || (have == len && k == 0))
            break;
    }
    if (!head || !b.done) {
        sw_free(body);
        return NULL;
    }
    body[got] = 0;
    *body_len = got;
    return body;
}

static void test_responses(void **state)
{
    (void)state;
    static const struct {
        const char *raw;
        int status;
        const char *body; /* NULL: malformed or never whole */
        bool close;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200, "hello", false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n",
         200, "hello!", false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
         200, "abc", false},
        {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n"
         "Connection: close\r\n\r\nok", 201, "ok", true},
        {"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 200, "x", true},
        {"HTTP/1.1 204 No Content\r\n\r\n", 204, "", false},
        {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, "", false},
        /* malformed: two lengths, a bad chunk size, no CRLF after data */
        {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy", 200, NULL, false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 200, NULL, false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXX0\r\n\r\n", 200, NULL, false},
        {"HTTP/1.1 101 Switching\r\n\r\n", 101, NULL, false},
        {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 200, NULL, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = strlen(cases[i].raw);
        for (size_t step = 1; step <= len; step = step < 8 ? step + 1 : step * 2) {
            api_http_response r;
            size_t bl = 0;
            char *body = decode_in_steps(cases[i].raw, len, step, &bl, &r);
            if (!cases[i].body) {
                if (body)
                    fail_msg("case %zu, step %zu: decoded a malformed response", i, step);
                continue;
            }
            if (!body)
                fail_msg("case %zu, step %zu: not decoded", i, step);
            assert_int_equal(r.status, cases[i].status);
            assert_int_equal(r.close, cases[i].close);
            assert_int_equal(bl, strlen(cases[i].body));
            assert_memory_equal(body, cases[i].body, bl);
            sw_free(body);
        }
        /* the whole-buffer form agrees */
        api_http_response r;
        char *body;
        size_t bl, used;
        int rc = api_http_decode(cases[i].raw, len, true, &r, &body, &bl, &used);
        assert_int_equal(rc, cases[i].body ? 1 : -1);
        if (rc == 1) {
            assert_string_equal(body, cases[i].body);
            assert_int_equal(used, len);
            sw_free(body);
        }
    }
}

static void test_kept_alive(void **state)
{
    (void)state;
    /* two responses back to back: the first ends where its framing says */
    const char raw[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabHTTP/1.1 404 Not Found\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n";
    api_http_response r;
    char *body;
    size_t bl, used;
    assert_int_equal(api_http_decode(raw, sizeof raw - 1, false, &r, &body, &bl, &used), 1);
    assert_string_equal(body, "ab");
    sw_free(body);
    assert_int_equal(api_http_decode(raw + used, sizeof raw - 1 - used, false, &r, &body, &bl,
                                     &used), 1);
    assert_int_equal(r.status, 404);
    assert_string_equal(body, "z");
    sw_free(body);
    /* a body framed by the close is whole only at the end of the input */
    const char eof[] = "HTTP/1.1 200 OK\r\n\r\nall of it";
    assert_int_equal(api_http_decode(eof, sizeof eof - 1, false, &r, &body, &bl, &used), 0);
    assert_int_equal(api_http_decode(eof, sizeof eof - 1, true, &r, &body, &bl, &used), 1);
    assert_true(r.close);
    assert_string_equal(body, "all of it");
    sw_free(body);
    /* a head that never ends is refused once past the limit */
    char big[70000];
    memcpy(big, "HTTP/1.1 200 OK\r\n", 17);
    memset(big + 17, 'x', sizeof big - 17);
    assert_int_equal(api_http_response_head(big, sizeof big, 65536, &r), -1);
    assert_int_equal(api_http_response_head(big, 1000, 65536, &r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_kept_alive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
