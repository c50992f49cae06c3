/* router_failover.h - the failover decision: DESIGN.md's replay table as
 * a pure function from how an attempt ended, what the client already
 * received and the worker's kind to what happens next (replay, resume,
 * back to the queue, stop) and why. test_router_policy checks every row.
 */
#ifndef SPILLWAY_ROUTER_FAILOVER_H
#define SPILLWAY_ROUTER_FAILOVER_H

#include <stdbool.h>
#include <stddef.h>

/* How one attempt on one upstream ended. */
typedef enum rt_outcome {
    RT_OUT_OK,           /* a full answer relayed */
    RT_OUT_CLIENT_ERROR, /* a 4xx relayed as is */
    RT_OUT_REFUSED,      /* refused before any work (slots, memory at
                            admission, not ready, draining) */
    RT_OUT_OOM,          /* out of memory while working */
    RT_OUT_CRASH,        /* connection lost, broken answer, 5xx */
    RT_OUT_CLIENT_GONE,  /* the client left (or the job was cancelled) */
} rt_outcome;

/* A server-side tool call of the request (agent runs). */
typedef enum rt_tool_state {
    RT_TOOL_NONE,        /* none ran */
    RT_TOOL_EXECUTED,    /* ran; its result is in the ledger */
    RT_TOOL_UNKNOWN,     /* started, outcome unknown, not idempotent */
} rt_tool_state;

/* Whether a llama-server can continue a stream that must be resumed
 * (its native /completion from a token prompt: the prompt and the ids
 * sent), and why not. */
typedef enum rt_ls_resume {
    RT_LSR_OK,           /* greedy, no stop strings, every id sent from a
                            llama-server's native stream; a grammar
                            advanced over the sent text (its derivative,
                            gbnf.h, sent as the grammar) */
    RT_LSR_SAMPLED,      /* sampled: its random stream cannot be set to
                            where the failed one was */
    RT_LSR_CONSTRAINED,  /* a grammar that could not be advanced over the
                            sent text (it leaves the grammar, ends inside
                            a character, the recognizer's bounds) */
    RT_LSR_STOP,         /* stop strings: text held back as the start of
                            one would be lost */
    RT_LSR_FIELDS,       /* a field its native API does not take */
    RT_LSR_SPILLWAY_IDS, /* a spillway worker (or no native stream) sent
                            some of it */
    RT_LSR_IMAGE_TEXT,   /* an image stream, whose resume sends the text
                            sent (llama-server takes no ids beside
                            images): that text does not tokenize back to
                            the ids sent after the prompt */
} rt_ls_resume;

typedef struct rt_failover_in {
    rt_outcome outcome;
    bool stream;
    size_t tokens_sent;     /* token ids the client has (a stream) */
    bool content_sent;      /* text or a tool call reached the client */
    int kind;               /* RT_KIND_* of the worker it ran on */
    rt_tool_state tool;
    bool single_pass;       /* the caller replays the whole run (agent) */
    bool no_replay, no_resume; /* SPILLWAY_SABOTAGE switches */
    /* an external engine gave the token ids of all it sent (kind =
     * llama-server's native stream, its vocabulary the model's): a
     * spillway worker can resume from them (another llama-server too,
     * where ls_resume says so) */
    bool external_ids;
    /* n > 1: its stream interleaves several choices, which a resume (one
     * sequence) cannot continue */
    bool several_choices;
    /* kind = llama-server's native stream (external_ids): whether another
     * llama-server can take its resume, and whether a spillway worker of
     * the model is left (configured, not tried) that can */
    rt_ls_resume ls_resume;
    bool spillway_left;
    /* image content: only a llama-server with a projector takes it (no
     * spillway worker) */
    bool images;
} rt_failover_in;

typedef enum rt_action {
    RT_FO_DONE,          /* the answer is complete (or a final 4xx) */
    RT_FO_CANCEL,        /* the client left: nothing more anywhere */
    RT_FO_REQUEUE,       /* back to its place in the queue; the attempt
                            does not count against max-attempts */
    RT_FO_REPLAY,        /* from the start on the next eligible worker */
    RT_FO_RESUME,        /* after the tokens sent, same sampler draws */
    RT_FO_STOP,          /* a typed error to the client */
} rt_action;

typedef struct rt_failover {
    rt_action action;
    const char *decision;   /* the failover event's "decision" */
    const char *reason;     /* the failover event's "reason" */
    const char *error_code; /* RT_FO_STOP: the error's code */
    bool out_of_rotation;   /* the worker is suspect until /health */
    bool restart;           /* poisoned by an out-of-memory: restart it */
    bool resume_on_ls;      /* RT_FO_RESUME: a llama-server may take it too */
} rt_failover;

rt_failover rt_failover_decide(const rt_failover_in *in);

const char *rt_outcome_name(rt_outcome o);

#endif
