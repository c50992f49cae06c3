/* worker_responses.c - POST /v1/responses on a worker: the body translated
 * into the chat request the worker serves (api_responses.h), and the chat
 * answer, whole or streamed, translated back at the HTTP edge
 * (worker_http.c calls these where it would send a chat body or chunk).
 *
 * A worker holds no state between requests: previous_response_id and
 * background are refused here (the router keeps responses in its ledger
 * and runs background ones as jobs), and store is accepted but nothing is
 * kept (its Responses say store false).
 */
#include "worker/worker-impl.h"

#include "api/api_responses.h"
#include "common/alloc.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

json_t *wk__responses_request(wk_req *r, json_t *body, api_error *e)
{
    const json_t *prev = json_object_get(body, "previous_response_id");
    if (prev && !json_is_null(prev)) {
        api_bad(e, "previous_response_id",
                "previous_response_id needs stored responses, which a worker does not keep: "
                "send the request through the router (spillway serve)");
        return NULL;
    }
    const json_t *bg = json_object_get(body, "background");
    if (bg && !json_is_null(bg) && !json_is_false(bg)) {
        api_bad(e, "background",
                "background responses run as the router's jobs: send the request through the "
                "router (spillway serve)");
        return NULL;
    }
    json_t *chat = api_responses_chat(body, NULL, e);
    if (!chat)
        return NULL;
    /* the response id: resp_ and the request id (the router's, or made here) */
    char id[sizeof r->resp_id];
    snprintf(id, sizeof id, "resp_%s", strncmp(r->id, "resp-", 5) == 0 ? r->id + 5 : r->id);
    snprintf(r->resp_id, sizeof r->resp_id, "%s", id);
    /* what the Response echoes; a worker keeps nothing: store false */
    r->responses = json_deep_copy(body);
    if (!r->responses || json_object_set_new(r->responses, "store", json_false())) {
        json_decref(chat);
        api_oom(e);
        return NULL;
    }
    return chat;
}

char *wk__responses_chunk(wk_req *r, const json_t *chunk)
{
    if (!r->resp_stream &&
        !(r->resp_stream = api_resp_stream_new(r->responses, r->resp_id, (int64_t)time(NULL))))
        return NULL;
    return api_resp_stream_chunk(r->resp_stream, chunk);
}

char *wk__responses_end(wk_req *r, bool broken)
{
    if (!r->resp_stream &&
        !(r->resp_stream = api_resp_stream_new(r->responses, r->resp_id, (int64_t)time(NULL))))
        return NULL;
    return broken ? api_resp_stream_fail(r->resp_stream, "internal_error", "out of memory")
                  : api_resp_stream_end(r->resp_stream);
}

const char *wk__responses_param(const char *chat_param)
{
    return api_responses_param(chat_param);
}

void wk__responses_lost(wk_req *r)
{
    if (r->resp_stream)
        api_resp_stream_lost(r->resp_stream);
}

json_t *wk__responses_answer(wk_req *r, const json_t *chat)
{
    return api_responses_from_chat(r->responses, r->resp_id, (int64_t)r->created, chat);
}
