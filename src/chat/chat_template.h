/* chat_template.h - turning OpenAI-style chat messages into the prompt text
 * a model family was trained on, and knowing which strings end its turns.
 *
 * The worker's POST /v1/chat/completions needs this: a list of {role,
 * content} messages must become e.g. "<|im_start|>user\nHi<|im_end|>\n..."
 * for Qwen but "<s>[INST] Hi [/INST]" for Llama 2. GGUF files carry the
 * template as a Jinja program (tokenizer.chat_template); we do NOT run
 * Jinja. Instead the family is recognised by distinctive substrings of that
 * program and rendered by hand-written code that follows the family's
 * published format (docs/chat-templates.md has the formats, their sources
 * and the exact rules below at more length).
 *
 * Families and what recognises them (checked in this order, first match):
 *   "<|channel|>"                       -> ENG_CHAT_HARMONY (gpt-oss; chat_harmony.c)
 *   "<｜Assistant｜>" and "think>"       -> ENG_CHAT_DEEPSEEK_R1 (DeepSeek-R1 and its
 *                                          Qwen 2 / Llama distills)
 *   "<|im_sep|>"                        -> ENG_CHAT_PHI4    (Phi-4)
 *   "<|im_start|>" and "assistant\n<think>\n" (the Jinja source's escapes)
 *                                       -> ENG_CHAT_QWEN3_THINKING (Qwen3-*-Thinking-2507,
 *                                          QwQ: the generation prompt opens the thought)
 *   "<|im_start|>" and "<think>"        -> ENG_CHAT_QWEN3   (Qwen3: ChatML that thinks)
 *   "<|im_start|>"                      -> ENG_CHAT_CHATML  (Qwen, many fine-tunes)
 *   "<|start_header_id|>" and "Cutting Knowledge Date"
 *                                       -> ENG_CHAT_LLAMA31 (Llama 3.1-3.3: the date lines)
 *   "<|start_header_id|>"               -> ENG_CHAT_LLAMA3
 *   "<start_of_turn>"                   -> ENG_CHAT_GEMMA
 *   "[INST]" and "<<SYS>>"              -> ENG_CHAT_LLAMA2
 *   "[INST]"                            -> ENG_CHAT_MISTRAL
 *   "<|user|>" and "<|end|>"            -> ENG_CHAT_PHI3
 *   "<|user|>" and ("</s>" or "eos_token") -> ENG_CHAT_ZEPHYR
 * A missing, empty or unrecognised template falls back to ChatML, and the
 * caller is told so (is_fallback / eng_chat_source) so it can log it.
 * Llama 3.1 (ENG_CHAT_LLAMA31) is Llama 3 - what is said of Llama 3 below
 * holds for it - with a system turn always first: "Environment: ipython\n"
 * when tools are offered, "Cutting Knowledge Date: December 2023\nToday
 * Date: 15 Jan 2026\n\n" (eng_chat_options.date) and the text of a first
 * system message.
 *
 * Roles: "system", "user", "assistant", "tool" (exact, lower case).
 *   - system: ChatML, Llama 3, Zephyr, Phi-3 and Phi-4 render it as a turn of its
 *     own wherever it appears. Llama 2 (<<SYS>> block), Mistral and Gemma
 *     fold it into the first user message, so there it is allowed only as
 *     the first message and must be followed by a user message.
 *   - tool: ChatML, Qwen3 and qwen3-thinking write it as Qwen's templates
 *     do, "\n<tool_response>\n{content}\n</tool_response>" inside a user
 *     turn (results in a row share one turn); Llama 3 uses the
 *     "ipython" header of Llama 3.1's tool format; the other families have
 *     no tool role and render it exactly like a user turn (the alternation
 *     rules then count it as a user turn, which fits the usual
 *     assistant -> tool -> assistant order).
 * Alternation: Llama 2, Mistral and Gemma require, after the optional
 * system message, user, assistant, user, ... (tool counting as user), and
 * with add_generation_prompt the last message must be a user (or tool)
 * message. The other families accept any order.
 *
 * Content is inserted verbatim: no escaping, no added text. Like the
 * published Jinja templates, Llama 2, Llama 3 and Gemma trim leading and
 * trailing whitespace of each content (ASCII space, \t, \n, \v, \f, \r);
 * ChatML, Mistral, Zephyr, Phi-3 and Phi-4 do not. Gemma's folded system text is
 * not trimmed (as Gemma's template). Content ends at its first NUL byte.
 *
 * BOS rule (llama.cpp's convention for templates that write the BOS):
 * Llama 2 and Mistral ("<s>"), Llama 3 ("<|begin_of_text|>") and Gemma
 * ("<bos>") render the BOS text at the start of the prompt (Llama 2 also
 * before every later [INST]); the caller must then tokenize with special
 * parsing for those markers and must NOT add another BOS. ChatML, Zephyr,
 * Phi-3 and Phi-4 render no BOS; the caller adds one when the vocabulary asks for it.
 * eng_chat_tokenize_add_bos() encodes exactly this.
 *
 * Special tokens in content: a client can write "<|im_end|>" in a message.
 * Tokenizing the whole prompt with parse_special ON (what llama.cpp's server
 * does) turns that text into the control token, i.e. the client can forge
 * turns. eng_chat_render_segments() therefore returns which byte ranges of
 * the prompt are the template's own text and which are client content, and
 * eng_chat_tokenize() parses special tokens in the former only (its ids
 * equal llama.cpp's for content without special-token text).
 *
 * Every function here is pure (no global state): safe from any thread.
 */
#ifndef SPILLWAY_CHAT_CHAT_TEMPLATE_H
#define SPILLWAY_CHAT_CHAT_TEMPLATE_H

#include "common/error.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum eng_chat_family {
    ENG_CHAT_CHATML = 0,
    ENG_CHAT_LLAMA2 = 1,
    ENG_CHAT_LLAMA3 = 2,
    ENG_CHAT_MISTRAL = 3,
    ENG_CHAT_ZEPHYR = 4,
    ENG_CHAT_PHI3 = 5,
    ENG_CHAT_GEMMA = 6,
    ENG_CHAT_PHI4 = 7,
    ENG_CHAT_QWEN3 = 8,       /* ChatML with <think> (chat_reasoning.h) */
    ENG_CHAT_DEEPSEEK_R1 = 9, /* <｜User｜> / <｜Assistant｜>, prompt opens <think> */
    ENG_CHAT_HARMONY = 10,    /* gpt-oss: OpenAI's harmony format */
    ENG_CHAT_QWEN3_THINKING = 11, /* Qwen3 thinking-only (2507), QwQ: the prompt opens <think> */
    ENG_CHAT_LLAMA31 = 12,    /* Llama 3.1-3.3: Llama 3 with the date lines in a system turn */
} eng_chat_family;

#define ENG_CHAT_N_FAMILIES 13

/* The GGUF key holding the Jinja template. */
#define ENG_CHAT_TEMPLATE_KEY "tokenizer.chat_template"

/* Largest prompt eng_chat_render* builds (the tokenizer's own limit);
 * a conversation that would render longer is SW_ERANGE. */
#define ENG_CHAT_MAX_BYTES ((size_t)256 << 20)

/* One message. Both strings are NUL-terminated and only read. */
typedef struct eng_chat_message {
    const char *role;    /* "system", "user", "assistant" or "tool" */
    const char *content; /* must not be NULL; "" is allowed */
} eng_chat_message;

/* Stable lower-case name: "chatml", "llama2", "llama3", "mistral",
 * "zephyr", "phi3", "gemma", "phi4", "qwen3", "deepseek-r1", "harmony",
 * "qwen3-thinking", "llama3.1";
 * "unknown" for a value outside the enum. eng_chat_family_from_name also
 * takes "gpt-oss" for harmony. */
const char *eng_chat_family_name(eng_chat_family f);

/* Family by name, for the configurable override. Case-insensitive, and '-'
 * and '_' are ignored, so "Llama-3", "llama_3" and "llama3" are the same.
 * Returns SW_OK, or SW_EINVAL (NULL or unknown name; *out untouched). */
int eng_chat_family_from_name(const char *name, eng_chat_family *out);

/* Family of a Jinja template (len bytes, need not be NUL-terminated; NULL
 * or len 0 means "no template"). Never fails: an unrecognised or missing
 * template gives ENG_CHAT_CHATML with *is_fallback true (is_fallback may be
 * NULL). */
eng_chat_family eng_chat_detect(const char *jinja_template, size_t len, bool *is_fallback);

/* Same, reading tokenizer.chat_template of an open GGUF. A missing key is
 * the ChatML fallback (SW_OK, *is_fallback true). A key that is not a
 * string is SW_EFORMAT naming the key (outputs untouched); callers that
 * prefer to serve anyway may treat that as the fallback too. */
int eng_chat_detect_from_gguf(const eng_gguf *g, eng_chat_family *out, bool *is_fallback,
                              sw_error *err);

/* Where eng_chat_choose's answer came from, for the log line. */
typedef enum eng_chat_source {
    ENG_CHAT_FROM_OVERRIDE = 0,      /* the configured family name */
    ENG_CHAT_FROM_TEMPLATE = 1,      /* recognised in tokenizer.chat_template */
    ENG_CHAT_FALLBACK_MISSING = 2,   /* no template (or no gguf): ChatML */
    ENG_CHAT_FALLBACK_UNKNOWN = 3,   /* template not recognised: ChatML */
} eng_chat_source;

const char *eng_chat_source_name(eng_chat_source s); /* "override", "template",
                                                       "fallback-missing", "fallback-unknown" */

/* The worker's one call at model load: the override when override_name is
 * set (neither NULL, "" nor "auto"), else detection from g's template (g
 * may be NULL: the fallback). An unknown override name is SW_EINVAL with a
 * message listing the valid names; a non-string template key SW_EFORMAT.
 * Outputs are written only on success; source may be NULL. */
int eng_chat_choose(const eng_gguf *g, const char *override_name, eng_chat_family *out,
                    eng_chat_source *source, sw_error *err);

/* Renders msgs[0..n) in family f into a new NUL-terminated string (*out,
 * sw_free) of *out_len bytes (out_len may be NULL). add_generation_prompt
 * appends the opening of an assistant turn ("<|im_start|>assistant\n",
 * ...) so the model continues as the assistant; for Llama 2 and Mistral the
 * user turn already ends with "[/INST]", so it adds nothing there.
 * Errors (outputs untouched): SW_EINVAL with a message naming the message
 * index for n == 0, msgs NULL, an unknown family, a NULL role or content,
 * an unknown role, or a broken alternation rule (see the top of this file);
 * SW_ERANGE past ENG_CHAT_MAX_BYTES; SW_ENOMEM. */
int eng_chat_render(eng_chat_family f, const eng_chat_message *msgs, size_t n,
                    bool add_generation_prompt, char **out, size_t *out_len, sw_error *err);

/* A byte range of a rendered prompt. The ranges returned together cover
 * the text exactly, in order, without gaps or empty ranges; two adjacent
 * ranges always differ in is_template.
 *
 * How to use them: template ranges may be tokenized with parse_special ON
 * (they hold the control markers), content ranges with it OFF. Caveat:
 * tokenizing range by range is not always identical to tokenizing the whole
 * text: SPM vocabularies put a space prefix at the start of every call, and
 * BPE merges never cross a call boundary. eng_chat_tokenize() below does it
 * right: it is the way to tokenize a rendered prompt. */
typedef struct eng_chat_segment {
    size_t offset;     /* into the rendered text */
    size_t len;        /* > 0 */
    bool is_template;  /* true: the template's own text; false: client content */
} eng_chat_segment;

/* eng_chat_render plus the segments (*segments_out, sw_free; *n_segments
 * entries). On error nothing is allocated and outputs are untouched. */
int eng_chat_render_segments(eng_chat_family f, const eng_chat_message *msgs, size_t n,
                             bool add_generation_prompt, char **out, size_t *out_len,
                             eng_chat_segment **segments_out, size_t *n_segments,
                             sw_error *err);

/* ---- tools --------------------------------------------------------------
 * OpenAI tool calling needs three more things in a prompt: the tools on
 * offer, the calls an assistant turn made, and the tool results. Families
 * with a published tool format get it; the others get the generic one:
 *   - Hermes style (ChatML/Qwen 2.5, and the generic rendering for Llama 2,
 *     Mistral, Zephyr, Phi-3, Gemma, Phi-4): the tools are described in a "# Tools"
 *     section appended to the system message (a system message is added
 *     when there is none) listing each definition inside <tools></tools>,
 *     and an assistant call is written as
 *     "<tool_call>\n{\"name\": \"N\", \"arguments\": ARGS}\n</tool_call>"
 *     after the turn's text (one per call, separated by "\n");
 *   - Llama 3.1 JSON tool calling: the system message gets "You have access
 *     to the following functions..." and the definitions, a call is the
 *     turn's text {"name": "N", "parameters": ARGS}.
 *   - harmony (gpt-oss): the tools as a TypeScript-like "namespace
 *     functions" in the developer message, calls and results as messages
 *     of the commentary channel (chat_harmony.c has the details).
 * Tool results (role "tool") render as described for the roles above. The
 * tool text is client content (never parsed for special tokens). */
typedef enum eng_chat_tool_syntax {
    ENG_CHAT_TOOLS_HERMES = 0,      /* <tool_call>{"name":..,"arguments":..}</tool_call> */
    ENG_CHAT_TOOLS_LLAMA3_JSON = 1, /* {"name":..,"parameters":..} as the whole reply */
    ENG_CHAT_TOOLS_HARMONY = 2,     /* a commentary message to=functions.NAME (chat_harmony.c) */
} eng_chat_tool_syntax;

eng_chat_tool_syntax eng_chat_tool_syntax_of(eng_chat_family f);

/* One call of an assistant turn; strings are only read. */
typedef struct eng_chat_tool_call {
    const char *id;         /* may be NULL (not rendered by any family) */
    const char *name;
    const char *arguments;  /* JSON text, inserted as is */
} eng_chat_tool_call;

/* The tool parts of one message (indexed like the messages). */
typedef struct eng_chat_message_tools {
    const eng_chat_tool_call *calls; /* assistant messages only */
    size_t n_calls;
    const char *tool_call_id;        /* tool messages; may be NULL (not rendered) */
} eng_chat_message_tools;

/* eng_chat_render_segments with tools: ext (NULL, or one entry per
 * message) carries the assistant calls, tools_text (NULL or "": no tools
 * section) the definitions to offer, one JSON text per line (the worker
 * passes each tool as Python's json.dumps writes it, as the templates'
 * `tool | tojson` does: one line, ", " and ": "). Errors as
 * eng_chat_render_segments, plus SW_EINVAL for calls on a message that is
 * not an assistant message or a call without name or arguments. */
int eng_chat_render_tools(eng_chat_family f, const eng_chat_message *msgs,
                          const eng_chat_message_tools *ext, size_t n, const char *tools_text,
                          bool add_generation_prompt, char **out, size_t *out_len,
                          eng_chat_segment **segments_out, size_t *n_segments, sw_error *err);

/* ---- options ----------------------------------------------------------------
 * What a request may change in the rendering beyond the messages, as the
 * Jinja templates take it from chat_template_kwargs (llama-server, vLLM):
 *   - thinking_off (Qwen3's enable_thinking false): the generation prompt
 *     holds an empty thought, "<think>\n\n</think>\n\n", so the model
 *     answers without thinking. Other families ignore it.
 *   - reasoning_effort (harmony): "low", "medium" or "high" in the system
 *     message's "Reasoning:" line; NULL is "medium".
 *   - date (harmony, llama3.1): "YYYY-MM-DD" for harmony's "Current date:"
 *     line (the template's strftime_now; NULL leaves the line out) and
 *     Llama 3.1's "Today Date: DD Mon YYYY" (its date_string; NULL is its
 *     default, 26 Jul 2024).
 *   - reasoning (NULL, or one entry per message, NULL where none): an
 *     assistant turn's thought sent back (reasoning_content). Qwen3 and
 *     harmony show it for the turns after the last user message (a tool
 *     loop in progress), as their templates do; Qwen3 also takes a thought
 *     written inline ("<think>...</think>" in the content) there. */
typedef struct eng_chat_options {
    const char *tools_text;       /* as eng_chat_render_tools */
    bool add_generation_prompt;
    bool thinking_off;
    const char *reasoning_effort;
    const char *date;
    const char *const *reasoning;
} eng_chat_options;

/* eng_chat_render_tools with options (o may not be NULL). */
int eng_chat_render_with(eng_chat_family f, const eng_chat_message *msgs,
                         const eng_chat_message_tools *ext, size_t n, const eng_chat_options *o,
                         char **out, size_t *out_len, eng_chat_segment **segments_out,
                         size_t *n_segments, sw_error *err);

/* Tokenizes a rendered prompt (text, len and its segments from
 * eng_chat_render_segments) so that the vocabulary's CONTROL and UNKNOWN
 * tokens ("<|im_end|>", "<s>", ...) are recognised only inside template
 * segments: text a client wrote is always tokenized as plain text.
 *
 * It is eng_tokenize_spans (tokenizer.h) with special parsing on in the
 * template segments only: the same cuts eng_tokenize with parse_special
 * makes, restricted to template text, so for content that contains no
 * special-token text the ids are exactly eng_tokenize(text, len, add_bos,
 * true): llama.cpp's result. USER_DEFINED tokens are matched everywhere,
 * content included, as eng_tokenize always does. add_bos: see
 * eng_chat_tokenize_add_bos. Allocates *ids_out (sw_free; non-NULL on
 * success) holding *n_out ids.
 * Errors: SW_EINVAL (segments that do not tile the text exactly), those of
 * eng_tokenize, SW_ENOMEM. Outputs are written only on success. */
int eng_chat_tokenize(const eng_tokenizer *tok, const char *text, size_t len,
                      const eng_chat_segment *segments, size_t n_segments, bool add_bos,
                      int32_t **ids_out, size_t *n_out, sw_error *err);

/* The strings that end an assistant turn in family f, most important
 * first: "<|im_end|>" (ChatML, Qwen3, Phi-4), "<｜end▁of▁sentence｜>"
 * (DeepSeek-R1), "<|return|>" and "<|call|>" (harmony: a final answer, a
 * tool call; its "<|end|>" ends a message of the turn, not the turn),
 * "</s>" (Llama 2, Mistral, Zephyr),
 * "<|eot_id|>" and "<|eom_id|>" (Llama 3; eom ends a 3.1 tool-call turn),
 * "<|end|>" (Phi-3), "<end_of_turn>" (Gemma). The worker stops on them as
 * special tokens when the vocabulary has them (eng_token_find) and as stop
 * strings in the text otherwise; the vocabulary's own end-of-generation set
 * (eng_tokenizer_is_eog) applies in addition. Writes up to cap static
 * strings to out (out may be NULL when cap is 0) and returns how many there
 * are in total (at most ENG_CHAT_MAX_STOP_STRINGS; 0 for an unknown f). */
#define ENG_CHAT_MAX_STOP_STRINGS 4
size_t eng_chat_stop_strings(eng_chat_family f, const char **out, size_t cap);

/* The BOS text family f renders at the start of its prompt ("<s>",
 * "<|begin_of_text|>", "<bos>"), or NULL when it renders none. */
const char *eng_chat_bos_text(eng_chat_family f);

/* Whether the caller should let the tokenizer add BOS when tokenizing the
 * rendered prompt: false when the text already starts with the BOS text
 * (see the BOS rule above), else vocab_add_bos (eng_tokenizer_add_bos). */
bool eng_chat_tokenize_add_bos(eng_chat_family f, bool vocab_add_bos);

#endif
