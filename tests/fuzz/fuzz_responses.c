/* fuzz_responses.c - libFuzzer harness for the Responses API translation
 * (api_responses.h) that the worker and the router run on what clients
 * and workers send.
 *
 * The input is a JSON text. As a client's body it goes through
 * api_responses_chat (with its own input as the earlier turns too) and
 * api_responses_input_items; as a worker's chat answer through
 * api_responses_from_chat; and as a stream: the document itself, then
 * each element of its "chunks" array, fed to api_resp_stream_chunk,
 * then the end (or a failure, by the input's length).
 *
 * Invariants: nothing crashes or leaks; a refused body has a message;
 * an accepted one is a chat body with a non-empty messages array; every
 * stream call answers text (never NULL: no allocation fails here) made of
 * whole "event: ...\ndata: {...}\n\n" events with sequence numbers
 * 0, 1, 2, ... across the calls, and after the end nothing more.
 */
#include "api/api_responses.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

/* Every event of text well framed, numbered from *seq on. */
static void check_events(const char *text, long long *seq)
{
    FZ_CHECK(text != NULL);
    const char *p = text;
    while (*p) {
        FZ_CHECK(strncmp(p, "event: ", 7) == 0);
        const char *nl = strchr(p, '\n');
        FZ_CHECK(nl && strncmp(nl + 1, "data: ", 6) == 0);
        const char *end = strstr(nl + 1, "\n\n");
        FZ_CHECK(end != NULL);
        json_t *ev = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        FZ_CHECK(json_is_object(ev));
        FZ_CHECK(json_integer_value(json_object_get(ev, "sequence_number")) == *seq);
        const char *type = json_string_value(json_object_get(ev, "type"));
        FZ_CHECK(type && strlen(type) == (size_t)(nl - p - 7) &&
                 !strncmp(type, p + 7, strlen(type)));
        (*seq)++;
        json_decref(ev);
        p = end + 2;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!j)
        return 0;
    api_error e;
    memset(&e, 0, sizeof e);
    const json_t *input = json_object_get(j, "input");
    json_t *chat = api_responses_chat(j, json_is_array(input) ? input : NULL, &e);
    if (chat) {
        FZ_CHECK(json_array_size(json_object_get(chat, "messages")) > 0);
        json_t *items = api_responses_input_items(j);
        FZ_CHECK(json_is_array(items));
        json_decref(items);
    } else {
        FZ_CHECK(e.msg[0] != 0);
    }
    json_decref(chat);

    json_t *r = api_responses_from_chat(j, "resp_fuzz", 1, j);
    if (json_is_object(j))
        FZ_CHECK(r && json_is_array(json_object_get(r, "output")));
    json_decref(r);

    api_resp_stream *s = api_resp_stream_new(j, "resp_fuzz", 1);
    FZ_CHECK(s != NULL);
    long long seq = 0;
    char *t = api_resp_stream_chunk(s, j);
    check_events(t, &seq);
    sw_free(t);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(j, "chunks"), i, c) {
        t = api_resp_stream_chunk(s, c);
        check_events(t, &seq);
        sw_free(t);
    }
    t = size % 2 ? api_resp_stream_fail(s, "x", "failed") : api_resp_stream_end(s);
    check_events(t, &seq);
    sw_free(t);
    FZ_CHECK(api_resp_stream_ended(s));
    t = api_resp_stream_end(s);
    FZ_CHECK(t && !t[0]);
    sw_free(t);
    api_resp_stream_free(s);
    json_decref(j);
    return 0;
}
