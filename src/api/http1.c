/* http1.c - HTTP/1.1 framing (http1.h). */
#include "api/http1.h"

#include "common/alloc.h"

#include <string.h>
#include <strings.h>

static bool ows(char c)
{
    return c == ' ' || c == '\t';
}

bool api_http_content_length(const char *v, size_t n, int64_t *out)
{
    size_t digits = 0;
    int64_t x = 0;
    while (digits < n && v[digits] >= '0' && v[digits] <= '9') {
        if (digits == 18)
            return false;
        x = x * 10 + (v[digits] - '0');
        digits++;
    }
    size_t at = digits;
    while (at < n && ows(v[at]))
        at++;
    if (digits == 0 || at != n)
        return false;
    *out = x;
    return true;
}

bool api_http_has_token(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i < n;) {
        while (i < n && (ows(v[i]) || v[i] == ','))
            i++;
        size_t j = i;
        while (j < n && v[j] != ',')
            j++;
        size_t m = j;
        while (m > i && ows(v[m - 1]))
            m--;
        if (m - i == tl && strncasecmp(v + i, tok, tl) == 0)
            return true;
        i = j;
    }
    return false;
}

bool api_http_status_line(const char *line, size_t n, int *status, int *minor)
{
    if (n < 12 || memcmp(line, "HTTP/1.", 7) || (line[7] != '0' && line[7] != '1') ||
        line[8] != ' ' || line[9] < '1' || line[9] > '5' || line[10] < '0' || line[10] > '9' ||
        line[11] < '0' || line[11] > '9' || (n > 12 && line[12] != ' '))
        return false;
    *status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    *minor = line[7] - '0';
    return true;
}

bool api_http_chunk_size(const char *line, size_t n, int64_t *size)
{
    size_t digits = 0;
    int64_t x = 0;
    for (; digits < n; digits++) {
        char c = line[digits];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            break;
        if (digits < 15) /* past 15 digits the line is refused below */
            x = x * 16 + d;
    }
    size_t at = digits;
    while (at < n && ows(line[at]))
        at++;
    if (digits == 0 || digits > 15 || (at < n && line[at] != ';'))
        return false;
    *size = x;
    return true;
}

bool api_http_next_field(const char **p, const char *end, api_http_field *f)
{
    while (*p < end) {
        const char *line = *p;
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *eol = nl ? nl : end;
        *p = nl ? nl + 1 : end;
        if (eol > line && eol[-1] == '\r')
            eol--;
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        if (!colon)
            continue;
        const char *v = colon + 1, *ve = eol;
        while (v < ve && ows(*v))
            v++;
        while (ve > v && ows(ve[-1]))
            ve--;
        f->name = line;
        f->name_len = (size_t)(colon - line);
        f->value = v;
        f->value_len = (size_t)(ve - v);
        return true;
    }
    return false;
}

bool api_http_find_field(const char *fields, const char *end, const char *name,
                         const char **value, size_t *value_len)
{
    size_t nl = strlen(name);
    api_http_field f;
    for (const char *p = fields; api_http_next_field(&p, end, &f);)
        if (f.name_len == nl && strncasecmp(f.name, name, nl) == 0) {
            *value = f.value;
            *value_len = f.value_len;
            return true;
        }
    return false;
}

int api_http_response_head(const char *buf, size_t len, size_t max_head, api_http_response *r)
{
    size_t at = 0;
    memset(r, 0, sizeof *r);
    for (;;) { /* interim 1xx heads first */
        const char *end = memmem(buf + at, len - at, "\r\n\r\n", 4);
        if (!end)
            return len > max_head ? -1 : 0;
        size_t head_end = (size_t)(end - buf) + 4;
        if (head_end > max_head)
            return -1;
        const char *line = buf + at;
        const char *eol = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        if (!api_http_status_line(line, (size_t)(eol - line), &r->status, &r->minor) ||
            r->status == 101)
            return -1; /* no upgrade is ever asked for */
        r->final_at = at;
        at = head_end;
        if (r->status >= 200) {
            r->fields = eol + 2;
            r->fields_len = (size_t)(end + 2 - r->fields);
            r->head_len = head_end;
            break;
        }
    }
    const char *fend = r->fields + r->fields_len;
    api_http_field f;
    r->close = r->minor == 0;
    for (const char *p = r->fields; api_http_next_field(&p, fend, &f);) {
        if (f.name_len == 17 && !strncasecmp(f.name, "Transfer-Encoding", 17)) {
            r->chunked = api_http_has_token(f.value, f.value_len, "chunked");
        } else if (f.name_len == 14 && !strncasecmp(f.name, "Content-Length", 14)) {
            int64_t n;
            if (!api_http_content_length(f.value, f.value_len, &n) ||
                (r->has_length && n != r->length))
                return -1; /* not a length, or two that differ */
            r->has_length = true;
            r->length = n;
        } else if (f.name_len == 10 && !strncasecmp(f.name, "Connection", 10)) {
            if (api_http_has_token(f.value, f.value_len, "close"))
                r->close = true;
        }
    }
    if (r->chunked)
        r->has_length = false; /* RFC 9112 6.3: chunked wins */
    bool bodyless = r->status == 204 || r->status == 304;
    if (bodyless) {
        r->chunked = false;
        r->has_length = true;
        r->length = 0;
    }
    if (!r->chunked && !r->has_length)
        r->close = true;
    return 1;
}

enum { B_DATA, B_SIZE, B_CRLF, B_TRAILER };

void api_http_body_init(api_http_body *b, const api_http_response *r)
{
    memset(b, 0, sizeof *b);
    b->chunked = r->chunked;
    b->has_length = r->has_length;
    b->remaining = r->has_length ? r->length : 0;
    b->state = r->chunked ? B_SIZE : B_DATA;
    b->done = r->has_length && r->length == 0;
}

long api_http_body_next(api_http_body *b, const char *in, size_t n, const char **data,
                        size_t *data_len)
{
    *data = in;
    *data_len = 0;
    if (b->done || n == 0)
        return 0;
    if (b->state == B_DATA) {
        size_t take = n;
        if ((b->chunked || b->has_length) && (int64_t)take > b->remaining)
            take = (size_t)b->remaining;
        *data_len = take;
        if (b->chunked || b->has_length) {
            b->remaining -= (int64_t)take;
            if (b->remaining == 0) {
                if (b->chunked)
                    b->state = B_CRLF;
                else
                    b->done = true;
            }
        }
        return (long)take;
    }
    if (b->state == B_CRLF) {
        if (n < 2)
            return in[0] == '\r' ? 0 : -1;
        if (in[0] != '\r' || in[1] != '\n')
            return -1;
        b->state = B_SIZE;
        return 2;
    }
    /* a line: a chunk size, or a trailer field (B_TRAILER) */
    const char *nl = memchr(in, '\n', n);
    if (!nl)
        return n > 1024 ? -1 : 0;
    size_t line_len = (size_t)(nl - in);
    size_t used = line_len + 1;
    if (line_len > 0 && in[line_len - 1] == '\r')
        line_len--;
    if (b->state == B_TRAILER) {
        if (line_len == 0)
            b->done = true;
        return (long)used;
    }
    int64_t size;
    if (!api_http_chunk_size(in, line_len, &size))
        return -1;
    if (size == 0) {
        b->state = B_TRAILER;
    } else {
        b->remaining = size;
        b->state = B_DATA;
    }
    return (long)used;
}

int api_http_decode(const char *buf, size_t len, bool at_eof, api_http_response *r, char **body,
                    size_t *body_len, size_t *used)
{
    *body = NULL;
    *body_len = 0;
    int h = api_http_response_head(buf, len, (size_t)64 << 10, r);
    if (h <= 0)
        return h;
    api_http_body b;
    api_http_body_init(&b, r);
    char *out = sw_malloc(len - r->head_len + 1);
    if (!out)
        return -1;
    size_t at = r->head_len, got = 0;
    while (!b.done && at < len) {
        const char *d;
        size_t dn;
        long k = api_http_body_next(&b, buf + at, len - at, &d, &dn);
        if (k < 0) {
            sw_free(out);
            return -1;
        }
        if (k == 0)
            break;
        memcpy(out + got, d, dn);
        got += dn;
        at += (size_t)k;
    }
    bool whole = b.done || (at_eof && !b.chunked && !b.has_length);
    if (!whole) {
        sw_free(out);
        return at_eof ? -1 : 0;
    }
    out[got] = '\0';
    *body = out;
    *body_len = got;
    *used = at;
    return 1;
}
