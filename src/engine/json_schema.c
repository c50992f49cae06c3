/* json_schema.c - compiles a JSON Schema subset into the node graph of
 * constrain-impl.h (see json_schema.h for the subset and why).
 *
 * Children are compiled before their parent node is created, so every
 * node's children have lower indices and each node's minimum length can be
 * computed once, at creation. Errors carry a JSON pointer ("#/properties/
 * a/items") to the offending keyword.
 */
#include "engine/json_schema.h"

#include "common/alloc.h"
#include "engine/constrain-impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Minimum lengths saturate here: a value this long can never be generated
 * anyway, and sums of several stay far from overflow. */
#define CS_LEN_CAP (INT32_MAX / 8)

static int32_t len_add(int64_t a, int64_t b)
{
    int64_t s = a + b;
    return s > CS_LEN_CAP ? CS_LEN_CAP : (int32_t)s;
}

static int32_t len_mul(int64_t a, int64_t b)
{
    if (a == 0 || b == 0)
        return 0;
    if (a > CS_LEN_CAP / b)
        return CS_LEN_CAP;
    return len_add(a * b, 0);
}

static void node_clear(cs_node *n)
{
    for (int32_t i = 0; i < n->n_props; i++)
        sw_free(n->keys ? n->keys[i] : NULL);
    sw_free(n->keys);
    sw_free(n->key_lens);
    sw_free(n->children);
    sw_free(n->required);
    sw_free(n->req_from);
    sw_free(n->any_from);
    sw_free(n->next_req);
    for (int32_t i = 0; i < n->n_lits; i++)
        sw_free(n->lits ? n->lits[i] : NULL);
    sw_free(n->lits);
    sw_free(n->lit_lens);
    sw_free(n->alts);
}

void eng_grammar_free(eng_grammar *g)
{
    if (!g)
        return;
    for (int32_t i = 0; i < g->n_nodes; i++)
        node_clear(&g->nodes[i]);
    sw_free(g->nodes);
    sw_free(g);
}

int64_t eng_grammar_min_bytes(const eng_grammar *g)
{
    return g->nodes[g->root].min_bytes;
}

static eng_grammar *grammar_new(void)
{
    eng_grammar *g = sw_calloc(1, sizeof *g);
    if (!g)
        return NULL;
    for (int i = 0; i <= ENG_CS_ANY_DEPTH; i++)
        g->any_cache[i] = -1;
    g->any_key = -1;
    g->root = -1;
    return g;
}

/* Appends a node (moved in: on failure its arrays are freed). Returns its
 * index, or -1 out of memory. Children must already exist. */
static int32_t add_node(eng_grammar *g, cs_node *n)
{
    if (g->n_nodes == g->cap_nodes) {
        int32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        cs_node *p = sw_realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p) {
            node_clear(n);
            return -1;
        }
        g->nodes = p;
        g->cap_nodes = cap;
    }
    /* The minimum serialized length. */
    int64_t m = 0;
    switch (n->kind) {
    case CS_OBJECT:
        m = 2 + (n->next_req[0] < n->n_props ? n->req_from[0] - 1 : 0);
        break;
    case CS_ANYOBJ: m = 2; break;
    case CS_ARRAY:
        m = len_add(2, len_add(len_mul(n->min_items, g->nodes[n->item].min_bytes),
                               n->min_items > 0 ? n->min_items - 1 : 0));
        break;
    case CS_STRING: m = len_add(2, n->min_chars); break;
    case CS_NUMBER:
    case CS_INTEGER: m = 1; break;
    case CS_LITERALS:
        m = CS_LEN_CAP;
        for (int32_t i = 0; i < n->n_lits; i++)
            if (n->lit_lens[i] < m)
                m = n->lit_lens[i];
        break;
    case CS_ANYOF:
        m = CS_LEN_CAP;
        for (int32_t i = 0; i < n->n_alts; i++)
            if (g->nodes[n->alts[i]].min_bytes < m)
                m = g->nodes[n->alts[i]].min_bytes;
        break;
    }
    n->min_bytes = len_add(m, 0);
    n->n_branches = 1;
    if (n->kind == CS_ANYOF) {
        int64_t b = 0;
        for (int32_t i = 0; i < n->n_alts; i++)
            b += g->nodes[n->alts[i]].n_branches;
        n->n_branches = b > INT32_MAX ? INT32_MAX : (int32_t)b;
    }
    g->nodes[g->n_nodes] = *n;
    return g->n_nodes++;
}

/* ---- errors and paths ---------------------------------------------------- */

typedef struct builder {
    eng_grammar *g;
    sw_error *err;
    int32_t anyof_nesting;
    char path[256];
} builder;

/* Appends "/seg" (JSON pointer escaping) to the path at len; returns the new
 * length (the path is cut short, never overflowed). */
static size_t pointer_push(char *path, size_t cap, size_t len, const char *seg)
{
    if (len + 1 < cap)
        path[len++] = '/';
    for (const char *p = seg; *p && len + 2 < cap; p++) {
        if (*p == '~' || *p == '/') {
            path[len++] = '~';
            path[len++] = *p == '~' ? '0' : '1';
        } else {
            path[len++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        }
    }
    path[len] = '\0';
    return len;
}

static size_t path_push(builder *b, size_t len, const char *seg)
{
    return pointer_push(b->path, sizeof b->path, len, seg);
}

static size_t path_push_index(builder *b, size_t len, size_t i)
{
    char seg[24];
    snprintf(seg, sizeof seg, "%zu", i);
    return path_push(b, len, seg);
}

static int fail_at(builder *b, size_t len, int code, const char *what)
{
    b->path[len] = '\0';
    return sw_error_set(b->err, code, "%s (at %s)", what, b->path);
}

/* A text copy of a JSON value (compact), sw_malloc'd. */
static char *dump_value(const json_t *v, int32_t *len_out)
{
    char *j = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!j)
        return NULL;
    size_t n = strlen(j);
    char *copy = n < (size_t)CS_LEN_CAP ? sw_strndup(j, n) : NULL;
    free(j);
    if (copy)
        *len_out = (int32_t)n;
    return copy;
}

/* ---- node makers ---------------------------------------------------------- */

static int32_t make_literals(eng_grammar *g, const json_t *const *vals, size_t n)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_LITERALS;
    nd.lits = sw_calloc(n ? n : 1, sizeof *nd.lits);
    nd.lit_lens = sw_calloc(n ? n : 1, sizeof *nd.lit_lens);
    if (!nd.lits || !nd.lit_lens) {
        node_clear(&nd);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        nd.lits[i] = dump_value(vals[i], &nd.lit_lens[i]);
        nd.n_lits = (int32_t)i + 1;
        if (!nd.lits[i]) {
            node_clear(&nd);
            return -1;
        }
    }
    return add_node(g, &nd);
}

static int32_t make_simple(eng_grammar *g, cs_kind kind)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = kind;
    return add_node(g, &nd);
}

static int32_t make_string(eng_grammar *g, int32_t min_chars, int32_t max_chars)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_STRING;
    nd.min_chars = min_chars;
    nd.max_chars = max_chars;
    return add_node(g, &nd);
}

static int32_t make_anyof(eng_grammar *g, const int32_t *alts, int32_t n)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_ANYOF;
    nd.alts = sw_malloc((size_t)(n ? n : 1) * sizeof *nd.alts);
    if (!nd.alts)
        return -1;
    memcpy(nd.alts, alts, (size_t)n * sizeof *alts);
    nd.n_alts = n;
    return add_node(g, &nd);
}

static int32_t make_bool(eng_grammar *g)
{
    json_t *t = json_true(), *f = json_false();
    const json_t *v[2] = {t, f};
    return make_literals(g, v, 2);
}

/* Any JSON value nested at most `levels` deep (objects and arrays at
 * levels > 0 only), cached per level. */
static int32_t make_any(eng_grammar *g, int32_t levels)
{
    if (levels < 0)
        levels = 0;
    if (levels > ENG_CS_ANY_DEPTH)
        levels = ENG_CS_ANY_DEPTH;
    if (g->any_cache[levels] >= 0)
        return g->any_cache[levels];
    int32_t alts[5], n = 0;
    if (levels > 0) {
        int32_t inner = make_any(g, levels - 1);
        if (inner < 0)
            return -1;
        if (g->any_key < 0 && (g->any_key = make_string(g, 0, INT32_MAX)) < 0)
            return -1;
        cs_node obj;
        memset(&obj, 0, sizeof obj);
        obj.kind = CS_ANYOBJ;
        obj.item = inner;
        obj.key_node = g->any_key;
        if ((alts[n++] = add_node(g, &obj)) < 0)
            return -1;
        cs_node arr;
        memset(&arr, 0, sizeof arr);
        arr.kind = CS_ARRAY;
        arr.item = inner;
        arr.max_items = INT32_MAX;
        if ((alts[n++] = add_node(g, &arr)) < 0)
            return -1;
    }
    if ((alts[n++] = make_string(g, 0, INT32_MAX)) < 0 || (alts[n++] = make_simple(g, CS_NUMBER)) < 0)
        return -1;
    json_t *t = json_true(), *f = json_false(), *z = json_null();
    const json_t *lits[3] = {t, f, z};
    if ((alts[n++] = make_literals(g, lits, 3)) < 0)
        return -1;
    int32_t any = make_anyof(g, alts, n);
    if (any >= 0)
        g->any_cache[levels] = any;
    return any;
}

/* An object with levels of nesting below it (json_object mode, schemas
 * with type object and no properties). */
static int32_t make_any_object(eng_grammar *g, int32_t levels)
{
    int32_t inner = make_any(g, levels - 1);
    if (inner < 0)
        return -1;
    if (g->any_key < 0 && (g->any_key = make_string(g, 0, INT32_MAX)) < 0)
        return -1;
    cs_node obj;
    memset(&obj, 0, sizeof obj);
    obj.kind = CS_ANYOBJ;
    obj.item = inner;
    obj.key_node = g->any_key;
    return add_node(g, &obj);
}

/* Levels of free nesting that fit below a value in frame `depth`: each
 * level takes a frame, and an object's key string one more. */
static int32_t any_levels(int32_t depth)
{
    int32_t room = ENG_CS_MAX_DEPTH - depth - 2;
    if (room > ENG_CS_ANY_DEPTH)
        room = ENG_CS_ANY_DEPTH;
    return room < 0 ? 0 : room;
}

/* ---- the compiler ----------------------------------------------------------- */

static const char *const ignored_keywords[] = {
    "description", "title", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "nullable", "additionalProperties",
};

static const char *const handled_keywords[] = {
    "type", "properties", "required", "items", "minItems", "maxItems", "minLength",
    "maxLength", "enum", "const", "anyOf", "oneOf", "uniqueItems",
};

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}

/* The first keyword of schema object s that neither the compiler nor the
 * validator handles (uniqueItems only as false), or NULL. */
static const char *unsupported_keyword(const json_t *s)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (in_list(key, ignored_keywords, sizeof ignored_keywords / sizeof *ignored_keywords))
            continue;
        if (!in_list(key, handled_keywords, sizeof handled_keywords / sizeof *handled_keywords) ||
            (strcmp(key, "uniqueItems") == 0 && !json_is_false(v)))
            return key;
    }
    return NULL;
}

static int compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);

/* A non-negative integer keyword, clamped to INT32_MAX; absent: dflt. */
static int get_count(builder *b, const json_t *s, const char *key, size_t plen, int32_t dflt,
                     int32_t *out)
{
    const json_t *v = json_object_get(s, key);
    if (!v) {
        *out = dflt;
        return SW_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        size_t l = path_push(b, plen, key);
        return fail_at(b, l, SW_EINVAL, "expected a non-negative integer");
    }
    json_int_t i = json_integer_value(v);
    *out = i > INT32_MAX ? INT32_MAX : (int32_t)i;
    return SW_OK;
}

static bool type_matches(const json_t *v, const char *type)
{
    if (strcmp(type, "string") == 0)
        return json_is_string(v);
    if (strcmp(type, "integer") == 0) {
        if (json_is_integer(v))
            return true;
        if (json_is_real(v)) {
            /* a whole number (1.0, 1e300); the cast to long long this
             * replaces was undefined beyond its range */
            double d = json_real_value(v);
            return isfinite(d) && d == floor(d);
        }
        return false;
    }
    if (strcmp(type, "number") == 0)
        return json_is_number(v);
    if (strcmp(type, "boolean") == 0)
        return json_is_boolean(v);
    if (strcmp(type, "null") == 0)
        return json_is_null(v);
    if (strcmp(type, "object") == 0)
        return json_is_object(v);
    if (strcmp(type, "array") == 0)
        return json_is_array(v);
    return false;
}

/* enum / const, keeping only the values of the allowed types (types NULL:
 * all). */
static int compile_literals(builder *b, const json_t *s, const json_t *types, size_t plen,
                            int32_t *out)
{
    const json_t *c = json_object_get(s, "const");
    const json_t *e = json_object_get(s, "enum");
    const char *key = c ? "const" : "enum";
    size_t n = c ? 1 : json_array_size(e);
    if (!c && !json_is_array(e)) {
        size_t l = path_push(b, plen, "enum");
        return fail_at(b, l, SW_EINVAL, "'enum' must be an array");
    }
    /* every generated byte is checked against each literal: a bound keeps
     * a request from making every token slow */
    if (n > 4096)
        return fail_at(b, path_push(b, plen, "enum"), SW_EUNSUPPORTED,
                       "more than 4096 enum values");
    const json_t **vals = sw_calloc(n ? n : 1, sizeof *vals);
    if (!vals)
        return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = c ? c : json_array_get(e, i);
        bool ok = types == NULL;
        if (json_is_string(types))
            ok = type_matches(v, json_string_value(types));
        for (size_t t = 0; json_is_array(types) && t < json_array_size(types); t++)
            ok |= json_is_string(json_array_get(types, t)) &&
                  type_matches(v, json_string_value(json_array_get(types, t)));
        if (ok)
            vals[kept++] = v;
    }
    int rc = SW_OK;
    if (kept == 0) {
        size_t l = path_push(b, plen, key);
        rc = fail_at(b, l, SW_EINVAL, "no value of the enum/const matches the schema's type");
    } else if ((*out = make_literals(b->g, vals, kept)) < 0) {
        rc = sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
    }
    sw_free(vals);
    return rc;
}

static int compile_object(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    eng_grammar *g = b->g;
    if (props && !json_is_object(props))
        return fail_at(b, path_push(b, plen, "properties"), SW_EINVAL,
                       "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail_at(b, path_push(b, plen, "required"), SW_EINVAL,
                       "'required' must be an array of strings");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r))
            return fail_at(b, path_push_index(b, path_push(b, plen, "required"), i), SW_EINVAL,
                           "'required' must be an array of strings");
        if (!json_object_get(props, json_string_value(r)))
            return fail_at(b, path_push_index(b, path_push(b, plen, "required"), i),
                           SW_EUNSUPPORTED,
                           "a required property without a schema in 'properties' is not "
                           "supported");
    }
    size_t n = json_object_size(props);
    if (n == 0) {
        const json_t *addl = json_object_get(s, "additionalProperties");
        if (json_is_false(addl) || json_is_object(addl)) {
            /* Only {} is surely valid. */
            cs_node nd;
            memset(&nd, 0, sizeof nd);
            nd.kind = CS_OBJECT;
            nd.req_from = sw_calloc(1, sizeof *nd.req_from);
            nd.any_from = sw_calloc(1, sizeof *nd.any_from);
            nd.next_req = sw_calloc(1, sizeof *nd.next_req);
            if (!nd.req_from || !nd.any_from || !nd.next_req) {
                node_clear(&nd);
                return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
            }
            nd.any_from[0] = CS_LEN_CAP;
            if ((*out = add_node(g, &nd)) < 0)
                return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
            return SW_OK;
        }
        if ((*out = make_any_object(g, any_levels(depth) > 0 ? any_levels(depth) : 1)) < 0)
            return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        return SW_OK;
    }
    if (n > 4096)
        return fail_at(b, path_push(b, plen, "properties"), SW_EUNSUPPORTED,
                       "more than 4096 properties");
    cs_node nd;
    json_t *req_set = NULL;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_OBJECT;
    nd.keys = sw_calloc(n, sizeof *nd.keys);
    nd.key_lens = sw_calloc(n, sizeof *nd.key_lens);
    nd.children = sw_calloc(n, sizeof *nd.children);
    nd.required = sw_calloc(n, sizeof *nd.required);
    nd.req_from = sw_calloc(n + 1, sizeof *nd.req_from);
    nd.any_from = sw_calloc(n + 1, sizeof *nd.any_from);
    nd.next_req = sw_calloc(n + 1, sizeof *nd.next_req);
    int rc = SW_OK;
    if (!nd.keys || !nd.key_lens || !nd.children || !nd.required || !nd.req_from ||
        !nd.any_from || !nd.next_req) {
        rc = sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        goto fail;
    }
    /* The required names as a set: a lookup per property instead of a
     * scan of 'required' (properties x required strcmp took seconds for a
     * 1 MiB body). */
    req_set = json_object();
    if (!req_set) {
        rc = sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        goto fail;
    }
    for (size_t r = 0; r < json_array_size(req); r++)
        if (json_object_set_new(req_set, json_string_value(json_array_get(req, r)), json_true())) {
            rc = sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
            goto fail;
        }
    const char *key;
    const json_t *sub;
    size_t i = 0;
    size_t plen_props = path_push(b, plen, "properties");
    json_object_foreach((json_t *)props, key, sub) {
        json_t *ks = json_string(key);
        int32_t kl = 0;
        char *text = ks ? dump_value(ks, &kl) : NULL;
        json_decref(ks);
        char *k = text ? sw_malloc((size_t)kl + 2) : NULL;
        if (!k) {
            sw_free(text);
            rc = sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
            goto fail;
        }
        memcpy(k, text, (size_t)kl);
        k[kl] = ':';
        k[kl + 1] = '\0';
        sw_free(text);
        nd.keys[i] = k;
        nd.key_lens[i] = kl + 1;
        nd.n_props = (int32_t)i + 1;
        nd.required[i] = json_object_get(req_set, key) != NULL;
        size_t l = path_push(b, plen_props, key);
        if ((rc = compile(b, sub, depth + 1, l, &nd.children[i])))
            goto fail;
        i++;
    }
    nd.req_from[n] = 0;
    nd.any_from[n] = CS_LEN_CAP;
    nd.next_req[n] = (int32_t)n;
    for (size_t j = n; j-- > 0;) {
        int32_t one = len_add(nd.key_lens[j], g->nodes[nd.children[j]].min_bytes);
        nd.req_from[j] = nd.required[j] ? len_add(len_add(1, one), nd.req_from[j + 1])
                                         : nd.req_from[j + 1];
        nd.any_from[j] = one < nd.any_from[j + 1] ? one : nd.any_from[j + 1];
        nd.next_req[j] = nd.required[j] ? (int32_t)j : nd.next_req[j + 1];
    }
    json_decref(req_set);
    if ((*out = add_node(g, &nd)) < 0)
        return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
    return SW_OK;
fail:
    json_decref(req_set);
    node_clear(&nd);
    return rc;
}

static int compile_typed(builder *b, const json_t *s, const char *type, int32_t depth, size_t plen,
                         int32_t *out)
{
    eng_grammar *g = b->g;
    int rc;
    if (strcmp(type, "object") == 0)
        return compile_object(b, s, depth, plen, out);
    if (strcmp(type, "array") == 0) {
        const json_t *items = json_object_get(s, "items");
        cs_node nd;
        memset(&nd, 0, sizeof nd);
        nd.kind = CS_ARRAY;
        if ((rc = get_count(b, s, "minItems", plen, 0, &nd.min_items)) ||
            (rc = get_count(b, s, "maxItems", plen, INT32_MAX, &nd.max_items)))
            return rc;
        if (nd.min_items > nd.max_items)
            return fail_at(b, path_push(b, plen, "minItems"), SW_EINVAL,
                           "minItems is larger than maxItems");
        if (json_is_array(items))
            return fail_at(b, path_push(b, plen, "items"), SW_EUNSUPPORTED,
                           "tuple 'items' (an array of schemas) is not supported");
        if (items) {
            if ((rc = compile(b, items, depth + 1, path_push(b, plen, "items"), &nd.item)))
                return rc;
        } else if ((nd.item = make_any(g, any_levels(depth + 1))) < 0) {
            return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        }
        if ((*out = add_node(g, &nd)) < 0)
            return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        return SW_OK;
    }
    if (strcmp(type, "string") == 0) {
        int32_t lo, hi;
        if ((rc = get_count(b, s, "minLength", plen, 0, &lo)) ||
            (rc = get_count(b, s, "maxLength", plen, INT32_MAX, &hi)))
            return rc;
        if (lo > hi)
            return fail_at(b, path_push(b, plen, "minLength"), SW_EINVAL,
                           "minLength is larger than maxLength");
        *out = make_string(g, lo, hi);
    } else if (strcmp(type, "number") == 0) {
        *out = make_simple(g, CS_NUMBER);
    } else if (strcmp(type, "integer") == 0) {
        *out = make_simple(g, CS_INTEGER);
    } else if (strcmp(type, "boolean") == 0) {
        *out = make_bool(g);
    } else if (strcmp(type, "null") == 0) {
        json_t *z = json_null();
        const json_t *v[1] = {z};
        *out = make_literals(g, v, 1);
    } else {
        return fail_at(b, path_push(b, plen, "type"), SW_EINVAL,
                       "unknown type (expected object, array, string, number, integer, "
                       "boolean or null)");
    }
    if (*out < 0)
        return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
    return SW_OK;
}

static int compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    int rc;
    if (depth + 1 > ENG_CS_MAX_DEPTH)
        return fail_at(b, plen, SW_EUNSUPPORTED, "the schema nests too deeply");
    if (json_is_true(s)) {
        if ((*out = make_any(g, any_levels(depth))) < 0)
            return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        return SW_OK;
    }
    if (json_is_false(s))
        return fail_at(b, plen, SW_EUNSUPPORTED, "the schema 'false' accepts no value");
    if (!json_is_object(s))
        return fail_at(b, plen, SW_EINVAL, "a schema must be an object");

    const char *key = unsupported_keyword(s);
    if (key) {
        char what[160];
        snprintf(what, sizeof what, "unsupported JSON-schema keyword '%.64s'", key);
        return fail_at(b, path_push(b, plen, key), SW_EUNSUPPORTED, what);
    }
    const json_t *any = json_object_get(s, "anyOf");
    const char *any_key = "anyOf";
    if (!any) {
        any = json_object_get(s, "oneOf");
        any_key = "oneOf";
    }
    const json_t *type = json_object_get(s, "type");
    if (any) {
        if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))
            return fail_at(b, path_push(b, plen, "oneOf"), SW_EUNSUPPORTED,
                           "anyOf together with oneOf is not supported");
        if (type || json_object_get(s, "enum") || json_object_get(s, "const") ||
            json_object_get(s, "properties"))
            return fail_at(b, path_push(b, plen, any_key), SW_EUNSUPPORTED,
                           "anyOf/oneOf next to type, enum, const or properties is not "
                           "supported (move them into the alternatives)");
        size_t n = json_array_size(any);
        size_t l = path_push(b, plen, any_key);
        if (!json_is_array(any) || n == 0)
            return fail_at(b, l, SW_EINVAL, "expected a non-empty array of schemas");
        if (n > 64)
            return fail_at(b, l, SW_EUNSUPPORTED, "more than 64 alternatives");
        if (b->anyof_nesting >= ENG_CS_MAX_ANYOF_NESTING)
            return fail_at(b, l, SW_EUNSUPPORTED, "anyOf/oneOf nested too deeply");
        int32_t alts[64];
        b->anyof_nesting++;
        for (size_t i = 0; i < n; i++) {
            if ((rc = compile(b, json_array_get(any, i), depth, path_push_index(b, l, i),
                              &alts[i]))) {
                b->anyof_nesting--;
                return rc;
            }
        }
        b->anyof_nesting--;
        if ((*out = make_anyof(g, alts, (int32_t)n)) < 0)
            return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        if (g->nodes[*out].n_branches > ENG_CS_MAX_BRANCHES)
            return fail_at(b, l, SW_EUNSUPPORTED,
                           "anyOf/oneOf alternatives expand to more than 64 branches");
        return SW_OK;
    }
    if (type && !json_is_string(type) && !json_is_array(type))
        return fail_at(b, path_push(b, plen, "type"), SW_EINVAL,
                       "'type' must be a string or an array of strings");
    for (size_t i = 0; json_is_array(type) && i < json_array_size(type); i++) {
        if (!json_is_string(json_array_get(type, i)))
            return fail_at(b, path_push_index(b, path_push(b, plen, "type"), i), SW_EINVAL,
                           "'type' must be a string or an array of strings");
        /* Unique, as JSON Schema requires: each entry compiles the same
         * subschemas again, so a repeated "object" nested a few levels
         * would multiply the work and the nodes (7 per level). */
        for (size_t j = 0; j < i; j++)
            if (json_equal(json_array_get(type, i), json_array_get(type, j)))
                return fail_at(b, path_push_index(b, path_push(b, plen, "type"), i), SW_EINVAL,
                               "'type' lists a type twice");
    }
    if (json_is_array(type) && json_array_size(type) == 0)
        return fail_at(b, path_push(b, plen, "type"), SW_EINVAL, "'type' is an empty array");
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return compile_literals(b, s, type, plen, out);
    if (json_is_string(type))
        return compile_typed(b, s, json_string_value(type), depth, plen, out);
    if (json_is_array(type)) {
        size_t n = json_array_size(type);
        if (n > 7)
            return fail_at(b, path_push(b, plen, "type"), SW_EINVAL, "too many types");
        int32_t alts[8];
        for (size_t i = 0; i < n; i++)
            if ((rc = compile_typed(b, s, json_string_value(json_array_get(type, i)), depth, plen,
                                    &alts[i])))
                return rc;
        if (n == 1) {
            *out = alts[0];
            return SW_OK;
        }
        if ((*out = make_anyof(g, alts, (int32_t)n)) < 0)
            return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
        return SW_OK;
    }
    /* No type: infer it from the keywords, else any value. */
    if (json_object_get(s, "properties") || json_object_get(s, "required"))
        return compile_typed(b, s, "object", depth, plen, out);
    if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems"))
        return compile_typed(b, s, "array", depth, plen, out);
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        return compile_typed(b, s, "string", depth, plen, out);
    if ((*out = make_any(g, any_levels(depth))) < 0)
        return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
    return SW_OK;
}

int eng_grammar_from_schema(const json_t *schema, eng_grammar **out, sw_error *err)
{
    builder b;
    memset(&b, 0, sizeof b);
    b.err = err;
    strcpy(b.path, "#");
    if (!schema || !out)
        return sw_error_set(err, SW_EINVAL, "eng_grammar_from_schema: NULL argument");
    if (!(b.g = grammar_new()))
        return sw_error_set(err, SW_ENOMEM, "out of memory compiling the schema");
    int rc = compile(&b, schema, 1, 1, &b.g->root);
    if (rc) {
        eng_grammar_free(b.g);
        return rc;
    }
    *out = b.g;
    return SW_OK;
}

int eng_grammar_json_object(eng_grammar **out, sw_error *err)
{
    eng_grammar *g = grammar_new();
    if (!g || (g->root = make_any_object(g, any_levels(1))) < 0) {
        eng_grammar_free(g);
        return sw_error_set(err, SW_ENOMEM, "out of memory building the json_object grammar");
    }
    *out = g;
    return SW_OK;
}

int eng_grammar_tool_call(const eng_grammar_tool *tools, size_t n_tools, eng_grammar **out,
                          sw_error *err)
{
    builder b;
    memset(&b, 0, sizeof b);
    b.err = err;
    if (!tools || n_tools == 0 || !out)
        return sw_error_set(err, SW_EINVAL, "eng_grammar_tool_call: no tools");
    if (n_tools > 64)
        return sw_error_set(err, SW_EUNSUPPORTED, "at most 64 tools can be offered at once");
    if (!(b.g = grammar_new()))
        return sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
    eng_grammar *g = b.g;
    int32_t wrappers[64];
    int rc = SW_OK;
    for (size_t t = 0; t < n_tools; t++) {
        int32_t args;
        int l = snprintf(b.path, sizeof b.path, "tools[%zu].function.parameters#", t);
        size_t plen = l > 0 && (size_t)l < sizeof b.path ? (size_t)l : 0;
        /* frames: root 1, the wrapper 2, the arguments 3 */
        if (tools[t].parameters) {
            if ((rc = compile(&b, tools[t].parameters, 2, plen, &args)))
                goto fail;
            cs_kind k = g->nodes[args].kind;
            if (k != CS_OBJECT && k != CS_ANYOBJ) {
                rc = fail_at(&b, plen, SW_EUNSUPPORTED,
                             "a tool's parameters must be an object schema");
                goto fail;
            }
        } else {
            /* No parameters: an empty argument list. */
            json_t *empty = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                                      "additionalProperties", 0);
            rc = empty ? compile(&b, empty, 2, plen, &args)
                       : sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
            json_decref(empty);
            if (rc)
                goto fail;
        }
        json_t *name = json_string(tools[t].name ? tools[t].name : "");
        const json_t *nv[1] = {name};
        int32_t name_node = name ? make_literals(g, nv, 1) : -1;
        json_decref(name);
        cs_node nd;
        memset(&nd, 0, sizeof nd);
        nd.kind = CS_OBJECT;
        nd.n_props = 0;
        nd.keys = sw_calloc(2, sizeof *nd.keys);
        nd.key_lens = sw_calloc(2, sizeof *nd.key_lens);
        nd.children = sw_calloc(2, sizeof *nd.children);
        nd.required = sw_calloc(2, sizeof *nd.required);
        nd.req_from = sw_calloc(3, sizeof *nd.req_from);
        nd.any_from = sw_calloc(3, sizeof *nd.any_from);
        nd.next_req = sw_calloc(3, sizeof *nd.next_req);
        if (name_node < 0 || !nd.keys || !nd.key_lens || !nd.children || !nd.required ||
            !nd.req_from || !nd.any_from || !nd.next_req ||
            !(nd.keys[0] = sw_strdup("\"name\":")) || !(nd.keys[1] = sw_strdup("\"arguments\":"))) {
            nd.n_props = 2;
            node_clear(&nd);
            rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
            goto fail;
        }
        nd.n_props = 2;
        nd.key_lens[0] = 7;
        nd.key_lens[1] = 12;
        nd.children[0] = name_node;
        nd.children[1] = args;
        nd.required[0] = nd.required[1] = true;
        int32_t one1 = len_add(12, g->nodes[args].min_bytes);
        int32_t one0 = len_add(7, g->nodes[name_node].min_bytes);
        nd.req_from[2] = 0;
        nd.req_from[1] = len_add(1, one1);
        nd.req_from[0] = len_add(len_add(1, one0), nd.req_from[1]);
        nd.any_from[2] = CS_LEN_CAP;
        nd.any_from[1] = one1;
        nd.any_from[0] = one0 < one1 ? one0 : one1;
        nd.next_req[0] = 0;
        nd.next_req[1] = 1;
        nd.next_req[2] = 2;
        if ((wrappers[t] = add_node(g, &nd)) < 0) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
            goto fail;
        }
    }
    if (n_tools == 1)
        g->root = wrappers[0];
    else if ((g->root = make_anyof(g, wrappers, (int32_t)n_tools)) < 0) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
        goto fail;
    }
    *out = g;
    return SW_OK;
fail:
    eng_grammar_free(g);
    return rc;
}

/* ---- validation ---------------------------------------------------------------
 * The same subset checked against a parsed value with JSON Schema's own
 * meaning (the router checks a model's tool-call arguments before it calls
 * the tool: they may come from an engine that did not generate them under
 * this grammar). Unlike the grammar: any property order, additional
 * properties allowed unless additionalProperties says otherwise, a keyword
 * constrains only values of its type, numbers of any size. */

typedef struct validator {
    sw_error *err;
    int32_t anyof_nesting;
    int64_t steps;          /* checks made: anyOf inside anyOf can multiply them */
    char path[256];         /* JSON pointer into the value */
} validator;

#define VAL_MAX_STEPS 200000

static size_t val_push(validator *v, size_t len, const char *seg)
{
    return pointer_push(v->path, sizeof v->path, len, seg);
}

static size_t val_push_index(validator *v, size_t len, size_t i)
{
    char seg[24];
    snprintf(seg, sizeof seg, "%zu", i);
    return val_push(v, len, seg);
}

static int val_fail(validator *v, size_t len, int code, const char *what)
{
    v->path[len] = '\0';
    if (code == SW_EINVAL)
        return sw_error_set(v->err, code, "%s (at %s)", what, v->path);
    return sw_error_set(v->err, code, "the schema cannot be checked: %s (at %s)", what, v->path);
}

/* JSON equality where 1 and 1.0 are the same number (JSON Schema's). */
static bool val_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b) &&
               (!json_is_integer(a) || !json_is_integer(b) ||
                json_integer_value(a) == json_integer_value(b));
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!val_equal(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    }
    if (json_is_object(a) && json_is_object(b)) {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)a, k, x) {
            const json_t *y = json_object_get(b, k);
            if (!y || !val_equal(x, y))
                return false;
        }
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/* A count keyword of the schema (validated as the compiler does). */
static int val_count(validator *v, const json_t *s, const char *key, size_t plen, int64_t dflt,
                     int64_t *out)
{
    const json_t *c = json_object_get(s, key);
    if (!c) {
        *out = dflt;
        return SW_OK;
    }
    if (!json_is_integer(c) || json_integer_value(c) < 0)
        return val_fail(v, plen, SW_EUNSUPPORTED, "a count keyword is not a non-negative integer");
    *out = json_integer_value(c);
    return SW_OK;
}

static int val_check(validator *v, const json_t *s, const json_t *x, int32_t depth, size_t plen);

static int val_object(validator *v, const json_t *s, const json_t *x, int32_t depth, size_t plen)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)) ||
        (addl && !json_is_boolean(addl) && !json_is_object(addl)))
        return val_fail(v, plen, SW_EUNSUPPORTED,
                        "'properties', 'required' or 'additionalProperties' has the wrong type");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        if (!name)
            return val_fail(v, plen, SW_EUNSUPPORTED, "'required' must be an array of strings");
        if (!json_object_get(x, name)) {
            char what[160];
            snprintf(what, sizeof what, "the required property '%.64s' is missing", name);
            return val_fail(v, plen, SW_EINVAL, what);
        }
    }
    const char *key;
    const json_t *val;
    int rc;
    json_object_foreach((json_t *)x, key, val) {
        const json_t *sub = json_object_get(props, key);
        size_t l = val_push(v, plen, key);
        if (sub) {
            if ((rc = val_check(v, sub, val, depth + 1, l)))
                return rc;
        } else if (json_is_false(addl)) {
            return val_fail(v, l, SW_EINVAL, "a property the schema does not allow");
        } else if (json_is_object(addl)) {
            if ((rc = val_check(v, addl, val, depth + 1, l)))
                return rc;
        }
    }
    return SW_OK;
}

static int val_typed(validator *v, const json_t *s, const json_t *x, int32_t depth, size_t plen)
{
    int rc;
    if (json_is_object(x))
        return val_object(v, s, x, depth, plen);
    if (json_is_array(x)) {
        int64_t lo, hi;
        const json_t *items = json_object_get(s, "items");
        if ((rc = val_count(v, s, "minItems", plen, 0, &lo)) ||
            (rc = val_count(v, s, "maxItems", plen, INT64_MAX, &hi)))
            return rc;
        if (json_is_array(items))
            return val_fail(v, plen, SW_EUNSUPPORTED, "tuple 'items' is not supported");
        size_t n = json_array_size(x);
        if ((int64_t)n < lo || (int64_t)n > hi)
            return val_fail(v, plen, SW_EINVAL, "the array has too few or too many items");
        for (size_t i = 0; items && i < n; i++)
            if ((rc = val_check(v, items, json_array_get(x, i), depth + 1,
                                val_push_index(v, plen, i))))
                return rc;
        return SW_OK;
    }
    if (json_is_string(x)) {
        int64_t lo, hi;
        if ((rc = val_count(v, s, "minLength", plen, 0, &lo)) ||
            (rc = val_count(v, s, "maxLength", plen, INT64_MAX, &hi)))
            return rc;
        const char *t = json_string_value(x);
        int64_t chars = 0;
        for (size_t i = 0; i < json_string_length(x); i++)
            chars += ((unsigned char)t[i] & 0xC0) != 0x80; /* code points */
        if (chars < lo)
            return val_fail(v, plen, SW_EINVAL, "the string is shorter than minLength");
        if (chars > hi)
            return val_fail(v, plen, SW_EINVAL, "the string is longer than maxLength");
    }
    return SW_OK;
}

static int val_check(validator *v, const json_t *s, const json_t *x, int32_t depth, size_t plen)
{
    int rc;
    if (++v->steps > VAL_MAX_STEPS)
        return val_fail(v, plen, SW_EUNSUPPORTED, "too many alternatives to try");
    if (depth + 1 > ENG_CS_MAX_DEPTH)
        return val_fail(v, plen, SW_EUNSUPPORTED, "the schema nests too deeply");
    if (json_is_true(s))
        return SW_OK;
    if (json_is_false(s))
        return val_fail(v, plen, SW_EINVAL, "the schema allows no value here");
    if (!json_is_object(s))
        return val_fail(v, plen, SW_EUNSUPPORTED, "a schema must be an object");
    const char *key = unsupported_keyword(s);
    if (key) {
        char what[160];
        snprintf(what, sizeof what, "unsupported JSON-schema keyword '%.64s'", key);
        return val_fail(v, plen, SW_EUNSUPPORTED, what);
    }
    const json_t *type = json_object_get(s, "type");
    if (type) {
        bool match = false;
        size_t nt = json_is_array(type) ? json_array_size(type) : 1;
        if (!json_is_string(type) && !json_is_array(type))
            return val_fail(v, plen, SW_EUNSUPPORTED, "'type' must be a string or an array");
        for (size_t i = 0; i < nt; i++) {
            const char *t = json_string_value(json_is_array(type) ? json_array_get(type, i) : type);
            if (!t || !in_list(t, (const char *const[]){"object", "array", "string", "number",
                                                        "integer", "boolean", "null"}, 7))
                return val_fail(v, plen, SW_EUNSUPPORTED, "an unknown 'type'");
            match |= type_matches(x, t);
        }
        if (!match)
            return val_fail(v, plen, SW_EINVAL, "the value has the wrong type");
    }
    const json_t *c = json_object_get(s, "const");
    const json_t *e = json_object_get(s, "enum");
    if (e && !json_is_array(e))
        return val_fail(v, plen, SW_EUNSUPPORTED, "'enum' must be an array");
    if (c && !val_equal(c, x))
        return val_fail(v, plen, SW_EINVAL, "the value is not the schema's const");
    if (e) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(e) && !found; i++)
            found = val_equal(json_array_get(e, i), x);
        if (!found)
            return val_fail(v, plen, SW_EINVAL, "the value is not one of the enum values");
    }
    /* oneOf is checked as anyOf, as it is generated (json_schema.h) */
    const json_t *any = json_object_get(s, "anyOf");
    if (!any)
        any = json_object_get(s, "oneOf");
    if (any) {
        size_t n = json_array_size(any);
        if (!json_is_array(any) || n == 0 || n > 64)
            return val_fail(v, plen, SW_EUNSUPPORTED, "anyOf/oneOf must hold 1 to 64 schemas");
        if (v->anyof_nesting >= ENG_CS_MAX_ANYOF_NESTING)
            return val_fail(v, plen, SW_EUNSUPPORTED, "anyOf/oneOf nested too deeply");
        sw_error *outer = v->err;
        sw_error first;
        bool matched = false;
        v->anyof_nesting++;
        for (size_t i = 0; i < n && !matched; i++) {
            sw_error one;
            v->err = i == 0 ? &first : &one;
            rc = val_check(v, json_array_get(any, i), x, depth, plen);
            if (rc == SW_OK)
                matched = true;
            else if (rc != SW_EINVAL) {
                v->anyof_nesting--;
                v->err = outer;
                return sw_error_set(outer, rc, "%s", (i == 0 ? &first : &one)->message);
            }
        }
        v->anyof_nesting--;
        v->err = outer;
        if (!matched)
            return sw_error_set(outer, SW_EINVAL,
                                "the value matches none of the anyOf/oneOf alternatives (the "
                                "first: %.200s)",
                                first.message);
    }
    return val_typed(v, s, x, depth, plen);
}

int eng_json_validate(const json_t *schema, const json_t *value, sw_error *err)
{
    if (!schema || !value)
        return sw_error_set(err, SW_EUNSUPPORTED, "eng_json_validate: NULL argument");
    validator v;
    memset(&v, 0, sizeof v);
    v.err = err;
    strcpy(v.path, "#");
    return val_check(&v, schema, value, 1, 1);
}
