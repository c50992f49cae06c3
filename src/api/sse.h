/* sse.h - reading server-sent events, the one parser of the tree.
 *
 * Every stream spillway reads is OpenAI-style SSE: events of one
 * `data: PAYLOAD` line, each ended by a blank line ("\n\n"). The router's
 * relay reads them from workers and external engines, the agent loop and
 * the idempotency replay from what the router captured, the drill from the
 * router. api_sse_next walks a buffer event by event; what it does not
 * have whole yet stays for the next read.
 */
#ifndef SPILLWAY_API_SSE_H
#define SPILLWAY_API_SSE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct api_sse_event {
    const char *text;    /* the event, without its ending blank line */
    size_t text_len;
    const char *data;    /* its payload when the event is a data line: after
                            "data: " (OpenAI's form, the space included: an
                            event without it is not one of theirs); else NULL */
    size_t data_len;
    size_t consumed;     /* bytes of the buffer through the blank line */
} api_sse_event;

/* The first complete event of buf[0..len): true and *ev, false when no
 * blank line ends one yet (then nothing of it is consumed). */
bool api_sse_next(const char *buf, size_t len, api_sse_event *ev);

/* Whether an event's payload is the end marker "[DONE]". */
bool api_sse_is_done(const api_sse_event *ev);

#endif
