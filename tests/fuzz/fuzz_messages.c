/* fuzz_messages.c - libFuzzer harness for Anthropic's Messages API as
 * translated by api/messages.h (the worker and the router both run it on
 * what clients and workers send).
 *
 * The first byte picks what the rest is: 0 a Messages body (translated
 * as /v1/messages and as count_tokens; a translated body is then counted
 * as a worker counts a chat prompt, with the built-in vocabulary), 1 a
 * chat stream (its payloads one per line, fed to the stream translator,
 * then [DONE]), 2 a chat answer (turned into a Message), 3 an OpenAI
 * error body (turned into Anthropic's).
 *
 * Invariants: a refused body has a message and a 4xx/5xx status, an
 * accepted one is a JSON object with a non-empty "messages" array; a
 * Message always has "content" (an array) and a "stop_reason"; the
 * events a stream gives are each "event: NAME\ndata: JSON\n\n" with the
 * JSON's type NAME, message_start comes first and once, and the stream
 * ends with message_stop or error and nothing after it.
 */
#include "api/messages.h"

#include "fuzzlib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks one feed's output and the order of events so far. */
static void check_events(const char *out, size_t len, int *starts, bool *ended)
{
    if (len == 0)
        return;
    const char *p = out, *end = out + len;
    while (p < end) {
        FZ_CHECK(!*ended);
        FZ_CHECK(strncmp(p, "event: ", 7) == 0);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        FZ_CHECK(nl);
        char name[64];
        FZ_CHECK((size_t)(nl - p - 7) < sizeof name);
        memcpy(name, p + 7, (size_t)(nl - p - 7));
        name[nl - p - 7] = '\0';
        p = nl + 1;
        FZ_CHECK(strncmp(p, "data: ", 6) == 0);
        nl = memchr(p, '\n', (size_t)(end - p));
        FZ_CHECK(nl && nl + 1 < end && nl[1] == '\n');
        json_t *d = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
        FZ_CHECK(d);
        const char *type = json_string_value(json_object_get(d, "type"));
        FZ_CHECK(type && strcmp(type, name) == 0);
        json_decref(d);
        p = nl + 2;
        if (strcmp(name, "message_start") == 0)
            FZ_CHECK(++*starts == 1);
        else
            FZ_CHECK(*starts == 1);
        if (strcmp(name, "message_stop") == 0 || strcmp(name, "error") == 0)
            *ended = true;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (mode == 1) {
        api_msg_stream s;
        api_msg_stream_init(&s, "fuzz", 0);
        int starts = 0;
        bool ended = false;
        const char *p = text, *end = text + len;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
            api_msg_stream_feed(&s, p, n);
            if (!s.oom)
                check_events(s.out, s.out_len, &starts, &ended);
            p += n + (nl ? 1 : 0);
        }
        api_msg_stream_feed(&s, "[DONE]", 6);
        if (!s.oom) {
            check_events(s.out, s.out_len, &starts, &ended);
            FZ_CHECK(ended && starts == 1);
        }
        api_msg_stream_free(&s);
        return 0;
    }
    json_t *j = json_loadb(text, len, 0, NULL);
    if (!j)
        return 0;
    if (mode == 0) {
        for (int count = 0; count < 2; count++) {
            api_error e;
            memset(&e, 0, sizeof e);
            json_t *chat = api_msg_to_chat(j, count == 1, &e);
            if (!chat) {
                FZ_CHECK(e.status >= 400 && e.msg[0]);
                continue;
            }
            json_t *msgs = json_object_get(chat, "messages");
            FZ_CHECK(json_is_array(msgs) && json_array_size(msgs) > 0);
            const eng_tokenizer *tok = fz_builtin_tokenizer();
            size_t n = 0;
            if (tok)
                (void)api_chat_prompt_tokens(tok, ENG_CHAT_CHATML, chat, &n);
            json_decref(chat);
        }
    } else if (mode == 2) {
        json_t *m = api_msg_from_chat(j);
        if (m) {
            FZ_CHECK(json_is_array(json_object_get(m, "content")));
            FZ_CHECK(json_is_string(json_object_get(m, "stop_reason")));
        }
        json_decref(m);
    } else {
        int status = 400 + (int)(len % 200);
        json_t *e = api_msg_error_from_chat(status, j);
        if (e)
            FZ_CHECK(json_is_string(json_object_get(json_object_get(e, "error"), "type")));
        json_decref(e);
    }
    json_decref(j);
    return 0;
}
