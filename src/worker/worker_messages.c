/* worker_messages.c - Anthropic's Messages API on the worker
 * (POST /v1/messages, /v1/messages/count_tokens; docs/api.md).
 *
 * A Messages request is a chat request in other words: worker_http.c
 * translates its body to a chat body (api/messages.h), serves it as it
 * serves /v1/chat/completions, and turns what goes out into Anthropic's
 * shapes: each JSON answer through wk__messages_answer, each stream chunk
 * through the request's api_msg_stream. Nothing of the engine's work
 * differs, so a Messages answer is the chat answer, token for token.
 */
#include "worker/worker-impl.h"

#include "common/alloc.h"

#include <stdio.h>
#include <string.h>

bool wk__messages_path(const char *path)
{
    return path && (strcmp(path, API_MSG_PATH) == 0 || strcmp(path, API_MSG_COUNT_PATH) == 0);
}

json_t *wk__messages_answer(int status, json_t *body)
{
    if (status >= 400 || json_object_get(body, "error"))
        return api_msg_error_from_chat(status, body);
    const char *object = json_string_value(json_object_get(body, "object"));
    if (object && strcmp(object, "chat.completion") == 0)
        return api_msg_from_chat(body);
    return json_incref(body); /* count_tokens' answer is Anthropic's already */
}

bool wk__messages_begin(wk_server *s, wk_req *r)
{
    r->msg = sw_malloc(sizeof *r->msg);
    if (!r->msg)
        return false;
    api_msg_stream_init(r->msg, s->model_id, r->n_prompt_client);
    return true;
}

json_t *wk__messages_count(wk_server *s, json_t *body, int *status)
{
    api_error e;
    memset(&e, 0, sizeof e);
    json_t *chat = api_msg_to_chat(body, true, &e);
    json_t *model = json_object_get(body, "model");
    if (chat && json_is_string(model) && !wk__model_name_is(s, json_string_value(model))) {
        json_decref(chat);
        char msg[640];
        snprintf(msg, sizeof msg, "this worker serves '%s', not '%.300s'", s->model_id,
                 json_string_value(model));
        *status = 404;
        return api_msg_error(404, msg);
    }
    size_t n = 0;
    int rc = chat ? api_chat_prompt_tokens(s->tok, s->chat_family, chat, &n) : SW_EINVAL;
    json_decref(chat);
    if (rc == SW_OK) {
        *status = 200;
        return json_pack("{s:I}", "input_tokens", (json_int_t)n);
    }
    if (rc == SW_ENOMEM || e.status == 500) {
        *status = 500;
        return api_msg_error(500, "out of memory");
    }
    *status = 400;
    return api_msg_error(400, e.msg[0] ? e.msg
                                       : "the messages or tools cannot be rendered to a prompt "
                                         "(/v1/messages says why)");
}
