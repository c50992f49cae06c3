/* fuzz_llamaserver.c - libFuzzer harness for what a llama-server sends the
 * router on a native stream (src/router/router_llamaserver.c): each event
 * payload of its POST /completion stream translated into OpenAI chunks
 * (rt__ls_translate), and an error body read for exceed_context_size_error
 * (rt__ls_context_error). A llama-server is a peer: whatever it sends must
 * give a typed result, never a crash.
 *
 * Input: a flags byte (bit 0: a chat stream, bit 1: include_usage), then
 * event payloads separated by newlines. Invariants checked on every event:
 * - the result is 0, 1 (an error event: nothing made, the error text
 *   filled) or -1 (not a JSON object, or out of memory);
 * - every payload made is "[DONE]" (last, once, and the stream ends) or
 *   a JSON chunk with the request's id (after "chatcmpl-" or "cmpl-") and
 *   the object its kind names, its text the event's content;
 * - a chat stream sends the role once, in its first chunk;
 * - token ids ride on a chunk only while every token came with its id, and
 *   the count of ids the attempt saw never goes down.
 */
#include "router/router_llamaserver.h"

#include "fuzzlib.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static rt_router fz_rt;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    snprintf(fz_rt.models[0].cfg.name, sizeof fz_rt.models[0].cfg.name, "fuzz-model");
    fz_rt.n_models = 1;
    rt_req q;
    memset(&q, 0, sizeof q);
    q.rt = &fz_rt;
    q.model = 0;
    snprintf(q.request_id, sizeof q.request_id, "req-fuzz");
    rt_relay r;
    memset(&r, 0, sizeof r);
    r.q = &q;
    r.chat = data[0] & 1;
    r.stream = true;
    r.ls_kind = r.ls_native = true;
    r.ls_include_usage = data[0] & 2;
    rt__ls_stream_begin(&r);
    const char *object = r.chat ? "chat.completion.chunk" : "text_completion";

    char *text = sw_malloc(size);
    FZ_CHECK(text != NULL);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    bool role_seen = false, done = false;
    size_t ids_before = 0;
    for (char *ev = text, *next; ev && !done; ev = next) {
        next = strchr(ev, '\n');
        if (next)
            *next++ = 0;
        char *out[RT_LS_MAX_OUT] = {0};
        int n_out = -1;
        char error_text[256];
        int rc = rt__ls_translate(&r, ev, out, &n_out, error_text, sizeof error_text);
        FZ_CHECK(rc >= -1 && rc <= 1);
        FZ_CHECK(n_out >= 0 && n_out <= RT_LS_MAX_OUT);
        FZ_CHECK(r.ls_ids >= ids_before);
        ids_before = r.ls_ids;
        if (rc == 1)
            FZ_CHECK(n_out == 0 && error_text[0]);
        json_t *in = json_loads(ev, 0, NULL);
        json_t *content = json_object_get(in, "content");
        for (int i = 0; i < n_out; i++) {
            if (rc == -1 && !out[i])
                continue; /* out of memory part way: what was made is there */
            FZ_CHECK(out[i] != NULL);
            if (!strcmp(out[i], "[DONE]")) {
                FZ_CHECK(i == n_out - 1 && rc == 0);
                done = true;
            } else {
                json_t *c = json_loads(out[i], 0, NULL);
                FZ_CHECK(json_is_object(c));
                FZ_CHECK(!strcmp(json_string_value(json_object_get(c, "id")) ?: "",
                                 r.chat ? "chatcmpl-req-fuzz" : "cmpl-req-fuzz"));
                FZ_CHECK(!strcmp(json_string_value(json_object_get(c, "object")) ?: "", object));
                json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
                json_t *delta = json_object_get(ch, "delta");
                if (json_object_get(delta, "role")) {
                    FZ_CHECK(r.chat && !role_seen);
                }
                if (ch)
                    role_seen = role_seen || r.chat;
                json_t *t = r.chat ? json_object_get(delta, "content") : json_object_get(ch, "text");
                if (i == 0 && json_is_string(content) && json_string_length(content) > 0)
                    FZ_CHECK(json_is_string(t) && json_string_length(t) == json_string_length(content) &&
                             !memcmp(json_string_value(t), json_string_value(content),
                                     json_string_length(t)));
                if (json_object_get(json_object_get(c, "spillway"), "token_ids"))
                    FZ_CHECK(!r.ls_ids_gap);
                json_decref(c);
            }
        }
        json_decref(in);
        for (int i = 0; i < n_out; i++)
            free(out[i]);
    }
    int32_t n_ctx = -1;
    rt__ls_context_error(text, &n_ctx);
    FZ_CHECK(n_ctx >= 0);
    sw_free(text);
    return 0;
}
