/* worker_request.c - turns a completions or chat body into a wk_req: every
 * field checked (typed 400s naming the parameter), chat messages rendered
 * with the model's template and tokenized, tools / tool_choice /
 * response_format or a GBNF grammar compiled into the request's
 * constraint, stop strings and the resume extension read. Runs on the HTTP thread; docs/api.md lists the
 * fields and errors produced here.
 */
#include "worker/worker-impl.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/gbnf.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WK_MAX_TOKENS_LIMIT 1000000
#define WK_MAX_STOPS 16
#define WK_MAX_STOP_BYTES 256
#define WK_MAX_LOGIT_BIAS 1024
static bool get_number(wk_parse_error *p, json_t *body, const char *key, double lo, double hi,
                       double *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v))
        return api_bad(p, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return api_bad(p, key, "'%s' must be between %g and %g", key, lo, hi);
    *out = d;
    return true;
}

static bool get_int(wk_parse_error *p, json_t *body, const char *key, json_int_t lo, json_int_t hi,
                    json_int_t *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_integer(v))
        return api_bad(p, key, "'%s' must be an integer", key);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return api_bad(p, key, "'%s' must be between %lld and %lld", key, (long long)lo,
                   (long long)hi);
    *out = i;
    return true;
}

static bool get_bool(wk_parse_error *p, json_t *body, const char *key, bool *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v))
        return api_bad(p, key, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return true;
}

/* The chat prompt in the model's own template family (api.h), and the
 * family's end-of-turn markers as stop tokens or strings. Allocates *ids
 * (sw_free). */
static bool tokenize_chat(wk_server *s, json_t *body, json_t *messages, const char *tools_text,
                          wk_req *r, wk_parse_error *p, int32_t **ids, size_t *n_ids)
{
    api_chat_messages m;
    memset(&m, 0, sizeof m);
    eng_chat_options o;
    memset(&o, 0, sizeof o);
    char date[11];
    bool ok = api_chat_options_parse(body, &o, date, p);
    o.tools_text = tools_text;
    ok = ok && api_chat_messages_parse(messages, &m, p) &&
         api_chat_tokenize(s->tok, s->chat_family, &m, &o, ids, n_ids, p);
    api_chat_messages_free(&m);
    if (!ok)
        return false;
    /* The family's end-of-turn markers: a token when the vocabulary has
     * one, else a stop string. */
    const char *stops[ENG_CHAT_MAX_STOP_STRINGS];
    size_t n_stops = eng_chat_stop_strings(s->chat_family, stops, ENG_CHAT_MAX_STOP_STRINGS);
    for (size_t i = 0; i < n_stops && i < ENG_CHAT_MAX_STOP_STRINGS; i++) {
        int32_t id = eng_token_find(s->tok, stops[i], strlen(stops[i]));
        if (id >= 0 && r->n_stop_tokens < WK_MAX_STOP_TOKENS)
            r->stop_tokens[r->n_stop_tokens++] = id;
        else if (id < 0 && r->n_stops < WK_MAX_STOPS + ENG_CHAT_MAX_STOP_STRINGS) {
            /* a NULL entry would reach strlen in the stop check */
            if (!(r->stops[r->n_stops] = sw_strdup(stops[i]))) {
                sw_free(*ids);
                *ids = NULL;
                return api_oom(p);
            }
            r->n_stops++;
        }
    }
    return true;
}

/* ---- tools, tool_choice, response_format ------------------------------- */

/* A schema compile error as a 400; out of memory while compiling is the
 * worker's 500 internal_error "out of memory" (as the HTTP thread answers
 * every request that lost an allocation), never a 400 that blames the
 * schema. */
static bool bad_schema(wk_parse_error *p, const char *param, int rc, const sw_error *err)
{
    if (rc == SW_ENOMEM)
        return api_oom(p);
    p->status = 400;
    p->code = rc == SW_EUNSUPPORTED ? "unsupported_schema" : "invalid_request";
    return api_bad(p, param, "%s", err->message);
}

/* Sets r->output, r->grammar and r->tool_names from tools, tool_choice and
 * response_format; *tools_text (sw_free) receives the definitions to put
 * in the prompt (NULL: none). */
static bool parse_tools(json_t *body, bool chat, wk_req *r, wk_parse_error *p, char **tools_text)
{
    json_t *rf = json_object_get(body, "response_format");
    eng_grammar_tool gt[API_MAX_TOOLS];
    api_tools t;
    sw_error err;
    int rc;

    *tools_text = NULL;
    r->output = WK_OUT_TEXT;
    if (!api_tools_parse(body, chat, &t, p)) {
        api_tools_free(&t);
        return false;
    }
    if (t.n && !(r->tool_names = sw_calloc(t.n, sizeof *r->tool_names))) {
        api_tools_free(&t);
        return api_oom(p);
    }
    for (size_t i = 0; i < t.n; i++) {
        if (!(r->tool_names[i] = sw_strdup(t.names[i]))) {
            api_tools_free(&t);
            return api_oom(p);
        }
        r->n_tools++;
        gt[i].name = t.names[i];
        gt[i].parameters = t.parameters[i];
    }
    *tools_text = t.text; /* now the caller's */
    t.text = NULL;

    /* response_format: {"type": "text" | "json_object" | "json_schema",
     * "json_schema": {"name", "schema", "strict", "description"}}. */
    eng_grammar *json_g = NULL;
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type)
            return api_bad(p, "response_format", "'response_format' must be an object with a 'type'");
        if (strcmp(type, "json_object") == 0) {
            if ((rc = eng_grammar_json_object(&json_g, &err)))
                return rc == SW_ENOMEM ? api_oom(p) : api_bad(p, NULL, "%s", err.message);
        } else if (strcmp(type, "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema");
            json_t *strict = json_object_get(js, "strict");
            /* name is OpenAI's label for the schema: optional here, as in
             * llama-server and vLLM (nothing reads it) */
            if (!json_is_object(js) || (name && !json_is_string(name) && !json_is_null(name)) ||
                (schema && !json_is_object(schema) && !json_is_boolean(schema)) ||
                (strict && !json_is_boolean(strict) && !json_is_null(strict)))
                return api_bad(p, "response_format",
                           "'response_format.json_schema' must be {\"name\": string, "
                           "\"schema\": object, \"strict\": boolean} (name optional)");
            rc = schema ? eng_grammar_from_schema(schema, &json_g, &err)
                        : eng_grammar_json_object(&json_g, &err);
            if (rc)
                return bad_schema(p, "response_format", rc, &err);
        } else if (strcmp(type, "text") != 0) {
            return api_bad(p, "response_format", "unknown response_format type '%.32s' (text, "
                       "json_object or json_schema)", type);
        }
    }

    if (t.choice == API_CHOICE_REQUIRED || t.choice == API_CHOICE_NAMED) {
        eng_grammar_free(json_g);
        rc = t.choice == API_CHOICE_NAMED ? eng_grammar_tool_call(&gt[t.named], 1, &r->grammar, &err)
                                  : eng_grammar_tool_call(gt, r->n_tools, &r->grammar, &err);
        if (rc)
            return bad_schema(p, "tools", rc, &err);
        r->output = WK_OUT_TOOL_FORCED;
    } else if (json_g) {
        r->grammar = json_g;
        r->output = WK_OUT_JSON;
    } else if (t.choice == API_CHOICE_AUTO) {
        r->output = WK_OUT_TOOL_AUTO;
    }
    if (r->output == WK_OUT_TEXT || r->output == WK_OUT_JSON) {
        sw_free(*tools_text); /* not offered (api_tools_in_prompt) */
        *tools_text = NULL;
    }
    return true;
}

/* grammar: a GBNF grammar (llama-server's field and syntax) compiled into
 * the request's constraint, like a JSON schema; with a JSON
 * response_format or offered tools it would be a second constraint, so
 * it is refused there. An empty string is no grammar (as llama-server). */
static bool parse_grammar(json_t *body, wk_req *r, wk_parse_error *p)
{
    json_t *gr = json_object_get(body, "grammar");
    if (!gr || json_is_null(gr))
        return true;
    if (!json_is_string(gr))
        return api_bad(p, "grammar", "'grammar' must be a string (GBNF)");
    if (json_string_length(gr) == 0)
        return true;
    if (r->output == WK_OUT_JSON)
        return api_bad(p, "grammar", "'grammar' cannot be combined with a JSON response_format");
    if (r->output != WK_OUT_TEXT)
        return api_bad(p, "grammar", "'grammar' cannot be combined with tools (unless tool_choice "
                                 "is \"none\")");
    sw_error err;
    int rc = eng_grammar_from_gbnf(json_string_value(gr), json_string_length(gr), &r->grammar,
                                   &err);
    if (rc)
        return rc == SW_ENOMEM ? api_oom(p) : api_bad(p, "grammar", "%s", err.message);
    r->output = WK_OUT_GRAMMAR;
    return true;
}

static bool add_stop(wk_parse_error *p, wk_req *r, const char *text, size_t len)
{
    if (len == 0)
        return api_bad(p, "stop", "stop strings must not be empty");
    if (memchr(text, '\0', len))
        return api_bad(p, "stop", "stop strings must not contain NUL");
    if (len > WK_MAX_STOP_BYTES || r->n_stops >= WK_MAX_STOPS)
        return api_bad(p, "stop", "at most %d stop strings of at most %d bytes", WK_MAX_STOPS,
                   WK_MAX_STOP_BYTES);
    char *copy = sw_strndup(text, len);
    if (!copy)
        return api_oom(p);
    r->stops[r->n_stops++] = copy;
    return true;
}

/* The constraint of a JSON or forced-tool reply, with the resumed tokens
 * fed through it, the budget check, and a streamed tool reply's progress
 * as of the resumed text. */
static bool setup_output(wk_server *s, wk_req *r, wk_parse_error *p)
{
    sw_error err;
    /* A tool reply is judged on its whole text: a resumed one starts from
     * the resumed tokens' text (as the engine's detokenizer does). */
    bool tool_reply = r->chat && (r->output == WK_OUT_TOOL_FORCED || r->output == WK_OUT_TOOL_AUTO);
    if (r->grammar) {
        int rc = eng_constraint_create(r->grammar, s->cs_vocab, &r->cons, &err);
        if (rc)
            return rc == SW_ENOMEM ? api_oom(p) : api_bad(p, NULL, "%s", err.message);
        for (int32_t i = r->n_prompt - r->n_resume; i < r->n_prompt; i++)
            if (!eng_constraint_accept_token(r->cons, r->prompt[i]))
                return api_bad(p, "resume", "the resumed tokens do not fit the response format");
        int64_t need = eng_constraint_min_bytes(r->cons);
        int64_t room = (int64_t)s->n_ctx - r->n_prompt;
        int64_t avail = r->max_tokens < room ? r->max_tokens : room;
        if (need > avail)
            return api_bad(p, r->max_tokens < room ? "max_tokens" : r->chat ? "messages" : "prompt",
                       "the %s needs at least %lld more tokens; %lld are left (max_tokens and "
                       "the context)", r->output == WK_OUT_TOOL_FORCED ? "tool call"
                                      : r->output == WK_OUT_GRAMMAR ? "grammar"
                                                                    : "response format",
                       (long long)need, (long long)avail);
    }
    /* a split reply's tool text is its content: the splitter's output */
    if (!wk__reasoning_resume(s, r, tool_reply))
        return api_oom(p);
    if (tool_reply && r->n_resume > 0) {
        eng_detok d;
        eng_detok_reset(&d);
        size_t cap = eng_detok_max_bytes(s->tok);
        char *buf = sw_malloc(cap);
        if (!buf)
            return api_oom(p);
        for (int32_t i = r->n_prompt - r->n_resume; i < r->n_prompt && !r->split; i++)
            wk__text_append(r, buf, eng_detok_push(s->tok, &d, r->prompt[i], buf, cap));
        sw_free(buf);
        if (r->output == WK_OUT_TOOL_FORCED) {
            char name[96];
            size_t start = wk__forced_args_start(r->text, r->text_len, name, sizeof name);
            r->ts.header_sent = start > 0;
            r->ts.args_sent = start ? wk__forced_args_ready(r->text, r->text_len, start) : 0;
        } else {
            r->ts.auto_mode = wk__auto_state(r);
        }
    }
    return true;
}

/* OpenAI's logit_bias: {"token id": bias, ...}, the id a decimal string
 * below the vocabulary size, the bias a number in [-100, 100]. */
static bool parse_logit_bias(wk_server *s, json_t *body, wk_req *r, wk_parse_error *p)
{
    json_t *v = json_object_get(body, "logit_bias"), *bias;
    const char *key;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_object(v))
        return api_bad(p, "logit_bias", "'logit_bias' must be an object of token ids to numbers");
    size_t n = json_object_size(v);
    if (n > WK_MAX_LOGIT_BIAS)
        return api_bad(p, "logit_bias", "'logit_bias' has %zu entries, at most %d are accepted", n,
                   WK_MAX_LOGIT_BIAS);
    if (n == 0)
        return true;
    r->bias_ids = sw_malloc(sizeof *r->bias_ids * n);
    r->bias_values = sw_malloc(sizeof *r->bias_values * n);
    if (!r->bias_ids || !r->bias_values)
        return api_oom(p);
    const int32_t n_vocab = eng_tokenizer_n_vocab(s->tok);
    int32_t k = 0;
    json_object_foreach(v, key, bias) {
        char *end = NULL;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id >= n_vocab || key[0] == '+' ||
            (key[0] == '0' && key[1]))
            return api_bad(p, "logit_bias", "'logit_bias' keys must be token ids below %d, not '%.32s'",
                       n_vocab, key);
        double d = json_is_number(bias) ? json_number_value(bias) : NAN;
        if (!isfinite(d) || d < -100 || d > 100)
            return api_bad(p, "logit_bias", "'logit_bias' values must be numbers from -100 to 100");
        r->bias_ids[k] = (int32_t)id;
        r->bias_values[k++] = (float)d;
    }
    r->sampling.bias_ids = r->bias_ids;
    r->sampling.bias_values = r->bias_values;
    r->sampling.n_bias = k;
    return true;
}

/* Builds a request from a completions / chat body; false (and p filled)
 * when the body is not acceptable. */
/* ---- NUL in strings ------------------------------------------------------
 * JSON may write \u0000 in a string, and the body is parsed to keep it.
 * The prompt and the grammar are handled with their lengths, and so are
 * the data of a JSON schema (const, enum, default, examples, pattern, and
 * the annotations); everywhere else a string is used as a C string (a
 * name, a role, a message the template renders), where a NUL would cut it
 * short without a word, so there it is a 400 naming the field. */

static bool schema_data_key(const char *k)
{
    static const char *const keys[] = {"const",       "enum",  "default",  "examples", "pattern",
                                       "description", "title", "$comment", NULL};
    for (int i = 0; keys[i]; i++)
        if (strcmp(k, keys[i]) == 0)
            return true;
    return false;
}

/* No string under v holds a NUL; in a schema, its data are not looked at. */
static bool nul_free(json_t *v, bool schema, int depth)
{
    const char *k;
    json_t *e;
    size_t i;
    if (depth > 256)
        return false; /* not from a body the parser took */
    if (json_is_string(v)) /* a number past 64 bits is no string (json_big.h) */
        return sw_json_big_text(v) || !memchr(json_string_value(v), 0, json_string_length(v));
    json_array_foreach(v, i, e) {
        if (!nul_free(e, schema, depth + 1))
            return false;
    }
    json_object_foreach(v, k, e) {
        if ((!schema || !schema_data_key(k)) && !nul_free(e, schema, depth + 1))
            return false;
    }
    return true;
}

/* No NUL under v but in the schema at the end of path (member names, one
 * level each: {"json_schema", "schema"}), whose data may hold them. */
static bool nul_free_path(json_t *v, const char *const *path, int depth)
{
    const char *k;
    json_t *e;
    if (!*path || !json_is_object(v))
        return nul_free(v, !*path, depth);
    json_object_foreach(v, k, e) {
        if (!(strcmp(k, *path) == 0 ? nul_free_path(e, path + 1, depth + 1)
                                    : nul_free(e, false, depth + 1)))
            return false;
    }
    return true;
}

/* The top-level field with a NUL where none may be, or NULL. */
static const char *nul_field(json_t *body)
{
    static const char *const rf_schema[] = {"json_schema", "schema", NULL};
    static const char *const tool_schema[] = {"function", "parameters", NULL};
    const char *k;
    json_t *v, *e;
    size_t i;
    json_object_foreach(body, k, v) {
        bool ok = true;
        if (strcmp(k, "prompt") == 0 || strcmp(k, "grammar") == 0)
            continue;
        if (strcmp(k, "response_format") == 0) {
            ok = nul_free_path(v, rf_schema, 1);
        } else if (strcmp(k, "tools") == 0 && json_is_array(v)) {
            json_array_foreach(v, i, e) {
                if (ok)
                    ok = nul_free_path(e, tool_schema, 2);
            }
        } else {
            ok = nul_free(v, false, 1);
        }
        if (!ok)
            return k;
    }
    return NULL;
}

bool wk__parse_request(wk_server *s, json_t *body, bool chat, wk_req *r, wk_parse_error *p)
{
    json_t *v;
    double d;
    json_int_t i;
    bool add_bos = eng_tokenizer_add_bos(s->tok);

    if (!json_is_object(body))
        return api_bad(p, NULL, "the body must be a JSON object");
    const char *big_at = sw_json_big_field(body);
    if (big_at)
        return api_bad(p, big_at, "'%.64s' has a number outside what is supported exactly (integers "
                   "within 64 bits, reals within a double's range); such numbers are taken only "
                   "in a JSON schema (response_format, a tool's parameters)", big_at);
    const char *nul_at = nul_field(body);
    if (nul_at)
        return api_bad(p, nul_at, "'%.64s' has a string with a NUL character (\\u0000): allowed only "
                   "in 'prompt', 'grammar' and the values of a JSON schema (const, enum, "
                   "default, examples, pattern)", nul_at);
    v = json_object_get(body, "model");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return api_bad(p, "model", "'model' must be a string");
        const char *m = json_string_value(v);
        if (!wk__model_name_is(s, m)) {
            p->status = 404;
            p->code = "model_not_found";
            return api_bad(p, "model", "this worker serves '%s', not '%s'", s->model_id, m);
        }
    }
    json_int_t n = 1;
    if (!get_int(p, body, "n", 1, WK_MAX_CHOICES, &n)) {
        snprintf(p->msg, sizeof p->msg, "'n' must be 1..%d (choices in one answer)",
                 WK_MAX_CHOICES);
        return false;
    }
    r->n_choices = (int32_t)n;
    /* Completions options that change what the answer means: refused
     * rather than ignored, so a client never reads an answer to a question
     * it did not ask. */
    bool echo = false;
    if (!chat) {
        json_int_t best_of = 1;
        json_t *suffix = json_object_get(body, "suffix");
        if (!get_bool(p, body, "echo", &echo))
            return false;
        if (!get_int(p, body, "best_of", 1, 1, &best_of)) {
            snprintf(p->msg, sizeof p->msg, "only best_of = 1 is supported");
            return false;
        }
        if (suffix && !json_is_null(suffix) &&
            !(json_is_string(suffix) && json_string_length(suffix) == 0))
            return api_bad(p, "suffix", "'suffix' (insertion) is not supported");
    }
    json_int_t max_tokens = 16;
    if (chat)
        max_tokens = s->n_ctx;
    if (!get_int(p, body, "max_tokens", 0, WK_MAX_TOKENS_LIMIT, &max_tokens) ||
        !get_int(p, body, "max_completion_tokens", 0, WK_MAX_TOKENS_LIMIT, &max_tokens))
        return false;
    r->max_tokens = (int32_t)max_tokens;

    r->sampling = eng_sampler_default_params();
    r->cache_prompt = true;
    r->sampling.temperature = 1.0f;
    r->sampling.top_p = 1.0f;
    r->sampling.top_k = 0;
    r->sampling.min_p = 0.0f;
    d = r->sampling.temperature;
    if (!get_number(p, body, "temperature", 0, 100, &d))
        return false;
    r->sampling.temperature = (float)d;
    d = r->sampling.top_p;
    if (!get_number(p, body, "top_p", 0, 1, &d))
        return false;
    r->sampling.top_p = (float)d;
    d = r->sampling.min_p;
    if (!get_number(p, body, "min_p", 0, 1, &d))
        return false;
    r->sampling.min_p = (float)d;
    i = r->sampling.top_k;
    if (!get_int(p, body, "top_k", 0, 1 << 24, &i))
        return false;
    r->sampling.top_k = (int32_t)i;
    d = 0;
    if (!get_number(p, body, "presence_penalty", -2, 2, &d))
        return false;
    r->sampling.presence_penalty = (float)d;
    d = 0;
    if (!get_number(p, body, "frequency_penalty", -2, 2, &d))
        return false;
    r->sampling.frequency_penalty = (float)d;
    d = 1;
    if (!get_number(p, body, "repeat_penalty", 0, 10, &d))
        return false;
    r->sampling.repeat_penalty = (float)d;
    i = r->sampling.penalty_last_n;
    if (!get_int(p, body, "repeat_last_n", -1, 1 << 24, &i))
        return false;
    r->sampling.penalty_last_n = (int32_t)i;
    if (!parse_logit_bias(s, body, r, p))
        return false;
    v = json_object_get(body, "seed");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return api_bad(p, "seed", "'seed' must be an integer");
        r->sampling.seed = (uint64_t)json_integer_value(v);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->sampling.seed = ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_sec ^
                           (s->next_id << 20);
        r->sampling.seed &= 0x7FFFFFFFFFFFFFFFull; /* fits a JSON integer */
    }
    if (!get_bool(p, body, "stream", &r->stream) || !get_bool(p, body, "ignore_eos", &r->ignore_eos) ||
        !get_bool(p, body, "cache_prompt", &r->cache_prompt))
        return false;
    v = json_object_get(body, "stream_options");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v))
            return api_bad(p, "stream_options", "'stream_options' must be an object");
        if (!get_bool(p, v, "include_usage", &r->include_usage))
            return false;
    }
    /* logprobs: chat has a boolean and top_logprobs; completions an integer. */
    v = json_object_get(body, "logprobs");
    if (chat) {
        if (!get_bool(p, body, "logprobs", &r->logprobs))
            return false;
        i = 0;
        if (!get_int(p, body, "top_logprobs", 0, ENG_MAX_TOP_LOGPROBS, &i))
            return false;
        r->top_logprobs = (int32_t)i;
        if (r->top_logprobs && !r->logprobs)
            return api_bad(p, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else if (v && !json_is_null(v)) {
        i = 0;
        if (!get_int(p, body, "logprobs", 0, ENG_MAX_TOP_LOGPROBS, &i))
            return false;
        r->logprobs = true;
        r->top_logprobs = (int32_t)i;
        /* OpenAI then gives the prompt tokens' log-probabilities too:
         * refused rather than answered without them */
        if (echo)
            return api_bad(p, "echo", "'echo' with 'logprobs' (the prompt tokens' "
                                      "log-probabilities) is not supported");
    }
    /* stop: a string or an array of strings. */
    r->stops = sw_calloc(WK_MAX_STOPS + ENG_CHAT_MAX_STOP_STRINGS, sizeof(char *));
    if (!r->stops)
        return api_oom(p);
    v = json_object_get(body, "stop");
    if (json_is_string(v)) {
        if (!add_stop(p, r, json_string_value(v), json_string_length(v)))
            return false;
    } else if (json_is_array(v)) {
        size_t k;
        json_t *e;
        json_array_foreach(v, k, e) {
            if (!json_is_string(e))
                return api_bad(p, "stop", "'stop' must be a string or an array of strings");
            if (!add_stop(p, r, json_string_value(e), json_string_length(e)))
                return false;
        }
    } else if (v && !json_is_null(v)) {
        return api_bad(p, "stop", "'stop' must be a string or an array of strings");
    }

    /* The prompt. */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (chat) {
        json_t *m = json_object_get(body, "messages");
        if (!json_is_array(m) || json_array_size(m) == 0)
            return api_bad(p, "messages", "'messages' must be a non-empty array");
        char *tools_text = NULL;
        bool ok = parse_tools(body, chat, r, p, &tools_text) && parse_grammar(body, r, p) &&
                  tokenize_chat(s, body, m, tools_text, r, p, &ids, &n_ids);
        sw_free(tools_text);
        if (!ok)
            return false;
        r->tool_syntax = eng_chat_tool_syntax_of(s->chat_family);
    } else {
        v = json_object_get(body, "prompt");
        /* one prompt: a string, token ids, or a one-element array of either */
        if (json_is_array(v) && json_array_size(v) == 1 &&
            (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
            v = json_array_get(v, 0);
        bool token_ids = json_is_array(v) && json_array_size(v) > 0 &&
                         json_is_integer(json_array_get(v, 0));
        if (!json_is_string(v) && !token_ids)
            return api_bad(p, "prompt", "'prompt' must be a string or an array of token ids (one "
                                    "prompt per request)");
        char *tools_text = NULL;
        if (!parse_tools(body, chat, r, p, &tools_text))
            return false;
        sw_free(tools_text);
        if (!parse_grammar(body, r, p))
            return false;
        sw_error err;
        if (echo && !token_ids && !(r->echo = sw_strndup(json_string_value(v),
                                                          json_string_length(v))))
            return api_oom(p);
        r->echo_len = r->echo ? json_string_length(v) : 0;
        if (token_ids) {
            /* OpenAI: token ids are the prompt as given (no BOS added) */
            const int32_t n_vocab = eng_tokenizer_n_vocab(s->tok);
            n_ids = json_array_size(v);
            if (n_ids > (size_t)WK_MAX_TOKENS_LIMIT)
                return api_bad(p, "prompt", "the prompt has more than %d token ids",
                           WK_MAX_TOKENS_LIMIT);
            if (!(ids = sw_malloc(sizeof *ids * n_ids)))
                return api_oom(p);
            for (size_t k = 0; k < n_ids; k++) {
                json_t *t = json_array_get(v, k);
                if (!json_is_integer(t) || json_integer_value(t) < 0 ||
                    json_integer_value(t) >= n_vocab) {
                    sw_free(ids);
                    return api_bad(p, "prompt", "'prompt' token ids must be integers below %d",
                               n_vocab);
                }
                ids[k] = (int32_t)json_integer_value(t);
            }
        } else {
            int rc = eng_tokenize(s->tok, json_string_value(v), json_string_length(v), add_bos,
                                  false, &ids, &n_ids, &err);
            if (rc)
                return rc == SW_ENOMEM ? api_oom(p)
                                       : api_bad(p, "prompt", "cannot tokenize the prompt: %s",
                                                 err.message);
        }
    }
    if (n_ids == 0) {
        sw_free(ids);
        return api_bad(p, chat ? "messages" : "prompt", "the prompt is empty");
    }
    if (echo && !r->echo && !(r->echo = eng_detokenize_ex(s->tok, ids, n_ids, true,
                                                         &r->echo_len))) {
        sw_free(ids); /* the echo of token ids: their text */
        return api_oom(p);
    }

    /* resume: {"tokens": [ids already emitted], "draws": k, "text_bytes": n} */
    json_t *res = json_object_get(body, "resume");
    size_t n_res = 0;
    r->skip_draws = 0;
    r->resume_text_bytes = -1;
    if (res && !json_is_null(res) && r->n_choices > 1) {
        sw_free(ids);
        return api_bad(p, "resume", "'resume' continues one choice: n must be 1");
    }
    if (res && !json_is_null(res)) {
        json_t *toks = json_object_get(res, "tokens");
        if (!json_is_object(res) || !json_is_array(toks)) {
            sw_free(ids);
            return api_bad(p, "resume", "'resume' must be {\"tokens\": [ids], \"draws\": k}");
        }
        n_res = json_array_size(toks);
        r->skip_draws = n_res;
        json_t *dr = json_object_get(res, "draws");
        if (dr && !json_is_null(dr)) {
            if (!json_is_integer(dr) || json_integer_value(dr) < 0) {
                sw_free(ids);
                return api_bad(p, "resume", "'resume.draws' must be a non-negative integer");
            }
            r->skip_draws = (uint64_t)json_integer_value(dr);
        }
        json_t *tb = json_object_get(res, "text_bytes");
        if (tb && !json_is_null(tb)) {
            if (!json_is_integer(tb) || json_integer_value(tb) < 0) {
                sw_free(ids);
                return api_bad(p, "resume", "'resume.text_bytes' must be a non-negative integer");
            }
            r->resume_text_bytes = (int64_t)json_integer_value(tb);
        }
    }
    /* The context holds the prompt and the generated tokens together: a
     * client's prompt that fills it leaves no room for one (a resumed
     * stream's tokens that fill it end the stream with "length"). The
     * message counts the prompt alone, resumed tokens apart. */
    if (n_ids + n_res > (size_t)s->n_ctx ||
        (n_res == 0 && n_ids == (size_t)s->n_ctx && r->max_tokens > 0)) {
        sw_free(ids);
        p->status = 400;
        p->code = "context_length_exceeded";
        if (n_res > 0)
            return api_bad(p, chat ? "messages" : "prompt",
                           "the prompt has %zu tokens and the resumed stream %zu more: %zu, over "
                           "the context of %d tokens",
                           n_ids, n_res, n_ids + n_res, s->n_ctx);
        return api_bad(p, chat ? "messages" : "prompt",
                       "the prompt has %zu tokens: %s the context of %d tokens, which holds the "
                       "prompt and the completion together",
                       n_ids,
                       n_ids > (size_t)s->n_ctx ? "more than" : "no completion token fits in",
                       s->n_ctx);
    }
    r->prompt = sw_malloc((n_ids + n_res) * sizeof(int32_t));
    if (!r->prompt) {
        sw_free(ids);
        return api_oom(p);
    }
    memcpy(r->prompt, ids, n_ids * sizeof(int32_t));
    sw_free(ids);
    int32_t n_vocab = eng_tokenizer_n_vocab(s->tok);
    for (size_t k = 0; k < n_res; k++) {
        json_t *t = json_array_get(json_object_get(res, "tokens"), k);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return api_bad(p, "resume", "'resume.tokens' must be token ids below %d", n_vocab);
        r->prompt[n_ids + k] = (int32_t)json_integer_value(t);
    }
    r->n_prompt = (int32_t)(n_ids + n_res);
    r->n_prompt_client = (int32_t)n_ids;
    r->n_resume = (int32_t)n_res;
    /* the client's text count of an echoed stream (the router's) starts
     * with the echo, which a resumed stream does not send again */
    if (r->echo && n_res > 0 && r->resume_text_bytes >= 0)
        r->resume_text_bytes = r->resume_text_bytes > (int64_t)r->echo_len
                                   ? r->resume_text_bytes - (int64_t)r->echo_len
                                   : 0;
    r->chat = chat;
    if (!wk__reasoning_setup(s, body, r, p))
        return false;
    return setup_output(s, r, p);
}
