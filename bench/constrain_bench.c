/* constrain_bench.c - what structured output costs on a real vocabulary:
 * the vocabulary index, compiling a large JSON schema (and a GBNF
 * grammar), and the token mask per generated token. Prints figures,
 * asserts nothing (bench/constrain.sh builds and runs it).
 *
 *   constrain_bench VOCAB.gguf SCHEMA.json [WALKS [TOKENS]]
 *
 * Masks are timed along seeded random walks: at each step the mask of the
 * current state is computed (timed) and one allowed token is taken, the
 * end token whenever it is allowed, else a uniform pick, so the walk goes
 * through every kind of position (keys, enums, bounded numbers, patterns,
 * free strings) until the value closes or TOKENS run out (the budget keeps
 * every walk completable). The distribution over all masks is printed:
 * mean, median, 90th, 99th percentile and the worst, in wall-clock time and
 * in the thread's CPU time. BENCH_MASK_HASH=1 also prints a hash of each
 * walk's masks (two builds whose hashes agree computed the same masks).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "common/alloc.h"
#include "grammar/constrain.h"
#include "grammar/gbnf.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "grammar/json_schema.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A JSON grammar in GBNF, the kind llama.cpp users send. */
static const char *const json_gbnf =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
    "[0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
    "[1-9]{0,15})? ws\n"
    "ws     ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

typedef struct series {
    double *ms;
    size_t n, cap;
} series;

/* The thread's CPU time in seconds: the mask's own work, without the time
 * the thread waited for a core (the shared machine is often loaded several
 * times over, and wall-clock percentiles then measure the scheduler). */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* BENCH_SLOW_MS=x prints the text before each mask slower than x ms (CPU). */
static double g_slow_ms = -1;
/* BENCH_MASK_HASH=1 prints a hash of every mask of each walk, so two builds
 * can be compared for identical masks. */
static bool g_hash;
static double g_create_ms; /* CPU time creating the walks' constraints */
/* BENCH_REPEAT=r runs each walk r times (the same masks: the walks are
 * seeded) and keeps each mask's least time: on the shared VM a thread's
 * CPU time also counts the moments its virtual CPU was taken away (no
 * steal time is reported), so a single run's worst masks are often such
 * moments, not work. Each run starts a fresh constraint. */
static int g_repeats = 1;
static bool g_last_repeat = true;
static const eng_tokenizer *g_tok;

static void series_add(series *s, double ms)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->ms = realloc(s->ms, s->cap * sizeof *s->ms);
        if (!s->ms) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    s->ms[s->n++] = ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void series_print(const char *what, series *s)
{
    if (s->n == 0)
        return;
    qsort(s->ms, s->n, sizeof *s->ms, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->ms[i];
    printf("  %-34s %7zu masks  mean %.3f ms  p50 %.3f  p90 %.3f  p99 %.3f  max %.3f\n", what,
           s->n, sum / (double)s->n, s->ms[s->n / 2], s->ms[s->n * 9 / 10],
           s->ms[s->n * 99 / 100], s->ms[s->n - 1]);
}

static uint64_t rng_step(uint64_t *x)
{
    *x += 0x9E3779B97F4A7C15ull;
    uint64_t z = *x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One seeded walk; its masks' times go into wall_ms and cpu_ms (one per
 * mask, at most `tokens`; a repeat keeps the smaller). Returns the masks
 * computed. */
static int walk(const eng_grammar *g, const eng_cs_vocab *v, uint64_t seed, int64_t tokens,
                bool repeat, double *wall_ms, double *cpu_ms_at)
{
    char text[8192];
    size_t text_len = 0;
    uint64_t seed0 = seed;
    eng_constraint *c = NULL;
    double c0 = cpu_seconds();
    if (eng_constraint_create(g, v, &c, NULL))
        return -1;
    g_create_ms += (cpu_seconds() - c0) * 1e3;
    int32_t n_tok = eng_cs_vocab_n_tokens(v);
    uint32_t *mask = sw_malloc(((size_t)n_tok + 31) / 32 * sizeof *mask);
    int taken = 0, n_masks = 0;
    uint64_t hash = 14695981039346656037ull;
    for (int64_t left = tokens; left > 0 && mask; left--) {
        double t0 = eng_now_seconds(), c0 = cpu_seconds();
        int32_t allowed = eng_constraint_mask(c, left, mask);
        double cpu_ms = (cpu_seconds() - c0) * 1e3, ms = (eng_now_seconds() - t0) * 1e3;
        if (!repeat || ms < wall_ms[n_masks])
            wall_ms[n_masks] = ms;
        if (!repeat || cpu_ms < cpu_ms_at[n_masks])
            cpu_ms_at[n_masks] = cpu_ms;
        cpu_ms = cpu_ms_at[n_masks++];
        if (g_slow_ms >= 0 && cpu_ms > g_slow_ms && g_last_repeat)
            printf("    slow mask %.3f ms (%d allowed) after: %.*s\n", cpu_ms, allowed,
                   (int)(text_len < 300 ? text_len : 300),
                   text + (text_len < 300 ? 0 : text_len - 300));
        for (int32_t w = 0; g_hash && w < (n_tok + 31) / 32; w++)
            hash = (hash ^ mask[w]) * 1099511628211ull;
        if (allowed <= 0)
            break;
        int32_t pick = (int32_t)(rng_step(&seed) % (uint64_t)allowed), id = -1, end = -1;
        for (int32_t w = 0; w < (n_tok + 31) / 32; w++) {
            for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
                int32_t t = w * 32 + __builtin_ctz(bits);
                if (eng_constraint_is_end_token(c, t))
                    end = t;
                if (pick-- == 0)
                    id = t;
            }
        }
        if (end >= 0 || id < 0)
            break; /* complete: the walk ends as generation would */
        eng_constraint_accept_token(c, id);
        char piece[512];
        size_t n_piece = eng_token_to_bytes(g_tok, id, piece, sizeof piece);
        if (n_piece <= sizeof piece && text_len + n_piece < sizeof text) {
            memcpy(text + text_len, piece, n_piece);
            text_len += n_piece;
        }
        taken++;
        if (eng_constraint_is_closed(c))
            break;
    }
    if (g_hash && !repeat)
        printf("    walk %llu: %d tokens, masks hash %016llx\n", (unsigned long long)seed0, taken,
               (unsigned long long)hash);
    sw_free(mask);
    eng_constraint_free(c);
    return n_masks;
}

static void walks(const char *what, const eng_grammar *g, const eng_cs_vocab *v, int n_walks,
                  int64_t tokens)
{
    series s = {0}, cpu = {0};
    long total = 0;
    g_create_ms = 0;
    double *wall_ms = malloc((size_t)tokens * sizeof *wall_ms);
    double *cpu_ms = malloc((size_t)tokens * sizeof *cpu_ms);
    if (!wall_ms || !cpu_ms) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int i = 0; i < n_walks; i++) {
        int n = 0;
        for (int r = 0; r < g_repeats; r++) {
            g_last_repeat = r == g_repeats - 1;
            n = walk(g, v, 1000 + (uint64_t)i, tokens, r > 0, wall_ms, cpu_ms);
        }
        for (int k = 0; k < n; k++) {
            series_add(&s, wall_ms[k]);
            series_add(&cpu, cpu_ms[k]);
        }
        total += n;
    }
    free(wall_ms);
    free(cpu_ms);
    printf("  %s: %d walks, %ld masks, %.3f ms CPU per constraint created", what, n_walks, total,
           g_create_ms / (n_walks * g_repeats));
    if (g_repeats > 1)
        printf(", each mask's time the least of %d runs of its walk", g_repeats);
    printf("\n");
    series_print("mask per token (wall clock)", &s);
    series_print("mask per token (thread CPU time)", &cpu);
    free(s.ms);
    free(cpu.ms);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s VOCAB.gguf SCHEMA.json [WALKS [TOKENS]]\n", argv[0]);
        return 2;
    }
    int n_walks = argc > 3 ? atoi(argv[3]) : 20;
    int64_t tokens = argc > 4 ? atoll(argv[4]) : 3000;
    if (getenv("BENCH_SLOW_MS"))
        g_slow_ms = atof(getenv("BENCH_SLOW_MS"));
    g_hash = getenv("BENCH_MASK_HASH") != NULL;
    if (getenv("BENCH_REPEAT") && atoi(getenv("BENCH_REPEAT")) > 1)
        g_repeats = atoi(getenv("BENCH_REPEAT"));
    sw_error err;
    eng_gguf *gg = NULL;
    eng_tokenizer *tok = NULL;
    eng_cs_vocab *v = NULL;
    if (eng_gguf_open(argv[1], &gg, &err) || eng_tokenizer_load(gg, &tok, &err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err.message);
        return 1;
    }
    g_tok = tok;
    double t0 = eng_now_seconds();
    if (eng_cs_vocab_create(tok, &v, &err)) {
        fprintf(stderr, "vocabulary index: %s\n", err.message);
        return 1;
    }
    printf("vocabulary %s: %d tokens, indexed in %.1f ms\n", argv[1], eng_tokenizer_n_vocab(tok),
           (eng_now_seconds() - t0) * 1e3);

    json_error_t jerr;
    json_t *schema = json_load_file(argv[2], 0, &jerr);
    if (!schema) {
        fprintf(stderr, "%s: %s (line %d)\n", argv[2], jerr.text, jerr.line);
        return 1;
    }
    eng_grammar *g = NULL;
    double best = 1e30;
    for (int i = 0; i < 10; i++) {
        eng_grammar_free(g);
        g = NULL;
        t0 = eng_now_seconds();
        if (eng_grammar_from_schema(schema, &g, &err)) {
            fprintf(stderr, "%s: %s\n", argv[2], err.message);
            return 1;
        }
        double ms = (eng_now_seconds() - t0) * 1e3;
        best = ms < best ? ms : best;
    }
    printf("schema %s: compiled in %.2f ms (best of 10), shortest value %lld bytes\n", argv[2],
           best, (long long)eng_grammar_min_bytes(g));
    walks("schema", g, v, n_walks, tokens);
    eng_grammar_free(g);
    json_decref(schema);

    g = NULL;
    best = 1e30;
    for (int i = 0; i < 10; i++) {
        eng_grammar_free(g);
        g = NULL;
        t0 = eng_now_seconds();
        if (eng_grammar_from_gbnf(json_gbnf, strlen(json_gbnf), &g, &err)) {
            fprintf(stderr, "gbnf: %s\n", err.message);
            return 1;
        }
        double ms = (eng_now_seconds() - t0) * 1e3;
        best = ms < best ? ms : best;
    }
    printf("GBNF JSON grammar: compiled in %.2f ms (best of 10)\n", best);
    walks("GBNF JSON grammar", g, v, n_walks, tokens / 10);
    eng_grammar_free(g);

    eng_cs_vocab_free(v);
    eng_tokenizer_free(tok);
    eng_gguf_close(gg);
    return 0;
}
