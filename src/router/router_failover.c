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
    rt_failover f = {RT_FO_STOP, "none", "", NULL, false, false, false};
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
        /* which kinds can continue it: a spillway worker always (its own
         * continuation from the ids), another llama-server only where its
         * token prompt continues the stream exactly */
        static const char *const only_spillway[] = {
            [RT_LSR_SAMPLED] = "stream with tokens already sent by llama-server (native, with "
                               "their ids), sampled: resumed with the sent tokens on a spillway "
                               "worker, whose continuation it is (another llama-server cannot "
                               "reproduce its random stream)",
            [RT_LSR_CONSTRAINED] = "stream with tokens already sent by llama-server (native, "
                                   "with their ids) under a grammar that could not be advanced "
                                   "over the sent text for another llama-server: resumed on a "
                                   "spillway worker, which advances the grammar itself",
            [RT_LSR_STOP] = "stream with tokens already sent by llama-server (native, with their "
                            "ids), with stop strings: resumed on a spillway worker, whose "
                            "continuation it is (another llama-server would lose text held "
                            "back as the start of one)",
            [RT_LSR_FIELDS] = "stream with tokens already sent by llama-server (native, with "
                              "their ids): resumed with the sent tokens on a spillway worker, "
                              "whose continuation it is",
            [RT_LSR_SPILLWAY_IDS] = "stream with tokens already sent by llama-server (native, "
                                    "with their ids) and a spillway worker: resumed on a "
                                    "spillway worker, whose continuation it is",
            [RT_LSR_IMAGE_TEXT] = NULL, /* an image: no spillway worker takes it */
        };
        static const char *const stop_reason[] = {
            [RT_LSR_SAMPLED] = "stream with tokens sent by llama-server, sampled: another "
                               "llama-server cannot reproduce its random stream and no spillway "
                               "worker is left, so it ended with an error event",
            [RT_LSR_CONSTRAINED] = "stream with tokens sent by llama-server under a grammar "
                                   "that could not be advanced over the sent text (the text "
                                   "leaves it or ends inside a character, or the grammar is past "
                                   "the recognizer's bounds) and no spillway worker is left, so "
                                   "it ended with an error event",
            [RT_LSR_STOP] = "stream with tokens sent by llama-server, with stop strings: another "
                            "llama-server would lose text held back as the start of one and no "
                            "spillway worker is left, so it ended with an error event",
            [RT_LSR_FIELDS] = "stream with tokens sent by llama-server with a field its native "
                              "API does not take, and no spillway worker is left, so it ended "
                              "with an error event",
            [RT_LSR_SPILLWAY_IDS] = "stream with tokens sent by a spillway worker too: another "
                                    "llama-server cannot take them and no spillway worker is "
                                    "left, so it ended with an error event",
            [RT_LSR_IMAGE_TEXT] = "image stream with tokens sent by llama-server whose text "
                                  "does not tokenize back to the ids sent after the prompt (an "
                                  "image resume sends that text: llama-server takes no ids "
                                  "beside images), and a spillway worker takes no image, so it "
                                  "ended with an error event",
        };
        unsigned why = (unsigned)in->ls_resume;
        bool known = why < sizeof stop_reason / sizeof stop_reason[0];
        if (in->kind == RT_KIND_LLAMA_SERVER && in->ls_resume != RT_LSR_OK &&
            !in->spillway_left) {
            f.action = RT_FO_STOP;
            f.error_code = failed;
            f.decision = "none (llama-server cannot continue it)";
            f.reason = known ? stop_reason[why] : "no worker left can continue it";
            if (in->images && in->ls_resume == RT_LSR_SAMPLED)
                f.reason = "image stream with tokens sent by llama-server, sampled: another "
                           "llama-server cannot reproduce its random stream and a spillway "
                           "worker takes no image, so it ended with an error event";
            return f;
        }
        f.action = RT_FO_RESUME;
        f.decision = "resume";
        if (in->kind == RT_KIND_LLAMA_SERVER && in->ls_resume == RT_LSR_OK) {
            f.resume_on_ls = true;
            f.reason = in->images
                           ? "image stream with tokens already sent by llama-server (native, "
                             "with their ids), greedy: resumed on another llama-server with a "
                             "projector, from the rendered chat and the text sent (which "
                             "tokenizes back to the ids sent) with the same image bytes: it "
                             "continues exactly"
                           : "stream with tokens already sent by llama-server (native, with "
                             "their ids), greedy (a grammar advanced over the sent text): "
                             "resumed with the sent tokens on another llama-server (a token "
                             "prompt: it continues exactly) or a spillway worker (its "
                             "continuation)";
        } else {
            f.reason = known && only_spillway[why] ? only_spillway[why]
                                                   : only_spillway[RT_LSR_FIELDS];
        }
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
