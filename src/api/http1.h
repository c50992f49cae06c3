/* http1.h - HTTP/1.1 message framing (RFC 9112), its rules written once.
 *
 * spillway speaks HTTP/1.1 in several places: the router serves clients
 * and calls workers and engines, the drill and `spillway bench` are
 * clients, and so are the tests. Each keeps its own buffering (the
 * router's pooled, TLS-capable socket reader pulls lines; the clients
 * push whatever they have read), but the framing rules are these:
 * the status line, header fields, Content-Length, token lists, chunk
 * sizes, and (for the clients that push bytes) one incremental decoder of
 * a response's head and body.
 */
#ifndef SPILLWAY_API_HTTP1_H
#define SPILLWAY_API_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the rules, a line or a value at a time ------------------------------ */

/* A Content-Length value (v, n bytes, leading white space already skipped):
 * digits only (RFC 9110 8.6: no sign, no space inside), white space after
 * allowed, at most 18 digits. */
bool api_http_content_length(const char *v, size_t n, int64_t *out);

/* Whether a comma-separated field value (Connection, Expect, ...) lists
 * tok, compared without case. */
bool api_http_has_token(const char *v, size_t n, const char *tok);

/* A status line without its CRLF: "HTTP/1.x NNN[ reason]", three digits
 * in 100..599. *status, and *minor (0 or 1: HTTP/1.0 is not persistent). */
bool api_http_status_line(const char *line, size_t n, int *status, int *minor);

/* A chunk-size line without its CRLF: 1 to 15 hex digits, then optional
 * white space and an optional ";extension". */
bool api_http_chunk_size(const char *line, size_t n, int64_t *size);

/* One header field of a head. */
typedef struct api_http_field {
    const char *name;
    size_t name_len;
    const char *value; /* white space around it trimmed */
    size_t value_len;
} api_http_field;

/* The next field of the field lines at [*p, end) (each ended by CRLF or
 * LF; lines without a colon are skipped); advances *p past its line.
 * False at the end. */
bool api_http_next_field(const char **p, const char *end, api_http_field *f);

/* The value of the first field called name (without case) among the field
 * lines at [fields, end). */
bool api_http_find_field(const char *fields, const char *end, const char *name,
                         const char **value, size_t *value_len);

/* ---- a response, pushed in as it is read --------------------------------- */

typedef struct api_http_response {
    int status;           /* the final status (an interim 1xx head is skipped) */
    int minor;            /* HTTP/1.<minor> */
    size_t head_len;      /* bytes through the head's blank line (any 1xx included) */
    size_t final_at;      /* where the final head's status line starts */
    const char *fields;   /* its header lines: [fields, fields + fields_len) */
    size_t fields_len;
    bool chunked;         /* Transfer-Encoding names chunked */
    bool has_length;      /* Content-Length given (and no chunked) */
    int64_t length;
    bool close;           /* the connection ends after it (Connection: close,
                             HTTP/1.0, or a body framed by the close) */
} api_http_response;

/* The response head at buf[0..len): 1 with *r (pointers into buf), 0 when
 * the head is not whole yet (and under max_head bytes), -1 when malformed
 * or too large. */
int api_http_response_head(const char *buf, size_t len, size_t max_head, api_http_response *r);

/* The body after the head, decoded as it comes. */
typedef struct api_http_body {
    bool chunked, has_length;
    int64_t remaining; /* of the body, or of the current chunk */
    int state;
    bool done;         /* the body is whole (to the end of its framing) */
} api_http_body;

void api_http_body_init(api_http_body *b, const api_http_response *r);

/* Decodes from in[0..n): returns the bytes consumed (0: more input is
 * needed, or done), -1 when the framing is malformed; *data / *data_len:
 * the body bytes among them (a span of in, possibly empty). A body framed
 * by the connection's close is never done: its end is the caller's EOF. */
long api_http_body_next(api_http_body *b, const char *in, size_t n, const char **data,
                        size_t *data_len);

/* A whole response at buf[0..len) (a client that read to the close, or to
 * the end of the framing): 1 with *r and the decoded body (*body, sw_free,
 * NUL-terminated; *body_len), 0 when incomplete, -1 when malformed; *used:
 * bytes of buf it took (a kept-alive connection's next response follows). */
int api_http_decode(const char *buf, size_t len, bool at_eof, api_http_response *r, char **body,
                    size_t *body_len, size_t *used);

#endif
