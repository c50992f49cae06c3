/* chat_reasoning.h - a thinking model's reply split into its reasoning and
 * its answer, as llama-server's --reasoning-format deepseek does.
 *
 * Families that think write their thought in the reply itself:
 *   - Qwen3 (ENG_CHAT_QWEN3): "<think>\n...\n</think>\n\nanswer"; the model
 *     opens the thought itself (or, with enable_thinking false, the prompt
 *     holds an empty one and the reply is all answer);
 *   - DeepSeek-R1 and its Qwen 2 / Llama distills (ENG_CHAT_DEEPSEEK_R1), and
 *     the thinking-only Qwen3 / QwQ (ENG_CHAT_QWEN3_THINKING):
 *     the generation prompt ends with "<think>\n", so the reply begins in
 *     the middle of the thought and only "</think>" marks its end (a reply
 *     that writes "<think>" again first has it skipped);
 *   - gpt-oss (ENG_CHAT_HARMONY): OpenAI's harmony messages,
 *     "<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>
 *     final<|message|>..." where the analysis channel is the thought, the
 *     final channel the answer, and a commentary message addressed
 *     "to=functions.NAME" a tool call whose body is its JSON arguments
 *     (stopped by <|call|>). Harmony's markers are control tokens: the
 *     caller feeds their text (eng_token_piece) where the detokenizer gives
 *     none.
 *
 * The splitter is fed the reply's text as it is generated and returns, for
 * each piece, the reasoning and content bytes that are certain; text that
 * may still turn out to be a marker (a "</thi" at the end), or white space
 * that may end the thought, is held until the next piece decides it. What
 * comes out is a function of the text so far: the pieces' outputs
 * concatenated equal the output of the whole text in one piece, so a
 * stream's deltas add up to the non-stream answer, and a splitter fed the
 * text an interrupted stream had released continues where that stream
 * left off (a resumed stream).
 *
 * The reasoning has leading and trailing white space removed, and the
 * white space between "</think>" and the answer is dropped, as llama-server
 * does. A thought never closed (the reply cut by max_tokens) is all
 * reasoning. Pure and allocation-bounded: every buffer grows only with the
 * text fed to it, through sw_malloc.
 */
#ifndef SPILLWAY_CHAT_CHAT_REASONING_H
#define SPILLWAY_CHAT_CHAT_REASONING_H

#include "chat/chat_template.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum eng_reasoning_syntax {
    ENG_REASONING_NONE = 0,       /* the family does not think */
    ENG_REASONING_THINK = 1,      /* <think>...</think>, opened by the model */
    ENG_REASONING_THINK_OPEN = 2, /* the prompt opened <think>: </think> closes */
    ENG_REASONING_HARMONY = 3,    /* harmony channels */
} eng_reasoning_syntax;

/* The request field and worker option reasoning_format. */
typedef enum eng_reasoning_format {
    ENG_REASONING_FORMAT_AUTO = 0,     /* deepseek for families that think */
    ENG_REASONING_FORMAT_NONE = 1,     /* the thought stays in the content */
    ENG_REASONING_FORMAT_DEEPSEEK = 2, /* reasoning_content and content */
} eng_reasoning_format;

/* "auto", "none" or "deepseek" (exact); SW_EINVAL otherwise. */
int eng_reasoning_format_from_name(const char *name, eng_reasoning_format *out);
const char *eng_reasoning_format_name(eng_reasoning_format f);

/* How family f writes its thought. */
eng_reasoning_syntax eng_chat_reasoning_syntax(eng_chat_family f);

/* A growable byte string (sw_malloc); NUL-terminated when p is not NULL. */
typedef struct eng_reasoning_text {
    char *p;
    size_t len, cap;
} eng_reasoning_text;

void eng_reasoning_text_free(eng_reasoning_text *t);

/* What one push gave: bytes appended to each (the caller empties them
 * between pushes if it wants deltas). */
typedef struct eng_reasoning_delta {
    eng_reasoning_text reasoning;
    eng_reasoning_text content;
} eng_reasoning_delta;

void eng_reasoning_delta_clear(eng_reasoning_delta *d); /* empties, keeps memory */
void eng_reasoning_delta_free(eng_reasoning_delta *d);

/* A tool call of a harmony reply: the function name after "functions."
 * and the message body as generated. */
typedef struct eng_reasoning_call {
    char *name;
    eng_reasoning_text arguments;
} eng_reasoning_call;

#define ENG_REASONING_MAX_CALLS 64

typedef struct eng_reasoning {
    eng_reasoning_syntax syntax;
    int state;                      /* chat_reasoning.c */
    bool reasoning_started;         /* a non-space reasoning byte went out */
    eng_reasoning_text held;        /* undecided bytes */
    int channel;                    /* harmony: where the message body goes */
    eng_reasoning_call calls[ENG_REASONING_MAX_CALLS];
    size_t n_calls;
    bool failed;                    /* out of memory: output incomplete */
} eng_reasoning;

/* Zeroes r for syntax (ENG_REASONING_NONE: every byte is content). */
void eng_reasoning_init(eng_reasoning *r, eng_reasoning_syntax syntax);
void eng_reasoning_free(eng_reasoning *r);

/* Feeds len bytes of reply text; appends what is now certain to out.
 * SW_OK, or SW_ENOMEM (r->failed is then set and stays). */
int eng_reasoning_push(eng_reasoning *r, const char *text, size_t len, eng_reasoning_delta *out);

/* The reply ended: held bytes go where they belong (an open thought is
 * reasoning; a harmony call being written is complete). */
int eng_reasoning_finish(eng_reasoning *r, eng_reasoning_delta *out);

/* Whether the splitter is inside the thought now (for a caller that wants
 * to know where the next bytes will go). */
bool eng_reasoning_in_thought(const eng_reasoning *r);

#endif
