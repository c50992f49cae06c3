/* router_failover.c - DESIGN.md's replay table as code
 * (router_failover.h).
 */
#include "router/router_failover.h"

#include "router/router.h"

const char *rt_outcome_name(rt_outcome o)
{
    static const char *const n[] = {"ok",  "client_error", "refused",
                                    "oom", "worker_crash", "cancelled"};
    return (unsigned)o < sizeof n / sizeof n[0] ? n[o] : "unknown";
}

rt_failover rt_failover_decide(const rt_failover_in *in)
{
    rt_failover f = {RT_FO_STOP, "none", "", NULL, false, false};
    switch (in->outcome) {
    case RT_OUT_OK:
        f.action = RT_FO_DONE;
        f.reason = "completed";
        return f;
    case RT_OUT_CLIENT_ERROR:
        f.action = RT_FO_DONE;
        f.reason = "4xx from a worker: not retried";
        return f;
    case RT_OUT_CLIENT_GONE:
        f.action = RT_FO_CANCEL;
        f.reason = "client disconnected: cancelled everywhere, no replay";
        return f;
    case RT_OUT_REFUSED:
        /* the books said it fits and the worker disagreed (a race with an
         * allocation outside the router): the request keeps its place */
        f.action = RT_FO_REQUEUE;
        f.decision = "requeue";
        f.reason = "refused before any work: back to its place in the queue";
        return f;
    case RT_OUT_OOM:
    case RT_OUT_CRASH:
        break;
    }
    bool sent = in->tokens_sent > 0 || in->content_sent;
    f.out_of_rotation = true;
    f.restart = in->outcome == RT_OUT_OOM;
    /* the error of a stop (a replay or a resume has none) */
    const char *failed = in->outcome == RT_OUT_OOM ? "out_of_memory" : "worker_failed";
    if (in->tool == RT_TOOL_UNKNOWN) {
        f.action = RT_FO_STOP;
        f.error_code = "unsafe_to_retry";
        f.reason = "a tool call started and its outcome is unknown; the tool is not "
                   "idempotent: no replay";
        return f;
    }
    if (in->single_pass) {
        f.action = RT_FO_STOP;
        f.error_code = failed;
        f.reason = "the caller replays the whole run";
        return f;
    }
    if (in->no_replay) {
        f.action = RT_FO_STOP;
        f.error_code = failed;
        f.decision = "none (SPILLWAY_SABOTAGE=no-replay)";
        f.reason = "SPILLWAY_SABOTAGE=no-replay: the failure goes to the client";
        return f;
    }
    if (in->stream && sent && in->several_choices) {
        f.action = RT_FO_STOP;
        f.error_code = failed;
        f.decision = "none (n > 1: no resume)";
        f.reason = "stream of several choices (n > 1) with text already sent: a resume "
                   "continues one sequence, so it ended with an error event";
        return f;
    }
    if (in->stream && sent && RT_KIND_EXTERNAL(in->kind) &&
        !(in->kind == RT_KIND_LLAMA_SERVER && in->external_ids && in->tokens_sent > 0)) {
        f.action = RT_FO_STOP;
        f.error_code = failed;
        f.decision = "none (external engine: no resume)";
        f.reason = in->kind == RT_KIND_LLAMA_SERVER
                       ? "stream with text already sent by llama-server without the token ids "
                         "of all of it (the OpenAI endpoint, a token without its id, or another "
                         "vocabulary): it cannot be resumed, so it ended with an error event"
                       : "stream with text already sent by an external engine (kind = openai): "
                         "it cannot be resumed, so it ended with an error event";
        return f;
    }
    if (in->stream && sent && RT_KIND_EXTERNAL(in->kind) && !in->no_resume) {
        f.action = RT_FO_RESUME;
        f.decision = "resume";
        f.reason = "stream with tokens already sent by llama-server (native, with their ids): "
                   "resumed with the sent tokens on a spillway worker, whose continuation it is";
        return f;
    }
    if (in->stream && sent && !in->no_resume) {
        f.action = RT_FO_RESUME;
        f.decision = "resume";
        f.reason = "stream with tokens already sent: resumed with the sent tokens and sampler draws";
        return f;
    }
    f.action = RT_FO_REPLAY;
    f.decision = "replay";
    f.reason = in->stream ? sent ? "SPILLWAY_SABOTAGE=no-resume: replayed from the start; the "
                                   "client sees the sent tokens twice"
                                 : "stream with nothing sent yet: replayed from the start"
               : in->tool == RT_TOOL_EXECUTED
                   ? "a server-side tool call already executed: replayed, reusing the recorded "
                     "tool result"
                   : "non-streaming request, no tool executed: replayed from the start";
    return f;
}
