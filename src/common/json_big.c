/* json_big.c - number literals past jansson's range, kept as marker
 * strings (json_big.h). */
#include "common/json_big.h"

#include "common/alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NUL, 16 hex digits of the tag, '#' */
#define TAG_LEN 18
/* longest literal kept: the schema compiler's decimals hold 400 digits */
#define MAX_LITERAL 512

static char tag[TAG_LEN + 1];
static char tag_escaped[6 + TAG_LEN]; /* "\u0000" + hex + '#', as jansson dumps it */
static pthread_once_t tag_once = PTHREAD_ONCE_INIT;
static atomic_bool any_made; /* a marker was made: dumps are scanned */

static void tag_init(void)
{
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ (uint64_t)ts.tv_sec ^
            (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&r;
    }
    if (fd >= 0)
        close(fd);
    tag[0] = '\0';
    snprintf(tag + 1, sizeof tag - 1, "%016llx#", (unsigned long long)r);
    snprintf(tag_escaped, sizeof tag_escaped, "\\u0000%s", tag + 1);
}

/* The number literal at p (JSON's grammar checked loosely: jansson checks
 * it again on the rewritten text); its length. */
static size_t number_len(const char *p, const char *end)
{
    const char *q = p;
    while (q < end && (strchr("0123456789+-.eE", *q) && *q))
        q++;
    return (size_t)(q - p);
}

/* Whether jansson refuses this literal as out of range. */
static bool out_of_range(const char *p, size_t n)
{
    char t[MAX_LITERAL + 1];
    if (n > MAX_LITERAL)
        return true; /* past any int64 and (rewritten) refused later by length */
    memcpy(t, p, n);
    t[n] = '\0';
    errno = 0;
    if (!strpbrk(t, ".eE")) {
        (void)strtoll(t, NULL, 10);
        return errno == ERANGE;
    }
    double d = strtod(t, NULL);
    return errno == ERANGE && isinf(d);
}

/* Every string under v passes ok. */
static bool strings_all(const json_t *v, bool (*ok)(const json_t *), int depth)
{
    const char *k;
    json_t *e;
    size_t i;
    if (depth > 2048)
        return false; /* not from a body the parser took */
    if (json_is_string(v))
        return ok(v);
    json_array_foreach((json_t *)v, i, e) {
        if (!strings_all(e, ok, depth + 1))
            return false;
    }
    json_object_foreach((json_t *)v, k, e) {
        if (!strings_all(e, ok, depth + 1))
            return false;
    }
    return true;
}

/* A marker, or a string without NUL. */
static bool nul_free_string(const json_t *v)
{
    return sw_json_big_text(v) || !memchr(json_string_value(v), 0, json_string_length(v));
}

static bool not_marker(const json_t *v)
{
    return !sw_json_big_text(v);
}

json_t *sw_json_loadb_big(const char *buffer, size_t len, size_t flags, json_error_t *error)
{
    json_error_t local;
    json_error_t *e = error ? error : &local;
    json_t *j = sw_json_loadb(buffer, len, flags, e);
    if (j || !sw_json_error_number_range(e))
        return j;
    pthread_once(&tag_once, tag_init);
    /* each literal grows by the quotes, the escaped NUL and the tag */
    size_t cap = 0, n_big = 0;
    const char *end = buffer + len;
    bool in_string = false;
    for (const char *p = buffer; p < end;) {
        if (in_string) {
            if (*p == '\\' && p + 1 < end)
                p += 2;
            else
                in_string = *p++ != '"';
            continue;
        }
        if (*p == '"') {
            in_string = true;
            p++;
            continue;
        }
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            size_t n = number_len(p, end);
            if (out_of_range(p, n)) {
                if (n > MAX_LITERAL)
                    return j; /* the range error stands */
                n_big++;
            }
            p += n;
            continue;
        }
        p++;
    }
    if (n_big == 0 || n_big > (SIZE_MAX - len) / (TAG_LEN + 8))
        return j;
    cap = len + n_big * (TAG_LEN + 8);
    char *out = sw_malloc(cap + 1);
    if (!out) {
        /* the code lives in the text's last byte (jansson.h, json_error_code) */
        snprintf(e->text, JSON_ERROR_TEXT_LENGTH - 1, "out of memory");
        e->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
        return NULL;
    }
    size_t o = 0;
    in_string = false;
    for (const char *p = buffer; p < end;) {
        if (in_string) {
            if (*p == '\\' && p + 1 < end) {
                out[o++] = *p++;
                out[o++] = *p++;
            } else {
                in_string = *p != '"';
                out[o++] = *p++;
            }
            continue;
        }
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            size_t n = number_len(p, end);
            if (out_of_range(p, n)) {
                o += (size_t)sprintf(out + o, "\"%s", tag_escaped);
                memcpy(out + o, p, n);
                o += n;
                out[o++] = '"';
            } else {
                memcpy(out + o, p, n);
                o += n;
            }
            p += n;
            continue;
        }
        in_string = *p == '"';
        out[o++] = *p++;
    }
    atomic_store(&any_made, true);
    /* markers hold a NUL: a caller that refuses \u0000 has it refused
     * below, in its own strings only */
    j = sw_json_loadb(out, o, flags | JSON_ALLOW_NUL, e);
    sw_free(out);
    if (j && !(flags & JSON_ALLOW_NUL) && !strings_all(j, nul_free_string, 0)) {
        json_decref(j);
        snprintf(e->text, JSON_ERROR_TEXT_LENGTH - 1,
                 "\\u0000 is not allowed without JSON_ALLOW_NUL");
        e->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_null_character;
        e->line = e->column = -1;
        return NULL;
    }
    return j;
}

const char *sw_json_big_text(const json_t *v)
{
    if (!json_is_string(v) || !atomic_load(&any_made))
        return NULL;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n <= TAG_LEN || memcmp(s, tag, TAG_LEN) != 0)
        return NULL;
    return s + TAG_LEN;
}

size_t sw__json_big_restore(char *text, size_t len)
{
    if (!atomic_load(&any_made))
        return len;
    size_t el = strlen(tag_escaped), o = 0;
    for (size_t i = 0; i < len;) {
        /* "\u0000<tag>#123": the quote before, the number, the quote after */
        if (text[i] == '"' && i + 1 + el < len && memcmp(text + i + 1, tag_escaped, el) == 0) {
            size_t k = i + 1 + el;
            while (k < len && text[k] != '"')
                text[o++] = text[k++];
            i = k + 1;
            continue;
        }
        text[o++] = text[i++];
    }
    text[o] = '\0';
    return o;
}

/* No marker under v. */
static bool big_free(const json_t *v, int depth)
{
    return strings_all(v, not_marker, depth);
}

/* An object whose member `schema_key` is a schema: the other members. */
static bool big_free_holder(const json_t *v, const char *schema_key)
{
    const char *k;
    json_t *e;
    if (!json_is_object(v))
        return big_free(v, 1);
    json_object_foreach((json_t *)v, k, e) {
        if (strcmp(k, schema_key) != 0 && !big_free(e, 2))
            return false;
    }
    return true;
}

const char *sw_json_big_field(const json_t *body)
{
    const char *k, *k2;
    json_t *v, *v2, *e;
    size_t i;
    if (!atomic_load(&any_made))
        return NULL;
    json_object_foreach((json_t *)body, k, v) {
        bool ok = true;
        if (strcmp(k, "response_format") == 0 && json_is_object(v)) {
            json_object_foreach(v, k2, v2) {
                if (ok)
                    ok = strcmp(k2, "json_schema") == 0 ? big_free_holder(v2, "schema")
                                                         : big_free(v2, 1);
            }
        } else if (strcmp(k, "tools") == 0 && json_is_array(v)) {
            json_array_foreach(v, i, e) {
                if (!json_is_object(e)) {
                    ok = ok && big_free(e, 1);
                    continue;
                }
                json_object_foreach(e, k2, v2) {
                    if (ok)
                        ok = strcmp(k2, "function") == 0 ? big_free_holder(v2, "parameters")
                                                          : big_free(v2, 1);
                }
            }
        } else {
            ok = big_free(v, 0);
        }
        if (!ok)
            return k;
    }
    return NULL;
}
