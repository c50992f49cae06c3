/* responses_check.c - a Responses stream read and checked from the wire
 * (responses_check.h). */
#include "responses_check.h"

#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RC_MAX_ITEMS 16

typedef struct item_state {
    char id[160];
    char type[32];
    bool done;
    char text[8192]; /* deltas so far */
} item_state;

static void cat(char *dst, size_t cap, const char *s)
{
    if (s)
        snprintf(dst + strlen(dst), cap - strlen(dst), "%s", s);
}

void rc_response_text(const json_t *response, char *out, size_t cap)
{
    out[0] = 0;
    size_t i, k;
    json_t *item, *part;
    json_array_foreach(json_object_get(response, "output"), i, item) {
        if (strcmp(json_string_value(json_object_get(item, "type")), "message"))
            continue;
        json_array_foreach(json_object_get(item, "content"), k, part)
            cat(out, cap, json_string_value(json_object_get(part, "text")));
    }
}

static item_state *item_of(item_state *items, int n, const json_t *ev)
{
    json_int_t oi = json_integer_value(json_object_get(ev, "output_index"));
    if (oi < 0 || oi >= n)
        fail_msg("event %s names output_index %lld of %d items",
                 json_string_value(json_object_get(ev, "type")), (long long)oi, n);
    item_state *it = &items[oi];
    const char *iid = json_string_value(json_object_get(ev, "item_id"));
    if (iid)
        assert_string_equal(iid, it->id);
    if (it->done)
        fail_msg("event %s after its item's done", json_string_value(json_object_get(ev, "type")));
    return it;
}

void rc_stream_check(const char *body, rc_stream *out)
{
    memset(out, 0, sizeof *out);
    item_state *items = calloc(RC_MAX_ITEMS, sizeof *items);
    json_t *done_items = json_array();
    int n_items = 0;
    const char *p = body;
    int seq = 0;
    bool ended = false;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        if (!end)
            fail_msg("an event not ended by a blank line: %.200s", p);
        if (strncmp(p, "event: ", 7))
            fail_msg("an event without its event line: %.200s", p);
        const char *nl = strchr(p, '\n');
        char type[64];
        snprintf(type, sizeof type, "%.*s", (int)(nl - p - 7), p + 7);
        if (strncmp(nl + 1, "data: ", 6))
            fail_msg("event %s: its second line is not data: %.200s", type, nl + 1);
        const char *data = nl + 7;
        if (memchr(data, '\n', (size_t)(end - data)))
            fail_msg("event %s: more than two lines", type);
        json_error_t je;
        json_t *ev = json_loadb(data, (size_t)(end - data), 0, &je);
        if (!ev)
            fail_msg("event %s: data is not JSON (%s)", type, je.text);
        assert_string_equal(json_string_value(json_object_get(ev, "type")), type);
        assert_int_equal(json_integer_value(json_object_get(ev, "sequence_number")), seq);
        if (ended)
            fail_msg("event %s after the final one", type);
        if (seq == 0)
            assert_string_equal(type, "response.created");
        else if (seq == 1)
            assert_string_equal(type, "response.in_progress");
        else if (!strcmp(type, "response.created") || !strcmp(type, "response.in_progress"))
            fail_msg("%s again at %d", type, seq);
        if (!strcmp(type, "response.created")) {
            json_t *r = json_object_get(ev, "response");
            assert_string_equal(json_string_value(json_object_get(r, "status")), "in_progress");
            assert_int_equal(json_array_size(json_object_get(r, "output")), 0);
            assert_int_equal(strncmp(json_string_value(json_object_get(r, "id")), "resp_", 5), 0);
        } else if (!strcmp(type, "response.in_progress")) {
            json_t *r = json_object_get(ev, "response");
            assert_string_equal(json_string_value(json_object_get(r, "status")), "in_progress");
        } else if (!strcmp(type, "response.output_item.added")) {
            json_t *item = json_object_get(ev, "item");
            assert_int_equal(json_integer_value(json_object_get(ev, "output_index")), n_items);
            assert_true(n_items < RC_MAX_ITEMS);
            if (n_items > 0 && !items[n_items - 1].done)
                fail_msg("item %d added before item %d is done", n_items, n_items - 1);
            item_state *it = &items[n_items++];
            snprintf(it->id, sizeof it->id, "%s", json_string_value(json_object_get(item, "id")));
            snprintf(it->type, sizeof it->type, "%s",
                     json_string_value(json_object_get(item, "type")));
            assert_true(it->id[0] && it->type[0]);
            for (int k = 0; k < n_items - 1; k++)
                assert_string_not_equal(items[k].id, it->id);
        } else if (!strcmp(type, "response.output_text.delta") ||
                   !strcmp(type, "response.reasoning_text.delta") ||
                   !strcmp(type, "response.function_call_arguments.delta")) {
            item_state *it = item_of(items, n_items, ev);
            const char *want = type[9] == 'o' ? "message" : type[9] == 'r' ? "reasoning"
                                                                           : "function_call";
            assert_string_equal(it->type, want);
            cat(it->text, sizeof it->text, json_string_value(json_object_get(ev, "delta")));
        } else if (!strcmp(type, "response.output_text.done") ||
                   !strcmp(type, "response.reasoning_text.done")) {
            item_state *it = item_of(items, n_items, ev);
            assert_string_equal(json_string_value(json_object_get(ev, "text")), it->text);
        } else if (!strcmp(type, "response.function_call_arguments.done")) {
            item_state *it = item_of(items, n_items, ev);
            assert_string_equal(json_string_value(json_object_get(ev, "arguments")), it->text);
        } else if (!strcmp(type, "response.content_part.added") ||
                   !strcmp(type, "response.content_part.done")) {
            item_state *it = item_of(items, n_items, ev);
            json_t *part = json_object_get(ev, "part");
            assert_string_equal(json_string_value(json_object_get(part, "type")),
                                !strcmp(it->type, "message") ? "output_text" : "reasoning_text");
            assert_string_equal(json_string_value(json_object_get(part, "text")),
                                type[22] == 'a' ? "" : it->text);
        } else if (!strcmp(type, "response.output_item.done")) {
            item_state *it = item_of(items, n_items, ev);
            json_t *item = json_object_get(ev, "item");
            assert_string_equal(json_string_value(json_object_get(item, "id")), it->id);
            const char *t = !strcmp(it->type, "function_call")
                                ? json_string_value(json_object_get(item, "arguments"))
                                : json_string_value(json_object_get(
                                      json_array_get(json_object_get(item, "content"), 0),
                                      "text"));
            assert_non_null(t);
            assert_string_equal(t, it->text);
            it->done = true;
            json_array_append(done_items, item);
            if (!strcmp(it->type, "message"))
                cat(out->text, sizeof out->text, it->text);
            else if (!strcmp(it->type, "reasoning"))
                cat(out->reasoning, sizeof out->reasoning, it->text);
        } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete") ||
                   !strcmp(type, "response.failed")) {
            ended = true;
            snprintf(out->final_type, sizeof out->final_type, "%s", type);
            out->response = json_incref(json_object_get(ev, "response"));
            const char *status = json_string_value(json_object_get(out->response, "status"));
            assert_string_equal(status, type + 9);
            if (strcmp(type, "response.failed")) {
                for (int k = 0; k < n_items; k++)
                    if (!items[k].done)
                        fail_msg("item %d not done at the end", k);
                if (!json_equal(json_object_get(out->response, "output"), done_items))
                    fail_msg("the final output is not the items done");
            }
        } else {
            fail_msg("unknown event %s", type);
        }
        json_decref(ev);
        seq++;
        p = end + 2;
    }
    if (!ended)
        fail_msg("the stream has no final event (%d events)", seq);
    out->n_events = seq;
    out->n_items = n_items;
    json_decref(done_items);
    free(items);
}

void rc_stream_free(rc_stream *s)
{
    json_decref(s->response);
    s->response = NULL;
}

bool rc_usage_same(const json_t *a, const json_t *b)
{
    const json_t *ua = json_object_get(a, "usage"), *ub = json_object_get(b, "usage");
    const char *keys[] = {"input_tokens", "output_tokens", "total_tokens"};
    if (!json_is_object(ua) || !json_is_object(ub))
        return false;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!json_is_integer(json_object_get(ua, keys[i])) ||
            !json_equal(json_object_get(ua, keys[i]), json_object_get(ub, keys[i])))
            return false;
    return true;
}
