/* model_make.c - synthetic GGUF models of the llama family (see model_make.h).
 *
 * Three parts: the vocabulary builder (a small SentencePiece merge simulator
 * decides which intermediate pieces a word needs), the weight generator (a
 * counter-based hash per tensor, so any element is a pure function of seed,
 * tensor name and index), and the writer glue (metadata keys as llama.cpp
 * writes them).
 */
#include "modelgen/model_make.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "engine/embed.h"
#include "engine/model.h"
#include "quant/quant.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- vocabulary ---------------------------------------------------------- */

#define MM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define MM_MAX_PIECE_BYTES 48
#define MM_MAX_WORD_CHARS 40

/* Most common English words (roughly by frequency), then words of simple
 * stories, so prompts like "Once upon a time" tokenize into whole words. */
static const char *const mm_words[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for",
    "on", "are", "with", "as", "I", "his", "they", "be", "at", "one", "have", "this",
    "from", "or", "had", "by", "not", "word", "but", "what", "some", "we", "can", "out",
    "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an",
    "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many",
    "then", "them", "write", "would", "like", "so", "these", "her", "long", "make",
    "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come",
    "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water",
    "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "any",
    "new", "work", "part", "take", "get", "place", "made", "live", "where", "after",
    "back", "little", "only", "round", "man", "year", "came", "show", "every", "good",
    "me", "give", "our", "under", "name", "very", "through", "just", "form", "sentence",
    "great", "think", "say", "help", "low", "line", "differ", "turn", "cause", "much",
    "mean", "before", "move", "right", "boy", "old", "too", "same", "tell", "does",
    "set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home",
    "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must",
    "big", "high", "such", "follow", "act", "why", "ask", "men", "change", "went",
    "light", "kind", "off", "need", "house", "picture", "try", "us", "again", "animal",
    "point", "mother", "world", "near", "build", "self", "earth", "father", "head",
    "stand", "own", "page", "should", "country", "found", "answer", "school", "grow",
    "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between",
    "state", "keep", "eye", "never", "last", "let", "thought", "city", "tree", "cross",
    "farm", "hard", "start", "might", "story", "saw", "far", "sea", "draw", "left",
    "late", "run", "while", "press", "close", "night", "real", "life", "few", "north",
    "open", "seem", "together", "next", "white", "children", "begin", "got", "walk",
    "example", "ease", "paper", "group", "always", "music", "those", "both", "mark",
    "often", "letter", "until", "mile", "river", "car", "feet", "care", "second",
    "book", "carry", "took", "science", "eat", "room", "friend", "began", "idea", "fish",
    "mountain", "stop", "once", "base", "hear", "horse", "cut", "sure", "watch", "color",
    "face", "wood", "main", "enough", "plain", "girl", "usual", "young", "ready",
    "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body",
    "dog", "family", "direct", "pose", "leave", "song", "measure", "door", "product",
    "black", "short", "class", "wind", "question", "happen", "complete", "ship",
    "area", "half", "rock", "order", "fire", "south", "problem", "piece", "told",
    "knew", "pass", "since", "top", "whole", "king", "space", "heard", "best", "hour",
    "better", "true", "during", "hundred", "five", "remember", "step", "early", "hold",
    "west", "ground", "interest", "reach", "fast", "verb", "sing", "listen", "six",
    "table", "travel", "less", "morning", "ten", "simple", "several", "toward", "war",
    "lay", "against", "pattern", "slow", "center", "love", "person", "money", "serve",
    "appear", "road", "map", "rain", "rule", "govern", "pull", "cold", "notice", "voice",
    "power", "town", "fine", "certain", "fly", "fall", "lead", "cry", "dark", "machine",
    "note", "wait", "plan", "figure", "star", "box", "noun", "field", "rest", "able",
    "pound", "done", "beauty", "drive", "stood", "contain", "front", "teach", "week",
    "final", "gave", "green", "quick", "develop", "ocean", "warm", "free", "minute",
    "strong", "special", "mind", "behind", "clear", "tail", "produce", "fact", "street",
    "inch", "nothing", "course", "stay", "wheel", "full", "force", "blue", "object",
    "decide", "surface", "deep", "moon", "island", "foot", "system", "busy", "test",
    "record", "boat", "common", "gold", "possible", "plane", "dry", "wonder", "laugh",
    "thousand", "ago", "ran", "check", "game", "shape", "yes", "hot", "miss", "brought",
    "heat", "snow", "bed", "bring", "sit", "perhaps", "fill", "east", "weight",
    "language", "among", "upon", "named", "happy", "sad", "mom", "dad", "park", "ball",
    "toy", "cat", "smile", "smiled", "wanted", "loved", "played", "looked", "felt",
    "went", "saw", "asked", "help", "helped", "nice", "pretty", "tiny", "scared",
    "lily", "tim", "ben", "sue", "sky", "flower", "garden", "cake", "hug", "kind",
    "share", "sorry", "thank", "thanks", "friends", "together", "excited", "jump",
    "jumped", "ran", "runs", "running", "playing", "looking", "going", "something",
    "everyone", "anything", "because", "really", "again", "inside", "outside", "today",
    "tomorrow", "yesterday", "hello", "goodbye", "please", "okay", "model", "server",
    "memory", "request", "token", "answer", "computer", "data", "file", "error",
};

/* Capitalised forms of the most frequent sentence starters and names. */
static const char *const mm_capital_words[] = {
    "The", "It", "He", "She", "They", "We", "You", "I", "In", "Once", "One", "This",
    "That", "There", "When", "Then", "But", "And", "So", "What", "How", "Why", "Where",
    "Who", "If", "After", "On", "At", "A", "Lily", "Tim", "Ben", "Sue", "Mom", "Dad",
    "Hello", "Yes", "No", "The", "My", "His", "Her", "Their", "Our", "Your",
};

static const char *const mm_bigrams[] = {
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te",
    "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou",
    "io", "le", "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce",
    "li", "ch", "ll", "be", "ma", "si", "om", "ur",
    "ing", "ion", "ly", "ment", "ness", "ful", "less", "est", "tion", "ous", "ive",
    "able", "ers", "ies", "'s", "n't", "'re", "'ll", "'ve",
};

/* Letters in English frequency order, then the rest of printable ASCII. */
static const char mm_letter_order[] = "etaoinshrdlcumwfgypbvkjxqz";
static const char mm_punct_order[] = ".,!?'\"-:;()";

typedef struct mm_vocab {
    int32_t n;          /* pieces so far */
    int32_t cap;        /* n_vocab */
    int32_t n_special;  /* 259: unk, bos, eos and the byte tokens */
    char *text;         /* every piece, NUL-terminated, back to back */
    size_t text_len, text_cap;
    size_t *offset;     /* cap: piece i starts at text + offset[i] */
    uint32_t *len;      /* cap: bytes of piece i */
    float *score;       /* cap */
    int32_t *type;      /* cap: eng_token_type values */
    uint8_t *is_word;   /* cap: 1 for a whole word of the built-in lists */
    int32_t *slots;     /* n_slots: open-addressing hash of pieces, -1 empty */
    size_t n_slots;     /* power of two, at least twice cap */
} mm_vocab;

static uint64_t mm_fnv1a(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void mm_vocab_free(mm_vocab *v)
{
    sw_free(v->text);
    sw_free(v->offset);
    sw_free(v->len);
    sw_free(v->score);
    sw_free(v->type);
    sw_free(v->is_word);
    sw_free(v->slots);
    memset(v, 0, sizeof *v);
}

static int mm_vocab_init(mm_vocab *v, int32_t n_vocab)
{
    memset(v, 0, sizeof *v);
    v->cap = n_vocab;
    v->n_slots = 1024;
    while (v->n_slots < 2 * (size_t)n_vocab)
        v->n_slots *= 2;
    v->text_cap = (size_t)n_vocab * 12 + 4096;
    v->text = sw_malloc(v->text_cap);
    v->offset = sw_calloc((size_t)n_vocab, sizeof *v->offset);
    v->len = sw_calloc((size_t)n_vocab, sizeof *v->len);
    v->score = sw_calloc((size_t)n_vocab, sizeof *v->score);
    v->type = sw_calloc((size_t)n_vocab, sizeof *v->type);
    v->is_word = sw_calloc((size_t)n_vocab, sizeof *v->is_word);
    v->slots = sw_malloc(v->n_slots * sizeof *v->slots);
    if (!v->text || !v->offset || !v->len || !v->score || !v->type || !v->is_word ||
        !v->slots) {
        mm_vocab_free(v);
        return SW_ENOMEM;
    }
    memset(v->slots, 0xff, v->n_slots * sizeof *v->slots);
    return SW_OK;
}

/* Id of the piece s[0..len), or -1. */
static int32_t mm_vocab_find(const mm_vocab *v, const char *s, size_t len)
{
    size_t mask = v->n_slots - 1;
    for (size_t i = (size_t)mm_fnv1a(s, len) & mask;; i = (i + 1) & mask) {
        int32_t id = v->slots[i];
        if (id < 0)
            return -1;
        if (v->len[id] == len && memcmp(v->text + v->offset[id], s, len) == 0)
            return id;
    }
}

/* mm_vocab_add's answer for a piece it did not add (not an sw_status). */
#define MM_SKIPPED INT32_MIN

/* Appends a piece unless it exists or the vocabulary is full. Returns its
 * new id, MM_SKIPPED if it was not added (duplicate, full or too long), or
 * SW_ENOMEM. Scores of NORMAL pieces go 0, -1, -2, ... by rank. */
static int32_t mm_vocab_add(mm_vocab *v, const char *s, size_t len, int32_t type)
{
    if (v->n >= v->cap || len == 0 || len > MM_MAX_PIECE_BYTES || mm_vocab_find(v, s, len) >= 0)
        return MM_SKIPPED;
    if (v->text_len + len + 1 > v->text_cap) {
        size_t cap = v->text_cap * 2;
        char *t = sw_realloc(v->text, cap);
        if (!t)
            return SW_ENOMEM;
        v->text = t;
        v->text_cap = cap;
    }
    int32_t id = v->n++;
    v->offset[id] = v->text_len;
    v->len[id] = (uint32_t)len;
    memcpy(v->text + v->text_len, s, len);
    v->text[v->text_len + len] = '\0';
    v->text_len += len + 1;
    v->type[id] = type;
    v->score[id] = type == 1 ? -(float)(id - v->n_special) : 0.0f;
    size_t mask = v->n_slots - 1;
    size_t i = (size_t)mm_fnv1a(s, len) & mask;
    while (v->slots[i] >= 0)
        i = (i + 1) & mask;
    v->slots[i] = id;
    return id;
}

static size_t mm_utf8_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0)
        return 2;
    if ((c & 0xf0) == 0xe0)
        return 3;
    if ((c & 0xf8) == 0xf0)
        return 4;
    return 1;
}

static size_t mm_utf8_chars(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

/* Adds the piece w (its characters must already be pieces) together with
 * whatever intermediates SentencePiece's merge order needs to produce it as
 * one token: tokenize w with the current vocabulary (repeatedly merge the
 * adjacent pair whose concatenation has the best score, leftmost first);
 * while that leaves more than one symbol, add the shortest adjacent
 * concatenation as a new piece and tokenize again. mark_word flags the
 * finished piece as a whole word (for the head's row scale). New pieces score below
 * all earlier ones, so words added earlier still tokenize as before. */
static int mm_vocab_add_word(mm_vocab *v, const char *w, bool mark_word)
{
    size_t start[MM_MAX_WORD_CHARS + 1];
    size_t n_sym = 0, len = strlen(w);
    if (len == 0 || len > MM_MAX_PIECE_BYTES)
        return SW_OK;
    for (size_t i = 0; i < len; i += mm_utf8_len((unsigned char)w[i])) {
        if (n_sym == MM_MAX_WORD_CHARS)
            return SW_OK;
        start[n_sym++] = i;
    }
    start[n_sym] = len;
    for (size_t i = 0; i < n_sym; i++)
        if (mm_vocab_find(v, w + start[i], start[i + 1] - start[i]) < 0)
            return SW_OK; /* a character the vocabulary lacks: skip the word */
    for (;;) {
        size_t sym[MM_MAX_WORD_CHARS + 1], m = n_sym;
        memcpy(sym, start, sizeof(size_t) * (n_sym + 1));
        for (;;) {
            int32_t best_id = -1;
            size_t best_at = 0;
            for (size_t i = 0; i + 1 < m; i++) {
                int32_t id = mm_vocab_find(v, w + sym[i], sym[i + 2] - sym[i]);
                if (id >= 0 && (best_id < 0 || id < best_id)) {
                    best_id = id;
                    best_at = i;
                }
            }
            if (best_id < 0)
                break;
            memmove(&sym[best_at + 1], &sym[best_at + 2], sizeof(size_t) * (m - best_at - 1));
            m--;
        }
        if (m == 1) {
            int32_t id = mm_vocab_find(v, w, len);
            if (id >= 0 && mark_word)
                v->is_word[id] = 1;
            return SW_OK;
        }
        if (v->n >= v->cap)
            return SW_OK;
        size_t best_at = 0, best_chars = SIZE_MAX;
        for (size_t i = 0; i + 1 < m; i++) {
            size_t chars = mm_utf8_chars(w + sym[i], sym[i + 2] - sym[i]);
            if (chars < best_chars) {
                best_chars = chars;
                best_at = i;
            }
        }
        int32_t id = mm_vocab_add(v, w + sym[best_at], sym[best_at + 2] - sym[best_at], 1);
        if (id == SW_ENOMEM)
            return SW_ENOMEM;
        if (id == MM_SKIPPED)
            return SW_EINTERNAL; /* cannot happen: the pair was not a piece */
    }
}

static bool mm_is_letters(const char *s, size_t len, bool allow_space_prefix)
{
    size_t i = 0;
    if (allow_space_prefix && len >= 3 && memcmp(s, MM_SPACE, 3) == 0)
        i = 3;
    if (i == len)
        return false;
    for (; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return false;
    }
    return true;
}

/* Pads the vocabulary with concatenations of two earlier letter pieces
 * (the right one without the space prefix), taken in order of increasing
 * id sum, so the filler is made of the most common pieces first. */
static int mm_vocab_fill(mm_vocab *v)
{
    char buf[MM_MAX_PIECE_BYTES + 1];
    const int32_t base = v->n_special;
    for (int64_t d = 0; v->n < v->cap; d++) {
        int32_t n_now = v->n - base;
        if (d > 2 * (int64_t)n_now)
            return SW_EINTERNAL; /* nothing left to combine (cannot happen) */
        for (int64_t i = 0; i <= d && v->n < v->cap; i++) {
            int64_t j = d - i;
            if (i >= n_now || j >= n_now)
                continue;
            int32_t a = base + (int32_t)i, b = base + (int32_t)j;
            const char *sa = v->text + v->offset[a], *sb = v->text + v->offset[b];
            size_t la = v->len[a], lb = v->len[b];
            if (la + lb > 16 || !mm_is_letters(sa, la, true) || !mm_is_letters(sb, lb, false))
                continue;
            memcpy(buf, sa, la);
            memcpy(buf + la, sb, lb);
            if (mm_vocab_add(v, buf, la + lb, 1) == SW_ENOMEM)
                return SW_ENOMEM;
        }
    }
    return SW_OK;
}

static int mm_vocab_build(mm_vocab *v, int32_t n_vocab)
{
    char buf[MM_MAX_PIECE_BYTES + 8];
    int rc = mm_vocab_init(v, n_vocab);
    if (rc != SW_OK)
        return rc;
    /* ids 0..258, fixed. These and the single characters below fit in the
     * initial text buffer, so their adds cannot fail for lack of memory. */
    mm_vocab_add(v, "<unk>", 5, 2);
    mm_vocab_add(v, "<s>", 3, 3);
    mm_vocab_add(v, "</s>", 4, 3);
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        mm_vocab_add(v, buf, 6, 6);
    }
    v->n_special = v->n;
    /* single characters */
    mm_vocab_add(v, MM_SPACE, 3, 1);
    for (const char *c = mm_letter_order; *c; c++)
        mm_vocab_add(v, c, 1, 1);
    for (const char *c = mm_letter_order; *c; c++) {
        buf[0] = (char)(*c - 'a' + 'A');
        mm_vocab_add(v, buf, 1, 1);
    }
    for (char c = '0'; c <= '9'; c++)
        mm_vocab_add(v, &c, 1, 1);
    for (const char *c = mm_punct_order; *c; c++)
        mm_vocab_add(v, c, 1, 1);
    for (char c = 0x21; c < 0x7f; c++)
        mm_vocab_add(v, &c, 1, 1); /* the rest; duplicates are skipped */
    /* "▁" + letter / digit */
    memcpy(buf, MM_SPACE, 3);
    for (const char *c = mm_letter_order; *c; c++) {
        buf[3] = *c;
        mm_vocab_add(v, buf, 4, 1);
    }
    for (const char *c = mm_letter_order; *c; c++) {
        buf[3] = (char)(*c - 'a' + 'A');
        mm_vocab_add(v, buf, 4, 1);
    }
    for (char c = '0'; c <= '9'; c++) {
        buf[3] = c;
        mm_vocab_add(v, buf, 4, 1);
    }
    for (size_t i = 0; i < sizeof mm_bigrams / sizeof mm_bigrams[0]; i++)
        if ((rc = mm_vocab_add_word(v, mm_bigrams[i], false)) != SW_OK)
            return rc;
    for (size_t i = 0; i < sizeof mm_words / sizeof mm_words[0]; i++) {
        snprintf(buf, sizeof buf, MM_SPACE "%s", mm_words[i]);
        if ((rc = mm_vocab_add_word(v, buf, true)) != SW_OK)
            return rc;
    }
    for (size_t i = 0; i < sizeof mm_capital_words / sizeof mm_capital_words[0]; i++) {
        snprintf(buf, sizeof buf, MM_SPACE "%s", mm_capital_words[i]);
        if ((rc = mm_vocab_add_word(v, buf, true)) != SW_OK)
            return rc;
    }
    return mm_vocab_fill(v);
}

/* ---- weights ------------------------------------------------------------- */

/* splitmix64's output function: a full-avalanche bijection of 64-bit words. */
static uint64_t mm_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct mm_tensor {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[3];       /* ne[0] innermost (row length), ne[1] rows, ne[2] experts
                            (1 for matrices and vectors; rows are generated
                            over ne[1] * ne[2]) */
    float center;        /* values are center + amplitude * U[-1, 1) */
    float amplitude;
    const float *row_scale; /* ne[1] factors on the amplitude, or NULL (2-D only) */
} mm_tensor;

/* Generates one tensor row by row into a new buffer (sw_free). Element e
 * (row-major over ne) is a pure function of (seed, name, e): splitmix64
 * over the counter, keyed by the seed and a hash of the name. */
static int mm_tensor_generate(const mm_tensor *t, uint64_t seed, float *row, void **out,
                              size_t *out_size)
{
    size_t row_bytes, size;
    const int64_t n_rows = t->ne[1] * t->ne[2];
    if (!eng_type_row_bytes(t->type, t->ne[0], &row_bytes) ||
        __builtin_mul_overflow(row_bytes, (size_t)n_rows, &size))
        return SW_EINVAL;
    unsigned char *data = sw_malloc(size ? size : 1);
    if (!data)
        return SW_ENOMEM;
    const uint64_t key =
        mm_mix64(mm_mix64(seed ^ 0x243f6a8885a308d3ULL) ^ mm_fnv1a(t->name, strlen(t->name)));
    const int64_t n = t->ne[0];
    for (int64_t r = 0; r < n_rows; r++) {
        const float amplitude = t->amplitude * (t->row_scale ? t->row_scale[r] : 1.0f);
        uint64_t counter = key + (uint64_t)(r * n) * 0x9e3779b97f4a7c15ULL;
        for (int64_t i = 0; i < n; i++) {
            counter += 0x9e3779b97f4a7c15ULL;
            uint64_t z = mm_mix64(counter);
            /* 24 random bits -> [-1, 1) */
            float u = (float)(int32_t)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
            row[i] = t->center + amplitude * u;
        }
        eng_quantize_row(t->type, row, data + (size_t)r * row_bytes, n);
    }
    *out = data;
    *out_size = size;
    return SW_OK;
}

/* ---- parameters ----------------------------------------------------------- */

/* The head size: as given, or the width split evenly between the heads. */
static int32_t mm_head_dim(const eng_model_make_params *p)
{
    return p->head_dim ? p->head_dim : p->n_embd / p->n_head;
}

eng_model_make_params eng_model_make_default_params(void)
{
    eng_model_make_params p;
    memset(&p, 0, sizeof p);
    p.architecture = "llama";
    p.name = NULL;
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 512;
    p.n_ctx_train = 2048;
    p.rope_freq_base = 10000.0f;
    p.rms_eps = 1e-5f;
    p.weight_type = ENG_TYPE_F32;
    p.tied_output = false;
    p.seed = 1;
    return p;
}

int eng_model_make_preset(const char *name, eng_model_make_params *out)
{
    eng_model_make_params p = eng_model_make_default_params();
    if (!name)
        return SW_ENOTFOUND;
    if (strcmp(name, "tiny") == 0) {
        /* the defaults */
    } else if (strcmp(name, "small") == 0) {
        p.n_embd = 512;
        p.n_layer = 8;
        p.n_head = 8;
        p.n_head_kv = 4;
        p.n_ff = 1536;
        p.n_vocab = 32000;
        p.weight_type = ENG_TYPE_Q8_0;
    } else if (strcmp(name, "1b") == 0) {
        p.n_embd = 2048;
        p.n_layer = 22;
        p.n_head = 32;
        p.n_head_kv = 4;
        p.n_ff = 5632;
        p.n_vocab = 32000;
        p.weight_type = ENG_TYPE_Q8_0;
    } else if (strcmp(name, "qwen3-tiny") == 0) {
        /* Qwen3's layout at test size: heads wider than dim / heads (as
         * Qwen3-0.6B's 16 x 128 on a width of 1024), grouped-query. */
        p.architecture = "qwen3";
        p.n_embd = 128;
        p.n_layer = 2;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.head_dim = 64;
        p.n_ff = 384;
        p.n_vocab = 1024;
        p.rope_freq_base = 1000000.0f;
        p.rms_eps = 1e-6f;
    } else if (strcmp(name, "phi3-tiny") == 0) {
        /* Phi-3's layout at test size: fused Q/K/V and gate/up matrices */
        p.architecture = "phi3";
        p.n_embd = 128;
        p.n_layer = 2;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 384;
        p.n_vocab = 1024;
    } else if (strcmp(name, "qwen3moe-tiny") == 0) {
        /* Qwen3-MoE's layout at test size: qwen3-tiny's attention, and 8
         * experts of hidden size 128 per layer, 2 of them per token */
        eng_model_make_preset("qwen3-tiny", &p);
        p.architecture = "qwen3moe";
        p.n_ff = 128;
        p.n_expert = 8;
        p.n_expert_used = 2;
    } else if (strcmp(name, "qwen3moe-small") == 0) {
        /* a shape for decode speed: Qwen3-30B-A3B's proportions (heads of
         * 128 wider than dim / heads, 8 of the experts per token, each a
         * fraction of dim wide) at a size a test machine holds: 0.91 G
         * parameters, of which a token reads about a fifth */
        p.architecture = "qwen3moe";
        p.n_embd = 1024;
        p.n_layer = 8;
        p.n_head = 16;
        p.n_head_kv = 4;
        p.head_dim = 128;
        p.n_ff = 512;
        p.n_expert = 64;
        p.n_expert_used = 8;
        p.n_vocab = 32000;
        p.rope_freq_base = 1000000.0f;
        p.rms_eps = 1e-6f;
        p.weight_type = ENG_TYPE_Q8_0;
    } else if (strcmp(name, "gpt-oss-tiny") == 0) {
        /* gpt-oss's layout at test size: qwen3-tiny's heads (64 wide, as
         * gpt-oss's), 8 experts of FFN 128, 2 per token, layer 0 sliding
         * with a window shorter than the test prompts, layer 1 global,
         * gpt-oss's RoPE base and YaRN (factor 32 over 4096) */
        eng_model_make_preset("qwen3-tiny", &p);
        p.architecture = "gpt-oss";
        p.n_ff = 128;
        p.n_expert = 8;
        p.n_expert_used = 2;
        p.sliding_window = 8;
        p.rope_freq_base = 150000.0f;
        p.rms_eps = 1e-5f;
    } else if (strcmp(name, "gpt-oss-small") == 0) {
        /* a shape for decode speed: gpt-oss-20b's proportions (heads of 64,
         * 8 KV heads, 32 experts as wide as the model, 4 per token, window
         * 128 on even layers) at a size a test machine holds: 0.90 G
         * parameters, of which a token reads 0.16 G (under a fifth) */
        p.architecture = "gpt-oss";
        p.n_embd = 1024;
        p.n_layer = 8;
        p.n_head = 16;
        p.n_head_kv = 8;
        p.head_dim = 64;
        p.n_ff = 1024;
        p.n_expert = 32;
        p.n_expert_used = 4;
        p.sliding_window = 128;
        p.n_vocab = 32000;
        p.rope_freq_base = 150000.0f;
        p.weight_type = ENG_TYPE_Q8_0;
    } else if (strcmp(name, "gemma3-tiny") == 0) {
        /* Gemma 3's layout at test size: qwen3-tiny's shape (heads wider
         * than dim / heads), a sliding layer with a window shorter than
         * the test prompts, then a global one, and a soft-capped head
         * (Gemma 2's files have one; llama.cpp applies it to gemma3's too) */
        eng_model_make_preset("qwen3-tiny", &p); /* its shape, base and eps */
        p.architecture = "gemma3";
        p.sliding_window = 8;
        p.sliding_window_pattern = 2;
        p.final_logit_softcap = 30.0f;
    } else {
        return SW_ENOTFOUND;
    }
    *out = p;
    return SW_OK;
}

int eng_model_make_validate(const eng_model_make_params *p, sw_error *err)
{
    if (!p)
        return sw_error_set(err, SW_EINVAL, "model make: no parameters");
    if (p->architecture && strcmp(p->architecture, "llama") != 0 &&
        strcmp(p->architecture, "llama3") != 0 && strcmp(p->architecture, "qwen2") != 0 &&
        strcmp(p->architecture, "qwen3") != 0 && strcmp(p->architecture, "phi3") != 0 &&
        strcmp(p->architecture, "gemma3") != 0 && strcmp(p->architecture, "qwen3moe") != 0 &&
        strcmp(p->architecture, "gpt-oss") != 0)
        return sw_error_set(err, SW_EINVAL,
                            "model make: architecture '%s' is not supported (llama, llama3, "
                            "qwen2, qwen3, qwen3moe, phi3, gemma3, gpt-oss)", p->architecture);
    const bool gpt_oss = p->architecture && strcmp(p->architecture, "gpt-oss") == 0;
    const bool qwen3moe = p->architecture && strcmp(p->architecture, "qwen3moe") == 0;
    if (!qwen3moe && !gpt_oss && (p->n_expert != 0 || p->n_expert_used != 0))
        return sw_error_set(err, SW_EINVAL, "model make: experts are qwen3moe's and gpt-oss's");
    if (gpt_oss && p->sliding_window <= 0)
        return sw_error_set(err, SW_EINVAL, "model make: gpt-oss needs a sliding window");
    if ((qwen3moe || gpt_oss) && (p->n_expert < 1 || p->n_expert > 256 || p->n_expert_used < 1 ||
                     p->n_expert_used > p->n_expert || p->n_expert_used > 64))
        return sw_error_set(err, SW_EINVAL, "model make: %s needs 1..256 experts (%d) and "
                            "1..min(experts, 64) of them used per token (%d)", p->architecture,
                            p->n_expert, p->n_expert_used);
    const bool gemma3 = p->architecture && strcmp(p->architecture, "gemma3") == 0;
    const bool llama = !p->architecture || strcmp(p->architecture, "llama") == 0 ||
                       strcmp(p->architecture, "llama3") == 0;
    if (!gemma3 && !llama && !gpt_oss && p->sliding_window != 0)
        return sw_error_set(err, SW_EINVAL, "model make: a sliding window is gemma3's or "
                            "llama's (llama3's)");
    if (!gemma3 && (p->sliding_window_pattern != 0 || p->final_logit_softcap != 0.0f))
        return sw_error_set(err, SW_EINVAL, "model make: a sliding-window pattern and the "
                            "logit soft-cap are gemma3's (a llama window covers every layer)");
    if (p->sliding_window < 0 || p->sliding_window_pattern < 0 ||
        !(p->final_logit_softcap >= 0.0f) || !isfinite(p->final_logit_softcap))
        return sw_error_set(err, SW_EINVAL, "model make: sliding window, pattern and soft-cap "
                            "must not be negative");
    if (p->pooling && eng_pooling_from_name(p->pooling) < 0)
        return sw_error_set(err, SW_EINVAL, "model make: pooling is none, mean, cls, last or "
                            "rank, not '%.32s'", p->pooling);
    if (p->architecture && strcmp(p->architecture, "phi3") == 0 && p->head_dim != 0 &&
        (int64_t)p->head_dim * p->n_head != p->n_embd)
        return sw_error_set(err, SW_EINVAL, "model make: phi3's heads must fill the width "
                            "(heads x head dim = dim, as llama.cpp loads it)");
    if (p->n_embd <= 0 || p->n_embd > (1 << 16))
        return sw_error_set(err, SW_EINVAL, "model make: dim %d must be in 1..65536", p->n_embd);
    if (p->n_layer <= 0 || p->n_layer > 1024)
        return sw_error_set(err, SW_EINVAL, "model make: layers %d must be in 1..1024",
                            p->n_layer);
    if (p->n_head <= 0 || p->n_head_kv <= 0)
        return sw_error_set(err, SW_EINVAL, "model make: heads (%d) and kv heads (%d) must be positive",
                            p->n_head, p->n_head_kv);
    if (p->head_dim < 0 || p->head_dim > 1024)
        return sw_error_set(err, SW_EINVAL, "model make: head dim %d must be in 0..1024 (0: "
                            "dim / heads)", p->head_dim);
    if (p->head_dim == 0 && p->n_embd % p->n_head != 0)
        return sw_error_set(err, SW_EINVAL, "model make: dim %d is not a multiple of heads %d",
                            p->n_embd, p->n_head);
    if (p->n_head % p->n_head_kv != 0)
        return sw_error_set(err, SW_EINVAL,
                            "model make: heads %d is not a multiple of kv heads %d",
                            p->n_head, p->n_head_kv);
    if (mm_head_dim(p) % 2 != 0)
        return sw_error_set(err, SW_EINVAL,
                            "model make: head dimension %d must be even for RoPE",
                            mm_head_dim(p));
    if (p->n_ff <= 0 || p->n_ff > (1 << 18))
        return sw_error_set(err, SW_EINVAL, "model make: ffn %d must be in 1..262144", p->n_ff);
    if (p->n_vocab < ENG_MODEL_MAKE_MIN_VOCAB || p->n_vocab > ENG_MODEL_MAKE_MAX_VOCAB)
        return sw_error_set(err, SW_EINVAL, "model make: vocab %d must be in %d..%d (259 special "
                            "and byte tokens come first)", p->n_vocab,
                            ENG_MODEL_MAKE_MIN_VOCAB, ENG_MODEL_MAKE_MAX_VOCAB);
    if (p->n_ctx_train <= 0)
        return sw_error_set(err, SW_EINVAL, "model make: context %d must be positive",
                            p->n_ctx_train);
    if (!(p->rms_eps > 0.0f) || !(p->rope_freq_base > 0.0f) || !isfinite(p->rms_eps) ||
        !isfinite(p->rope_freq_base))
        return sw_error_set(err, SW_EINVAL,
                            "model make: rms eps and rope freq base must be positive");
    if (p->mix == ENG_MIX_Q4_K_M && p->weight_type != ENG_TYPE_Q4_K)
        return sw_error_set(err, SW_EINVAL, "model make: the Q4_K_M mix needs weight type q4_k");
    if (p->mix == ENG_MIX_Q5_K_M && p->weight_type != ENG_TYPE_Q5_K)
        return sw_error_set(err, SW_EINVAL, "model make: the Q5_K_M mix needs weight type q5_k");
    if (p->mix == ENG_MIX_Q3_K_M && p->weight_type != ENG_TYPE_Q3_K)
        return sw_error_set(err, SW_EINVAL, "model make: the Q3_K_M mix needs weight type q3_k");
    if (p->mix != ENG_MIX_NONE && p->mix != ENG_MIX_Q4_K_M && p->mix != ENG_MIX_Q5_K_M &&
        p->mix != ENG_MIX_Q3_K_M)
        return sw_error_set(err, SW_EINVAL, "model make: unknown mix %d", (int)p->mix);
    const int64_t q_width = (int64_t)p->n_head * mm_head_dim(p);
    switch (p->weight_type) {
    case ENG_TYPE_F32:
    case ENG_TYPE_F16:
    case ENG_TYPE_BF16:
        break;
    case ENG_TYPE_Q8_0:
    case ENG_TYPE_Q4_0:
    case ENG_TYPE_IQ4_NL:
    case ENG_TYPE_MXFP4:
        if (p->n_embd % 32 != 0 || p->n_ff % 32 != 0 || q_width % 32 != 0)
            return sw_error_set(err, SW_EINVAL,
                                "model make: %s needs dim (%d), ffn (%d) and heads x head dim "
                                "(%d) to be multiples of 32 (the quantization block)",
                                eng_type_traits_get(p->weight_type)->name, p->n_embd, p->n_ff,
                                (int)q_width);
        break;
    case ENG_TYPE_Q2_K:
    case ENG_TYPE_Q3_K:
    case ENG_TYPE_IQ4_XS:
    case ENG_TYPE_Q4_K:
    case ENG_TYPE_Q5_K:
    case ENG_TYPE_Q6_K:
        /* every matrix row is dim, ffn or heads x head dim values long */
        if (p->n_embd % 256 != 0 || p->n_ff % 256 != 0 || q_width % 256 != 0)
            return sw_error_set(err, SW_EINVAL,
                                "model make: %s needs dim (%d), ffn (%d) and heads x head dim "
                                "(%d) to be multiples of 256 (the K-quant super-block)",
                                eng_type_traits_get(p->weight_type)->name, p->n_embd, p->n_ff,
                                (int)q_width);
        break;
    default:
        return sw_error_set(err, SW_EINVAL,
                            "model make: weight type %u is not one of f32, f16, bf16, q8_0, "
                            "q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4",
                            p->weight_type);
    }
    return SW_OK;
}

/* Names come from a table of formats; the per-block ones have a %d. */
static void mm_set_name(char *buf, size_t cap, const char *fmt, int32_t layer)
{
    if (strstr(fmt, "%d"))
        snprintf(buf, cap, "blk.%d.%s", layer, fmt + strlen("blk.%d."));
    else
        snprintf(buf, cap, "%s", fmt);
}

/* Whether a mixed file gives this layer's attn_v and ffn_down more bits:
 * the first and last eighth of the layers, and every third in between. */
static bool mm_layer_more_bits(int32_t layer, int32_t n_layer)
{
    const int32_t eighth = n_layer / 8;
    return layer < eighth || layer >= n_layer - eighth || (layer - eighth) % 3 == 2;
}

/* The tensor table in file order, llama.cpp's names and GGUF shapes.
 * Returns the count; t may be NULL to count only. */
static int64_t mm_tensor_table(const eng_model_make_params *p, int32_t layer, mm_tensor *t)
{
    /* layer -1: the tensors before the blocks; layer n_layer: after; else
     * block `layer`. */
    const int64_t d = p->n_embd, head_dim = mm_head_dim(p);
    const bool phi3 = p->architecture && strcmp(p->architecture, "phi3") == 0;
    const bool gemma3 = p->architecture && strcmp(p->architecture, "gemma3") == 0;
    const bool qwen3moe = p->architecture && strcmp(p->architecture, "qwen3moe") == 0;
    const bool gpt_oss = p->architecture && strcmp(p->architecture, "gpt-oss") == 0;
    const bool moe = qwen3moe || gpt_oss;
    const int64_t q_out = p->n_head * head_dim, kv_out = p->n_head_kv * head_dim;
    const float u = 1.7320508f; /* sqrt(3): amplitude of a uniform with std 1 */
    const float head_amp = 4.0f * u / sqrtf((float)d);
    const float weight_scale = p->weight_scale > 0.0f ? p->weight_scale : 1.0f;
    int64_t n = 0;
#define MM_T(nm_fmt, typ, nd, e0, e1, ctr, amp)                                                 \
    do {                                                                                       \
        if (t) {                                                                               \
            mm_set_name(t[n].name, sizeof t[n].name, nm_fmt, layer);                          \
            t[n].type = (typ);                                                                 \
            t[n].n_dims = (nd);                                                                \
            t[n].ne[0] = (e0);                                                                 \
            t[n].ne[1] = (e1);                                                                 \
            t[n].ne[2] = 1;                                                                    \
            t[n].center = (ctr);                                                               \
            t[n].amplitude = (amp) * ((nd) >= 2 ? weight_scale : 1.0f);                         \
            t[n].row_scale = NULL;                                                             \
        }                                                                                      \
        n++;                                                                                   \
    } while (0)
    const uint32_t wt = p->weight_type, f32 = ENG_TYPE_F32;
    const bool mixed = p->mix != ENG_MIX_NONE;
    const bool in_block = layer >= 0 && layer < p->n_layer;
    /* the tensors a mix keeps in more bits (see eng_model_make_mix) */
    const uint32_t head_t = mixed ? ENG_TYPE_Q6_K : wt;
    uint32_t v_t = wt, down_t = wt, out_proj_t = wt;
    if (p->mix == ENG_MIX_Q3_K_M && in_block) {
        v_t = layer < 2 ? ENG_TYPE_Q5_K : ENG_TYPE_Q4_K;
        down_t = layer < p->n_layer / 16 ? ENG_TYPE_Q5_K : ENG_TYPE_Q4_K;
        out_proj_t = ENG_TYPE_Q4_K;
    } else if (mixed && in_block && mm_layer_more_bits(layer, p->n_layer)) {
        v_t = ENG_TYPE_Q6_K;
        down_t = ENG_TYPE_Q6_K;
    }
    if (layer < 0) {
        MM_T("token_embd.weight", wt, 2, d, p->n_vocab, 0.0f,
             p->tied_output ? head_amp : gemma3 ? u / sqrtf((float)d) : u);
    } else if (layer >= p->n_layer) {
        MM_T("output_norm.weight", f32, 1, d, 1, 1.0f, 0.1f);
        if (!p->tied_output)
            MM_T("output.weight", head_t, 2, d, p->n_vocab, 0.0f, head_amp);
    } else {
        const float in_d = u / sqrtf((float)d), in_q = u / sqrtf((float)q_out),
                    in_ff = u / sqrtf((float)p->n_ff);
        MM_T("blk.%d.attn_norm.weight", f32, 1, d, 1, 1.0f, 0.1f);
        if (phi3) {
            /* Phi-3's fused Q/K/V: the Q rows, then K's, then V's (one
             * type: a mix's extra bits for attn_v do not apply) */
            MM_T("blk.%d.attn_qkv.weight", wt, 2, d, q_out + 2 * kv_out, 0.0f, in_d);
        } else {
            MM_T("blk.%d.attn_q.weight", wt, 2, d, q_out, 0.0f, in_d);
            MM_T("blk.%d.attn_k.weight", wt, 2, d, kv_out, 0.0f, in_d);
            MM_T("blk.%d.attn_v.weight", v_t, 2, d, kv_out, 0.0f, in_d);
        }
        if (gpt_oss || (p->architecture && strcmp(p->architecture, "qwen2") == 0)) {
            /* Qwen2's Q/K/V biases (F32), small next to the products. */
            MM_T("blk.%d.attn_q.bias", f32, 1, q_out, 1, 0.0f, 0.2f);
            MM_T("blk.%d.attn_k.bias", f32, 1, kv_out, 1, 0.0f, 0.2f);
            MM_T("blk.%d.attn_v.bias", f32, 1, kv_out, 1, 0.0f, 0.2f);
        }
        if (gemma3 || qwen3moe || (p->architecture && strcmp(p->architecture, "qwen3") == 0)) {
            /* Qwen3's and Gemma 3's per-head RMS norm weights of Q and K (F32). */
            MM_T("blk.%d.attn_q_norm.weight", f32, 1, head_dim, 1, 1.0f, 0.1f);
            MM_T("blk.%d.attn_k_norm.weight", f32, 1, head_dim, 1, 1.0f, 0.1f);
        }
        MM_T("blk.%d.attn_output.weight", out_proj_t, 2, q_out, d, 0.0f, in_q);
        if (gpt_oss) {
            /* the output bias; a sink logit per head, of the size of the
             * scores (some heads' sinks take much of the mass, others
             * little); the norm before the experts, post_attention_norm */
            MM_T("blk.%d.attn_output.bias", f32, 1, d, 1, 0.0f, 0.2f);
            MM_T("blk.%d.attn_sinks.weight", f32, 1, p->n_head, 1, 0.0f, 2.0f);
            MM_T("blk.%d.post_attention_norm.weight", f32, 1, d, 1, 1.0f, 0.1f);
        }
        if (gemma3) /* the norm of the attention output, before the residual add */
            MM_T("blk.%d.post_attention_norm.weight", f32, 1, d, 1, 1.0f, 0.1f);
        if (!gpt_oss)
            MM_T("blk.%d.ffn_norm.weight", f32, 1, d, 1, 1.0f, 0.1f);
        if (moe) {
            /* the router (F32, as llama.cpp's quantizer leaves it), then the
             * experts as 3-D tensors {row length, rows, experts}; ffn_down's
             * extra bits in a mix apply to ffn_down_exps, as llama.cpp's
             * name rules have it. The router's logits have std 4 (a unit-RMS
             * input): routing is decided by clear margins most of the time,
             * so that two engines' rounding rarely tips a near-tie between
             * the last chosen expert and the next, which changes a layer's
             * output by a step, not a rounding (std 1 tipped one or two of
             * 24 steps of some quantized files) */
            const int64_t e = p->n_expert;
            MM_T("blk.%d.ffn_gate_inp.weight", f32, 2, d, e, 0.0f, 4.0f * in_d);
            MM_T("blk.%d.ffn_gate_exps.weight", wt, 3, d, p->n_ff, 0.0f, in_d);
            if (t)
                t[n - 1].ne[2] = e;
            MM_T("blk.%d.ffn_up_exps.weight", wt, 3, d, p->n_ff, 0.0f, in_d);
            if (t)
                t[n - 1].ne[2] = e;
            MM_T("blk.%d.ffn_down_exps.weight", down_t, 3, p->n_ff, d, 0.0f, in_ff);
            if (t)
                t[n - 1].ne[2] = e;
            if (gpt_oss) { /* biases of the router and of each expert (F32) */
                MM_T("blk.%d.ffn_gate_inp.bias", f32, 1, e, 1, 0.0f, 1.0f);
                MM_T("blk.%d.ffn_gate_exps.bias", f32, 2, p->n_ff, e, 0.0f, 0.2f);
                MM_T("blk.%d.ffn_up_exps.bias", f32, 2, p->n_ff, e, 0.0f, 0.2f);
                MM_T("blk.%d.ffn_down_exps.bias", f32, 2, d, e, 0.0f, 0.2f);
            }
        } else if (phi3) {
            /* Phi-3's fused gate and up: the gate rows, then the up rows */
            MM_T("blk.%d.ffn_up.weight", wt, 2, d, 2 * (int64_t)p->n_ff, 0.0f, in_d);
        } else {
            MM_T("blk.%d.ffn_gate.weight", wt, 2, d, p->n_ff, 0.0f, in_d);
            MM_T("blk.%d.ffn_up.weight", wt, 2, d, p->n_ff, 0.0f, in_d);
        }
        if (!moe)
            MM_T("blk.%d.ffn_down.weight", down_t, 2, p->n_ff, d, 0.0f, in_ff);
        if (gemma3)
            MM_T("blk.%d.post_ffw_norm.weight", f32, 1, d, 1, 1.0f, 0.1f);
    }
#undef MM_T
    return n;
}

int64_t eng_model_make_n_params(const eng_model_make_params *p)
{
    mm_tensor t[32];
    int64_t total = 0;
    if (eng_model_make_validate(p, NULL) != SW_OK)
        return -1;
    for (int32_t layer = -1; layer <= p->n_layer; layer++) {
        int64_t n = mm_tensor_table(p, layer, t);
        for (int64_t i = 0; i < n; i++)
            total += t[i].ne[0] * t[i].ne[1] * t[i].ne[2];
    }
    return total;
}

/* ggml's file type ("mostly ...") for the weight type and mix. */
static uint32_t mm_file_type(uint32_t weight_type, eng_model_make_mix mix)
{
    if (mix == ENG_MIX_Q4_K_M)
        return 15;
    if (mix == ENG_MIX_Q5_K_M)
        return 17;
    if (mix == ENG_MIX_Q3_K_M)
        return 12;
    switch (weight_type) {
    case ENG_TYPE_F16:
        return 1;
    case ENG_TYPE_Q4_0:
        return 2;
    case ENG_TYPE_Q8_0:
        return 7;
    case ENG_TYPE_Q4_K: /* every matrix Q4_K: llama.cpp's nearest is Q4_K_S */
        return 14;
    case ENG_TYPE_Q5_K: /* likewise Q5_K_S */
        return 16;
    case ENG_TYPE_Q6_K:
        return 18;
    case ENG_TYPE_Q2_K:
        return 10;
    case ENG_TYPE_Q3_K: /* every matrix Q3_K: llama.cpp's Q3_K_S */
        return 11;
    case ENG_TYPE_IQ4_NL:
        return 25;
    case ENG_TYPE_IQ4_XS:
        return 30;
    case ENG_TYPE_MXFP4: /* llama.cpp's MXFP4_MOE (there every matrix is not) */
        return 38;
    case ENG_TYPE_BF16:
        return 32;
    default:
        return 0;
    }
}

static int mm_set_metadata(eng_gguf_writer *w, const eng_model_make_params *p, const mm_vocab *v,
                           const char **pieces)
{
    int rc = SW_OK;
    const uint32_t head_dim = (uint32_t)mm_head_dim(p);
    /* qwen2, qwen3 and phi3 files use their own key prefix; "llama3" is the llama
     * architecture (its RoPE factors are a tensor, mm_add_llama3_rope_freqs). */
    const bool qwen3 = p->architecture && strcmp(p->architecture, "qwen3") == 0;
    const bool qwen2 = p->architecture && strcmp(p->architecture, "qwen2") == 0;
    const bool phi3 = p->architecture && strcmp(p->architecture, "phi3") == 0;
    const bool gemma3 = p->architecture && strcmp(p->architecture, "gemma3") == 0;
    const bool qwen3moe = p->architecture && strcmp(p->architecture, "qwen3moe") == 0;
    const bool gpt_oss = p->architecture && strcmp(p->architecture, "gpt-oss") == 0;
    const char *a = qwen3 ? "qwen3" : qwen3moe ? "qwen3moe" : qwen2 ? "qwen2" : phi3 ? "phi3"
                    : gemma3 ? "gemma3" : gpt_oss ? "gpt-oss" : "llama";
    char key[96];
#define MM_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
#define MM_CHECK(call)                                                                          \
    do {                                                                                       \
        if ((rc = (call)) != SW_OK)                                                            \
            return rc;                                                                         \
    } while (0)
    MM_CHECK(eng_gguf_writer_set_str(w, "general.architecture", a));
    MM_CHECK(eng_gguf_writer_set_str(w, "general.name", p->name ? p->name : "spillway-synthetic"));
    MM_CHECK(eng_gguf_writer_set_str(w, "general.description",
                                     "spillway synthetic model (deterministic pseudo-random "
                                     "weights)"));
    MM_CHECK(eng_gguf_writer_set_u64(w, "spillway.synthetic_seed", p->seed));
    if (p->weight_scale > 0.0f && p->weight_scale != 1.0f) /* files without it stay as they were */
        MM_CHECK(eng_gguf_writer_set_f32(w, "spillway.synthetic_weight_scale", p->weight_scale));
    MM_CHECK(eng_gguf_writer_set_u32(w, "general.alignment", ENG_GGUF_DEFAULT_ALIGNMENT));
    MM_CHECK(eng_gguf_writer_set_u32(w, "general.file_type", mm_file_type(p->weight_type, p->mix)));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("context_length"), (uint32_t)p->n_ctx_train));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("embedding_length"), (uint32_t)p->n_embd));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("block_count"), (uint32_t)p->n_layer));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("feed_forward_length"), (uint32_t)p->n_ff));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("rope.dimension_count"), head_dim));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("attention.head_count"), (uint32_t)p->n_head));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv));
    /* The head size, as converted Qwen3 files write it (and any file whose
     * heads are not dim / heads wide). */
    if (qwen3 || qwen3moe || gemma3 || gpt_oss || p->head_dim != 0) {
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("attention.key_length"), head_dim));
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("attention.value_length"), head_dim));
    }
    MM_CHECK(eng_gguf_writer_set_f32(w, MM_KEY("attention.layer_norm_rms_epsilon"), p->rms_eps));
    MM_CHECK(eng_gguf_writer_set_f32(w, MM_KEY("rope.freq_base"), p->rope_freq_base));
    MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("vocab_size"), (uint32_t)p->n_vocab));
    if (gpt_oss) {
        /* YaRN as gpt-oss's files have it: factor 32 over an original
         * context of 4096 */
        MM_CHECK(eng_gguf_writer_set_str(w, MM_KEY("rope.scaling.type"), "yarn"));
        MM_CHECK(eng_gguf_writer_set_f32(w, MM_KEY("rope.scaling.factor"), 32.0f));
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("rope.scaling.original_context_length"),
                                         4096));
    }
    if (qwen3moe || gpt_oss) {
        /* the keys Qwen3-MoE's converted files have (no expert_weights_norm:
         * renormalised is the architecture's default) */
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("expert_count"), (uint32_t)p->n_expert));
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("expert_used_count"),
                                         (uint32_t)p->n_expert_used));
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("expert_feed_forward_length"),
                                         (uint32_t)p->n_ff));
    }
    if (p->sliding_window > 0)
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("attention.sliding_window"),
                                         (uint32_t)p->sliding_window));
    if (p->sliding_window_pattern > 0)
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("attention.sliding_window_pattern"),
                                         (uint32_t)p->sliding_window_pattern));
    if (p->final_logit_softcap > 0.0f)
        MM_CHECK(eng_gguf_writer_set_f32(w, MM_KEY("final_logit_softcapping"),
                                         p->final_logit_softcap));
    if (p->pooling)
        MM_CHECK(eng_gguf_writer_set_u32(w, MM_KEY("pooling_type"),
                                         (uint32_t)eng_pooling_from_name(p->pooling)));
#undef MM_KEY
    MM_CHECK(eng_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    MM_CHECK(eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", pieces, (uint64_t)v->n));
    MM_CHECK(eng_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v->score, (uint64_t)v->n));
    MM_CHECK(eng_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->type, (uint64_t)v->n));
    MM_CHECK(eng_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    MM_CHECK(eng_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
    MM_CHECK(eng_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    MM_CHECK(eng_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true));
    MM_CHECK(eng_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", p->add_eos));
    /* Gemma's SentencePiece files have no space prefix (the converter
     * writes add_space_prefix false) */
    MM_CHECK(eng_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", !gemma3));
#undef MM_CHECK
    return rc;
}

/* Llama 3's RoPE frequency divisors as the rope_freqs.weight tensor, which
 * is how files converted from Llama 3.1 and later carry them (no
 * rope.scaling.* keys): factor 8, low 1, high 4, original context 8192.
 * row has room for head_dim / 2 floats. */
static int mm_add_llama3_rope_freqs(eng_gguf_writer *w, const eng_model_make_params *p,
                                    float *row, sw_error *err)
{
    const int64_t head_dim = mm_head_dim(p), n = head_dim / 2;
    for (int64_t i = 0; i < n; i++) {
        float freq = powf(p->rope_freq_base, -2.0f * (float)i / (float)head_dim);
        row[i] = eng_rope_llama3_factor(freq, 8.0f, 1.0f, 4.0f, 8192.0f);
    }
    const int64_t ne[1] = {n};
    int rc = eng_gguf_writer_add_tensor(w, "rope_freqs.weight", ENG_TYPE_F32, 1, ne, row,
                                        sizeof(float) * (size_t)n);
    if (rc != SW_OK)
        sw_error_set(err, rc, "model make: cannot add tensor rope_freqs.weight: %s",
                     sw_strerror(rc));
    return rc;
}

/* Builds the whole model into a writer (*out, eng_gguf_writer_free). */
static int mm_build(const eng_model_make_params *p, eng_gguf_writer **out, sw_error *err)
{
    mm_vocab v;
    const char **pieces = NULL;
    eng_gguf_writer *w = NULL;
    float *row = NULL, *head_scale = NULL;
    void *data = NULL;
    int rc = eng_model_make_validate(p, err);
    if (rc != SW_OK)
        return rc;
    memset(&v, 0, sizeof v);
    if ((rc = mm_vocab_build(&v, p->n_vocab)) != SW_OK) {
        sw_error_set(err, rc, "model make: cannot build the vocabulary: %s", sw_strerror(rc));
        goto fail;
    }
    if (v.n != p->n_vocab) {
        rc = sw_error_set(err, SW_EINTERNAL, "model make: vocabulary has %d pieces, wanted %d",
                          v.n, p->n_vocab);
        goto fail;
    }
    pieces = sw_calloc((size_t)v.n, sizeof *pieces);
    w = eng_gguf_writer_create();
    int64_t max_row = p->n_embd > p->n_ff ? p->n_embd : p->n_ff;
    if ((int64_t)p->n_head * mm_head_dim(p) > max_row) /* attn_output's rows */
        max_row = (int64_t)p->n_head * mm_head_dim(p);
    if (p->n_expert > max_row) /* gpt-oss's router bias */
        max_row = p->n_expert;
    row = sw_malloc(sizeof(float) * (size_t)max_row);
    head_scale = sw_malloc(sizeof(float) * (size_t)v.n);
    if (!pieces || !w || !row || !head_scale) {
        rc = sw_error_set(err, SW_ENOMEM, "model make: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < v.n; i++) {
        pieces[i] = v.text + v.offset[i];
        head_scale[i] = v.is_word[i] ? 1.0f : v.type[i] == 1 ? 0.5f : 0.25f;
    }
    if ((rc = mm_set_metadata(w, p, &v, pieces)) != SW_OK) {
        sw_error_set(err, rc, "model make: cannot set metadata: %s", sw_strerror(rc));
        goto fail;
    }
    for (int32_t layer = -1; layer <= p->n_layer; layer++) {
        mm_tensor t[32];
        int64_t n = mm_tensor_table(p, layer, t);
        for (int64_t i = 0; i < n; i++) {
            size_t size = 0;
            if (strcmp(t[i].name, p->tied_output ? "token_embd.weight" : "output.weight") == 0)
                t[i].row_scale = head_scale;
            if ((rc = mm_tensor_generate(&t[i], p->seed, row, &data, &size)) != SW_OK) {
                sw_error_set(err, rc, "model make: cannot generate %s: %s", t[i].name,
                             sw_strerror(rc));
                goto fail;
            }
            rc = eng_gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne, data,
                                            size);
            sw_free(data);
            data = NULL;
            if (rc != SW_OK) {
                sw_error_set(err, rc, "model make: cannot add tensor %s: %s", t[i].name,
                             sw_strerror(rc));
                goto fail;
            }
        }
    }
    if (p->architecture && strcmp(p->architecture, "llama3") == 0 &&
        (rc = mm_add_llama3_rope_freqs(w, p, row, err)) != SW_OK)
        goto fail;
    *out = w;
    w = NULL;
    rc = SW_OK;
fail:
    eng_gguf_writer_free(w);
    sw_free(row);
    sw_free(head_scale);
    sw_free(pieces);
    mm_vocab_free(&v);
    return rc;
}

int eng_model_make(const eng_model_make_params *p, const char *path, sw_error *err)
{
    eng_gguf_writer *w = NULL;
    if (!path)
        return sw_error_set(err, SW_EINVAL, "model make: no output path");
    int rc = mm_build(p, &w, err);
    if (rc != SW_OK)
        return rc;
    rc = eng_gguf_writer_write(w, path, err);
    eng_gguf_writer_free(w);
    return rc;
}

int eng_model_make_to_memory(const eng_model_make_params *p, void **out, size_t *out_size,
                             sw_error *err)
{
    eng_gguf_writer *w = NULL;
    if (!out || !out_size)
        return sw_error_set(err, SW_EINVAL, "model make: no output buffer");
    int rc = mm_build(p, &w, err);
    if (rc != SW_OK)
        return rc;
    rc = eng_gguf_writer_to_memory(w, out, out_size, err);
    eng_gguf_writer_free(w);
    return rc;
}
