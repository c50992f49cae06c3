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
#include "common/json_big.h"
#include "engine/constrain-impl.h"
#include "engine/formats.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    sw_free(n->prefix);
    sw_free(n->seq);
    sw_free(n->seq_from);
    eng_regex_free(n->re);
    eng_regex_costs_free(n->re_costs);
    for (int i = 0; i < 2; i++) {
        sw_free(n->int_lo[i]);
        sw_free(n->int_hi[i]);
        sw_free(n->frac_lo[i]);
        sw_free(n->frac_hi[i]);
    }
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
    case CS_ANYOBJ:
        m = 2;
        if (n->counted && n->min_items > 0)
            m = len_add(len_add(3, g->nodes[n->key_node].min_bytes), g->nodes[n->item].min_bytes);
        break;
    case CS_ARRAY: {
        /* prefixItems first, then item; a comma between two */
        int64_t k = n->min_items < n->n_prefix ? n->min_items : n->n_prefix;
        m = 2 + (n->min_items > 0 ? n->min_items - 1 : 0);
        for (int64_t i = 0; i < k; i++)
            m = len_add(m, g->nodes[n->prefix[i]].min_bytes);
        m = len_add(m, len_mul(n->min_items - k, g->nodes[n->item].min_bytes));
        break;
    }
    case CS_STRING: m = len_add(2, n->min_chars); break;
    case CS_PATTERN: m = n->min_bytes; break; /* make_pattern's */
    case CS_NUMBER:
    case CS_INTEGER:
        m = 1;
        if (n->ranged) {
            /* the shortest of int_lo and frac_lo + ".d", per sign */
            m = CS_LEN_CAP;
            for (int sign = 0; sign < 2; sign++) {
                if (n->int_ok[sign] && sign + (int64_t)strlen(n->int_lo[sign]) < m)
                    m = sign + (int64_t)strlen(n->int_lo[sign]);
                if (n->frac_ok[sign] && sign + (int64_t)strlen(n->frac_lo[sign]) + 2 < m)
                    m = sign + (int64_t)strlen(n->frac_lo[sign]) + 2;
            }
        }
        break;
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
    case CS_RAW:
    case CS_SEQ:
    case CS_REP: break; /* GBNF's (gbnf_compile.c), never made here */
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

struct sc_doc;

typedef struct builder {
    eng_grammar *g;
    sw_error *err;
    /* anyOf directly inside anyOf, per stack frame: an alternative that is
     * an object or an array starts a frame of its own (recursion through
     * Optional[Self] nests frames, not anyOfs) */
    int32_t anyof_nesting[ENG_CS_MAX_DEPTH + 1];
    char path[256];
    struct sc_doc *doc;                   /* the schema's identifiers and merged schemas */
    const char *base;                     /* where the current schema's $ref resolve */
    int32_t chain[ENG_CS_MAX_DEPTH + 1];  /* $ref / allOf followed at each frame depth */
    int64_t steps;                        /* compile calls: bounded */
    json_t *memo;                         /* "%p/depth" of a schema -> its node */
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
    char *j = sw_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); /* markers: their numbers */
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
        double d = json_is_real(vals[i]) ? json_real_value(vals[i]) : 0.5;
        if (d == floor(d) && fabs(d) < 1e15) {
            /* 2.0 is written 2: also a valid "integer" */
            char t[32];
            snprintf(t, sizeof t, "%.0f", d == 0 ? 0.0 : d);
            nd.lits[i] = sw_strdup(t);
            nd.lit_lens[i] = nd.lits[i] ? (int32_t)strlen(t) : 0;
        } else {
            nd.lits[i] = dump_value(vals[i], &nd.lit_lens[i]);
        }
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

/* ---- the schema document: dialect, identifiers, references ----------------
 * Both the compiler and the validator resolve $ref against an index built
 * once per document: every schema object reached through a keyword that
 * holds schemas gets its base URI (from the $id / id above it), and every
 * $id and $anchor is recorded as an absolute URI. A $ref is resolved
 * against the base of the schema that holds it; a URI outside the document
 * is a remote reference, refused (nothing is fetched). */

/* Work bounds on hostile documents: schema objects indexed, compile calls
 * made, nodes made. Past them: SW_EUNSUPPORTED, never a hang. */
#define SC_MAX_INDEXED 200000
#define SC_MAX_COMPILE_STEPS 400000
#define SC_MAX_NODES 100000
/* $ref followed one after another without a value in between ({"$ref":
 * "#"} points at itself). */
#define SC_MAX_REF_CHAIN 32
#define SC_URI_MAX 1024
#define SC_DEFAULT_BASE "urn:spillway:schema"

typedef enum sc_dialect { SC_2020 = 0, SC_DRAFT7 = 1, SC_DRAFT4 = 2 } sc_dialect;

typedef struct sc_doc {
    const json_t *root;
    sc_dialect dialect;
    json_t *ids;    /* absolute URI (no fragment, or #anchor) -> schema (a reference) */
    json_t *bases;  /* "%p" of a schema object -> its base URI (string) */
    json_t *arena;  /* schemas made while merging: alive until the document is freed */
    int64_t indexed;
} sc_doc;

static sc_dialect dialect_of(const json_t *root)
{
    const char *s = json_string_value(json_object_get(root, "$schema"));
    if (!s)
        return SC_2020;
    if (strstr(s, "draft-04") || strstr(s, "draft-03"))
        return SC_DRAFT4;
    if (strstr(s, "draft-06") || strstr(s, "draft-07"))
        return SC_DRAFT7;
    return SC_2020;
}

static void uri_strip_fragment(char *u)
{
    char *h = strchr(u, '#');
    if (h)
        *h = '\0';
}

static bool uri_has_scheme(const char *r)
{
    const char *p = r;
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
        return false;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
           *p == '+' || *p == '-' || *p == '.')
        p++;
    return *p == ':';
}

/* Removes "./" and "x/../" segments from the path part of u (in place). */
static void uri_dot_segments(char *u)
{
    char *path = strstr(u, "://");
    path = path ? strchr(path + 3, '/') : strchr(u, ':');
    if (!path)
        return;
    char out[SC_URI_MAX];
    size_t o = 0;
    const char *p = path;
    while (*p && o + 2 < sizeof out) {
        if (strncmp(p, "/./", 3) == 0) {
            p += 2;
        } else if (strncmp(p, "/../", 4) == 0 || strcmp(p, "/..") == 0) {
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--;
            p += 3;
            if (!*p)
                out[o++] = '/';
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    memcpy(path, out, o + 1);
}

/* out = ref resolved against base (RFC 3986, the forms schemas use). */
static void uri_resolve(const char *base, const char *ref, char *out, size_t cap)
{
    char b[SC_URI_MAX];
    snprintf(b, sizeof b, "%s", base);
    if (uri_has_scheme(ref)) {
        snprintf(out, cap, "%s", ref);
    } else if (ref[0] == '#') {
        uri_strip_fragment(b);
        snprintf(out, cap, "%s%s", b, ref);
    } else if (ref[0] == '\0') {
        uri_strip_fragment(b);
        snprintf(out, cap, "%s", b);
    } else if (ref[0] == '/' && ref[1] == '/') {
        char *c = strchr(b, ':');
        if (c)
            c[1] = '\0';
        snprintf(out, cap, "%s%s", b, ref);
    } else if (ref[0] == '/') {
        char *a = strstr(b, "://");
        char *slash = a ? strchr(a + 3, '/') : strchr(b, ':');
        if (slash)
            slash[a ? 0 : 1] = '\0';
        snprintf(out, cap, "%s%s", b, ref);
    } else {
        uri_strip_fragment(b);
        char *q = strchr(b, '?');
        if (q)
            *q = '\0';
        char *slash = strrchr(b, '/');
        char *colon = strchr(b, ':');
        if (slash && (!colon || slash > colon))
            slash[1] = '\0';
        else if (colon)
            colon[1] = '\0';
        snprintf(out, cap, "%s%s", b, ref);
    }
    uri_dot_segments(out);
    /* "x#" is "x" */
    size_t n = strlen(out);
    if (n > 0 && out[n - 1] == '#')
        out[n - 1] = '\0';
}

static void ptr_key(const json_t *s, char *key, size_t cap)
{
    snprintf(key, cap, "%p", (const void *)s);
}

static const char *doc_base_of(const sc_doc *d, const json_t *s)
{
    char key[32];
    ptr_key(s, key, sizeof key);
    return json_string_value(json_object_get(d->bases, key));
}

/* Keywords whose value is a schema, an array of schemas, or an object of
 * schemas: the places a subschema (and so an $id) can be. */
static const char *const schema_keywords[] = {
    "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "items", "contentSchema",
};
static const char *const schema_array_keywords[] = {"allOf", "anyOf", "oneOf", "prefixItems",
                                                    "items"};
static const char *const schema_map_keywords[] = {"properties", "patternProperties", "$defs",
                                                  "definitions", "dependentSchemas",
                                                  "dependencies"};

static int doc_index(sc_doc *d, const json_t *s, const char *base, int depth, sw_error *err)
{
    if (!json_is_object(s))
        return SW_OK;
    if (++d->indexed > SC_MAX_INDEXED || depth > 200)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "the schema is too large or nests too deeply to compile");
    char mine[SC_URI_MAX];
    snprintf(mine, sizeof mine, "%s", base);
    bool ref_only = d->dialect != SC_2020 && json_object_get(s, "$ref");
    const char *id = json_string_value(json_object_get(s, d->dialect == SC_DRAFT4 ? "id" : "$id"));
    if (id && !ref_only) {
        char abs[SC_URI_MAX];
        uri_resolve(base, id, abs, sizeof abs);
        if (id[0] == '#') {
            /* draft 6/7: "$id": "#name" is an anchor */
            if (json_object_set(d->ids, abs, (json_t *)s))
                return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
        } else {
            snprintf(mine, sizeof mine, "%s", abs);
            uri_strip_fragment(mine);
            if (json_object_set(d->ids, mine, (json_t *)s))
                return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
        }
    }
    const char *anchor = json_string_value(json_object_get(s, "$anchor"));
    if (!anchor)
        anchor = json_string_value(json_object_get(s, "$dynamicAnchor"));
    if (anchor) {
        char abs[SC_URI_MAX * 2];
        snprintf(abs, sizeof abs, "%s#%s", mine, anchor);
        if (!json_object_get(d->ids, abs) && json_object_set(d->ids, abs, (json_t *)s))
            return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    }
    char key[32];
    ptr_key(s, key, sizeof key);
    if (json_object_set_new(d->bases, key, json_string(mine)))
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    if (ref_only)
        return SW_OK;
    int rc;
    for (size_t i = 0; i < sizeof schema_keywords / sizeof *schema_keywords; i++) {
        const json_t *v = json_object_get(s, schema_keywords[i]);
        if (json_is_object(v) && (rc = doc_index(d, v, mine, depth + 1, err)))
            return rc;
    }
    for (size_t i = 0; i < sizeof schema_array_keywords / sizeof *schema_array_keywords; i++) {
        const json_t *v = json_object_get(s, schema_array_keywords[i]);
        for (size_t j = 0; json_is_array(v) && j < json_array_size(v); j++)
            if ((rc = doc_index(d, json_array_get(v, j), mine, depth + 1, err)))
                return rc;
    }
    for (size_t i = 0; i < sizeof schema_map_keywords / sizeof *schema_map_keywords; i++) {
        const json_t *v = json_object_get(s, schema_map_keywords[i]);
        const char *k;
        const json_t *sub;
        if (!json_is_object(v))
            continue;
        json_object_foreach((json_t *)v, k, sub) {
            if ((rc = doc_index(d, sub, mine, depth + 1, err)))
                return rc;
        }
    }
    return SW_OK;
}

static void doc_free(sc_doc *d)
{
    json_decref(d->ids);
    json_decref(d->bases);
    json_decref(d->arena);
    memset(d, 0, sizeof *d);
}

static int doc_init(sc_doc *d, const json_t *root, sw_error *err)
{
    memset(d, 0, sizeof *d);
    d->root = root;
    d->dialect = dialect_of(root);
    d->ids = json_object();
    d->bases = json_object();
    d->arena = json_array();
    if (!d->ids || !d->bases || !d->arena) {
        doc_free(d);
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    }
    /* the root under the default base too, so "#/..." always resolves */
    if (json_object_set(d->ids, SC_DEFAULT_BASE, (json_t *)root)) {
        doc_free(d);
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    }
    int rc = doc_index(d, root, SC_DEFAULT_BASE, 0, err);
    if (rc)
        doc_free(d);
    return rc;
}

/* Keeps a schema made while merging alive with the document (the reference
 * is taken over); returns it, or NULL (and frees it) out of memory. */
static json_t *doc_keep(sc_doc *d, json_t *s)
{
    if (!s || json_array_append_new(d->arena, s))
        return NULL;
    return s;
}

/* Percent-decodes a URI fragment (in place). */
static void pct_decode(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            char h[3] = {p[1], p[2], 0};
            *o++ = (char)strtol(h, NULL, 16);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

/* Follows a JSON pointer ("/a/0/b") from doc; NULL where it leads nowhere. */
static const json_t *json_pointer_get(const json_t *doc, const char *ptr)
{
    const json_t *cur = doc;
    const char *p = ptr;
    while (*p == '/' && cur) {
        p++;
        char seg[512];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '0') {
                seg[n++] = '~';
                p += 2;
            } else if (p[0] == '~' && p[1] == '1') {
                seg[n++] = '/';
                p += 2;
            } else {
                seg[n++] = *p++;
            }
        }
        seg[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            cur = (*end || !n) ? NULL : json_array_get(cur, i);
        } else {
            cur = NULL;
        }
    }
    return *p ? NULL : cur;
}

/* The schema a $ref names, seen from base; *target_base receives the base
 * URI the target's own references resolve against (storage of d). */
static int doc_resolve(const sc_doc *d, const char *base, const char *ref, const json_t **out,
                       sw_error *err)
{
    char abs[SC_URI_MAX], docuri[SC_URI_MAX], frag[SC_URI_MAX];
    uri_resolve(base ? base : SC_DEFAULT_BASE, ref, abs, sizeof abs);
    snprintf(docuri, sizeof docuri, "%s", abs);
    char *h = strchr(docuri, '#');
    frag[0] = '\0';
    if (h) {
        snprintf(frag, sizeof frag, "%s", h + 1);
        *h = '\0';
    }
    const json_t *doc = json_object_get(d->ids, docuri);
    if (!doc)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "a remote $ref (%.200s) is not supported: only references into the "
                            "schema itself are resolved",
                            abs);
    pct_decode(frag);
    if (frag[0] == '\0') {
        *out = doc;
    } else if (frag[0] == '/') {
        *out = json_pointer_get(doc, frag);
    } else {
        char a[SC_URI_MAX * 2];
        snprintf(a, sizeof a, "%s#%s", docuri, frag);
        *out = json_object_get(d->ids, a);
    }
    if (!*out || !(json_is_object(*out) || json_is_boolean(*out)))
        return sw_error_set(err, SW_EINVAL, "the $ref %.200s names no schema in the document",
                            ref);
    return SW_OK;
}

/* ---- keywords ---------------------------------------------------------------
 * JSON Schema's assertions and applicators. A keyword not in this list is
 * an annotation (title, $comment, x-anything, ...) and is ignored, as the
 * specification says. */
static const char *const known_keywords[] = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "items", "prefixItems", "additionalItems", "contains", "allOf", "anyOf",
    "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies",
    "unevaluatedItems", "unevaluatedProperties", "$ref", "$dynamicRef", "$recursiveRef",
    "format",
};

/* Formats with a defined syntax: the ones formats.h has a pattern for are
 * enforced (CS_PATTERN), the others refused; any other format is an
 * annotation. */
static const char *const known_formats[] = {
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
    "json-pointer", "relative-json-pointer", "regex",
};

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}

#define IN_LIST(k, list) in_list((k), (list), sizeof(list) / sizeof *(list))

static bool is_known_keyword(const char *k)
{
    return IN_LIST(k, known_keywords);
}

/* ---- allOf: merging schemas into one -----------------------------------------
 * allOf (and a $ref beside other keywords, which means the same) is
 * compiled as one schema holding every constraint: bounds take the
 * tighter value, types and enums intersect, required and properties
 * unite (a property's schema is the allOf of both sides' schemas for it,
 * additionalProperties standing in where a side does not declare it),
 * anyOf lists multiply out. Two different values of a keyword that cannot
 * be combined (two patterns, two multipleOf, two contains, ...) are
 * refused. The merged schemas live in the document's arena; their
 * subschemas are the document's own (so their base URIs stay known). */

enum {
    T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32,
    T_NULL = 64, T_ALL = 127
};

static const char *const type_names[] = {"object", "array", "string", "number", "integer",
                                         "boolean", "null"};

static int type_bit(const char *t)
{
    for (int i = 0; i < 7; i++)
        if (strcmp(t, type_names[i]) == 0)
            return 1 << i;
    return 0;
}

/* The types a "type" keyword allows (number includes integer); -1 when
 * malformed. Absent: all. */
static int type_mask(const json_t *type)
{
    if (!type)
        return T_ALL;
    int m = 0;
    if (json_is_string(type)) {
        m = type_bit(json_string_value(type));
        if (!m)
            return -1;
    } else if (json_is_array(type)) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            const char *t = json_string_value(json_array_get(type, i));
            int bit = t ? type_bit(t) : 0;
            if (!bit)
                return -1;
            m |= bit;
        }
    } else {
        return -1;
    }
    if (m & T_NUMBER)
        m |= T_INTEGER;
    return m;
}

static json_t *type_json(int m)
{
    if ((m & T_NUMBER) && (m & T_INTEGER))
        m &= ~T_INTEGER;
    json_t *a = json_array();
    for (int i = 0; a && i < 7; i++)
        if (m & (1 << i))
            json_array_append_new(a, json_string(type_names[i]));
    return a;
}

static bool is_num(const json_t *v);
static int num_cmp(const json_t *a, const json_t *b);

/* JSON equality where 1 and 1.0 are the same number (JSON Schema's). */
static bool val_equal(const json_t *a, const json_t *b)
{
    if ((sw_json_big_text(a) || sw_json_big_text(b)) && is_num(a) && is_num(b))
        return num_cmp(a, b) == 0;
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
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

/* {"allOf":[a,b]}, or the one that is not true. New reference. */
static json_t *allof2(const json_t *a, const json_t *b)
{
    if (!a || json_is_true(a))
        return b ? json_incref((json_t *)b) : json_true();
    if (!b || json_is_true(b))
        return json_incref((json_t *)a);
    if (json_is_false(a) || json_is_false(b))
        return json_false();
    return json_pack("{s:[OO]}", "allOf", a, b);
}

/* A lower or upper numeric bound of a schema, draft 4's boolean
 * exclusiveMinimum / exclusiveMaximum included. */
typedef struct num_bound {
    const json_t *v; /* NULL: none */
    bool excl;
} num_bound;

/* ---- numbers past 64 bits ----
 * A body's number that jansson cannot hold is a marker string with the
 * literal's text (json_big.h). Integers of up to ENG_CS_MAX_BIG_DIGITS
 * digits are exact everywhere a schema compares numbers (bounds, const,
 * enum); a fraction or an exponent past a double's range is refused where
 * a keyword would need its value. */

static bool is_num(const json_t *v)
{
    return json_is_number(v) || sw_json_big_text(v);
}

/* The marker of an integer the compiler can use exactly. */
static bool big_ok(const json_t *v)
{
    const char *t = sw_json_big_text(v);
    return t && !strpbrk(t, ".eE") && strlen(t) <= ENG_CS_MAX_BIG_DIGITS;
}

/* A whole value held exactly: int64, a marker integer or a whole double. */
static bool num_exact_whole(const json_t *v)
{
    if (json_is_integer(v) || big_ok(v))
        return true;
    return json_is_real(v) && isfinite(json_real_value(v)) &&
           json_real_value(v) == floor(json_real_value(v));
}

static double num_double(const json_t *v)
{
    const char *t = sw_json_big_text(v);
    return t ? strtod(t, NULL) : json_number_value(v);
}

typedef struct dec {
    bool neg;
    char mag[ENG_CS_MAX_BIG_DIGITS + 8]; /* digits, no leading zeros; "0" for zero (never
                                            negative) */
} dec;

static void mag_inc(char *m)
{
    size_t n = strlen(m);
    size_t i = n;
    while (i > 0 && m[i - 1] == '9')
        m[--i] = '0';
    if (i > 0) {
        m[i - 1]++;
    } else if (n + 2 < sizeof((dec *)0)->mag) {
        memmove(m + 1, m, n + 1);
        m[0] = '1';
    }
}

static void mag_dec(char *m)
{
    size_t n = strlen(m);
    size_t i = n;
    while (i > 0 && m[i - 1] == '0')
        m[--i] = '9';
    if (i > 0)
        m[i - 1]--;
    size_t z = 0;
    while (m[z] == '0' && m[z + 1])
        z++;
    memmove(m, m + z, strlen(m + z) + 1);
}

/* floor (down) or ceil of a JSON number, exactly (a number past 64 bits:
 * an integer of at most ENG_CS_MAX_BIG_DIGITS digits, big_ok). */
static void dec_round(const json_t *v, bool down, dec *out)
{
    const char *big = sw_json_big_text(v);
    if (big) {
        out->neg = big[0] == '-';
        snprintf(out->mag, sizeof out->mag, "%s", big + out->neg);
        return;
    }
    if (json_is_integer(v)) {
        char t[32];
        snprintf(t, sizeof t, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        out->neg = t[0] == '-';
        snprintf(out->mag, sizeof out->mag, "%s", t + out->neg);
        return;
    }
    double d = json_real_value(v), c = down ? floor(d) : ceil(d);
    snprintf(out->mag, sizeof out->mag, "%.0f", fabs(c));
    out->neg = c < 0 && strcmp(out->mag, "0") != 0;
}

static bool num_whole(const json_t *v)
{
    return json_is_integer(v) || sw_json_big_text(v) ||
           json_real_value(v) == floor(json_real_value(v));
}

static void dec_negate(dec *x)
{
    x->neg = !x->neg && strcmp(x->mag, "0") != 0;
}

/* x += delta (+1 or -1) */
static void dec_step(dec *x, int delta)
{
    if ((delta > 0) != x->neg) {
        mag_inc(x->mag);
    } else if (strcmp(x->mag, "0") == 0) {
        x->neg = delta < 0;
        strcpy(x->mag, "1");
    } else {
        mag_dec(x->mag);
        if (strcmp(x->mag, "0") == 0)
            x->neg = false;
    }
}

static int mag_cmp(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la != lb)
        return la < lb ? -1 : 1;
    int c = strcmp(a, b);
    return c < 0 ? -1 : c > 0;
}

static int dec_cmp(const dec *a, const dec *b)
{
    if (a->neg != b->neg)
        return a->neg ? -1 : 1;
    int c = mag_cmp(a->mag, b->mag);
    return a->neg ? -c : c;
}

static int num_cmp(const json_t *a, const json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b))
        return json_integer_value(a) < json_integer_value(b)
                   ? -1
                   : json_integer_value(a) > json_integer_value(b);
    if (num_exact_whole(a) && num_exact_whole(b)) {
        dec x, y;
        dec_round(a, true, &x);
        dec_round(b, true, &y);
        return dec_cmp(&x, &y);
    }
    /* a fraction is within 2^53, a marker integer beyond 2^63: doubles
     * order them rightly */
    double x = num_double(a), y = num_double(b);
    return x < y ? -1 : x > y;
}

static num_bound bound_get(const json_t *s, bool lower)
{
    num_bound r = {NULL, false};
    const json_t *plain = json_object_get(s, lower ? "minimum" : "maximum");
    const json_t *ex = json_object_get(s, lower ? "exclusiveMinimum" : "exclusiveMaximum");
    if (is_num(plain))
        r.v = plain;
    if (json_is_true(ex) && r.v) {
        r.excl = true;
    } else if (is_num(ex)) {
        int c = r.v ? num_cmp(ex, r.v) : (lower ? 1 : -1);
        if (lower ? c >= 0 : c <= 0) {
            r.v = ex;
            r.excl = true;
        }
    }
    return r;
}

/* The tighter of two bounds. */
static num_bound bound_tighter(num_bound a, num_bound b, bool lower)
{
    if (!a.v)
        return b;
    if (!b.v)
        return a;
    int c = num_cmp(a.v, b.v);
    if (c == 0)
        return a.excl ? a : b;
    return (lower ? c > 0 : c < 0) ? a : b;
}

static const char *const min_keys[] = {"minLength", "minItems", "minProperties", "minContains"};
static const char *const max_keys[] = {"maxLength", "maxItems", "maxProperties", "maxContains"};
static const char *const bound_keys[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};

/* Whether a patternProperties pattern matches a property name: 1, 0, or
 * the regex module's error (a pattern it refuses). */
static int pattern_match_name(const char *pattern, const char *name, sw_error *err)
{
    eng_regex *re = NULL;
    int rc = eng_regex_compile(pattern, strlen(pattern), &re, err);
    if (rc)
        return rc;
    bool m = eng_regex_match(re, name, strlen(name));
    eng_regex_free(re);
    return m ? 1 : 0;
}

/* The schema a side gives property `name` (new reference): its properties
 * entry and the patternProperties that match the name, else its
 * additionalProperties (true when absent). */
static int prop_schema(const json_t *s, const char *name, json_t **out, sw_error *err)
{
    const json_t *p = json_object_get(json_object_get(s, "properties"), name);
    const json_t *pp = json_object_get(s, "patternProperties");
    json_t *acc = p ? json_incref((json_t *)p) : NULL;
    const char *pat;
    const json_t *ps;
    json_object_foreach((json_t *)pp, pat, ps) {
        int m = pattern_match_name(pat, name, err);
        if (m < 0) {
            json_decref(acc);
            return m;
        }
        if (m) {
            json_t *w = allof2(acc, ps);
            json_decref(acc);
            acc = w;
        }
    }
    if (!acc) {
        const json_t *a = json_object_get(s, "additionalProperties");
        acc = a ? json_incref((json_t *)a) : json_true();
    }
    *out = acc;
    return acc ? SW_OK : sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
}

static int merge_fail(sw_error *err, const char *key)
{
    return sw_error_set(err, SW_EUNSUPPORTED,
                        "allOf: two different '%.64s' cannot be merged into one schema", key);
}

/* a and b: schema objects without allOf or $ref. *out: new reference. */
static int merge2(const json_t *a, const json_t *b, json_t **out, sw_error *err)
{
    json_t *m = json_object();
    if (!m)
        return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
    int rc = SW_OK;
    const char *k;
    const json_t *v;
    /* keywords of one side only, or equal on both: copied */
    for (int side = 0; side < 2; side++) {
        const json_t *x = side ? b : a, *y = side ? a : b;
        json_object_foreach((json_t *)x, k, v) {
            if (!is_known_keyword(k) || json_object_get(m, k))
                continue;
            const json_t *w = json_object_get(y, k);
            if (!w || json_equal((json_t *)v, (json_t *)w))
                json_object_set(m, k, (json_t *)v);
        }
    }
    /* types */
    int ta = type_mask(json_object_get(a, "type")), tb = type_mask(json_object_get(b, "type"));
    if (ta < 0 || tb < 0) {
        rc = sw_error_set(err, SW_EINVAL, "allOf: a malformed 'type'");
        goto fail;
    }
    if ((ta & tb) != T_ALL) {
        json_object_set_new(m, "type", type_json(ta & tb));
        if ((ta & tb) == 0) {
            json_decref(m);
            *out = json_false();
            return SW_OK;
        }
    }
    /* counts and bounds */
    for (size_t i = 0; i < 4; i++) {
        const json_t *x = json_object_get(a, min_keys[i]), *y = json_object_get(b, min_keys[i]);
        if (x && y)
            json_object_set(m, min_keys[i], num_cmp(x, y) >= 0 ? (json_t *)x : (json_t *)y);
        x = json_object_get(a, max_keys[i]);
        y = json_object_get(b, max_keys[i]);
        if (x && y)
            json_object_set(m, max_keys[i], num_cmp(x, y) <= 0 ? (json_t *)x : (json_t *)y);
    }
    for (size_t i = 0; i < 4; i++)
        json_object_del(m, bound_keys[i]);
    for (int lower = 0; lower < 2; lower++) {
        num_bound t = bound_tighter(bound_get(a, lower), bound_get(b, lower), lower);
        if (t.v)
            json_object_set(m, t.excl ? (lower ? "exclusiveMinimum" : "exclusiveMaximum")
                                      : (lower ? "minimum" : "maximum"),
                            (json_t *)t.v);
    }
    /* enum / const: the values of both */
    const json_t *ea = json_object_get(a, "enum"), *eb = json_object_get(b, "enum");
    const json_t *ca = json_object_get(a, "const"), *cb = json_object_get(b, "const");
    if ((ea || ca) && (eb || cb)) {
        json_object_del(m, "enum");
        json_object_del(m, "const");
        json_t *both = json_array();
        size_t na = ca ? 1 : json_array_size(ea), nb = cb ? 1 : json_array_size(eb);
        for (size_t i = 0; both && i < na; i++) {
            const json_t *x = ca ? ca : json_array_get(ea, i);
            for (size_t j = 0; j < nb; j++)
                if (val_equal(x, cb ? cb : json_array_get(eb, j))) {
                    json_array_append(both, (json_t *)x);
                    break;
                }
        }
        if (json_array_size(both) == 0) {
            json_decref(both);
            json_decref(m);
            *out = json_false();
            return SW_OK;
        }
        json_object_set_new(m, "enum", both);
    }
    /* required: both lists */
    const json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    if (ra && rb) {
        json_t *r = json_array();
        for (int side = 0; r && side < 2; side++) {
            const json_t *l = side ? rb : ra;
            for (size_t i = 0; i < json_array_size(l); i++) {
                bool dup = false;
                for (size_t j = 0; j < json_array_size(r) && !dup; j++)
                    dup = json_equal(json_array_get(r, j), json_array_get(l, i));
                if (!dup)
                    json_array_append(r, json_array_get(l, i));
            }
        }
        json_object_set_new(m, "required", r);
    }
    /* properties and additionalProperties */
    const json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const json_t *aa = json_object_get(a, "additionalProperties");
    const json_t *ab = json_object_get(b, "additionalProperties");
    const json_t *qa = json_object_get(a, "patternProperties");
    const json_t *qb = json_object_get(b, "patternProperties");
    if (pa || pb || aa || ab || qa || qb) {
        json_t *props = json_object();
        for (int side = 0; props && side < 2; side++) {
            json_object_foreach((json_t *)(side ? pb : pa), k, v) {
                if (json_object_get(props, k))
                    continue;
                json_t *x = NULL, *y = NULL;
                if ((rc = prop_schema(a, k, &x, err)) || (rc = prop_schema(b, k, &y, err))) {
                    json_decref(x);
                    json_decref(props);
                    goto fail;
                }
                json_object_set_new(props, k, allof2(x, y));
                json_decref(x);
                json_decref(y);
            }
        }
        /* a name matching one side's pattern gets the other side's
         * additionalProperties too (stricter where the other side has a
         * pattern of its own for it: a narrowing) */
        json_t *pats = json_object();
        for (int side = 0; pats && side < 2; side++) {
            const json_t *q = side ? qb : qa, *other = side ? a : b;
            const json_t *oq = json_object_get(other, "patternProperties");
            const json_t *oa = json_object_get(other, "additionalProperties");
            json_object_foreach((json_t *)q, k, v) {
                if (json_object_get(pats, k))
                    continue;
                json_t *mine = allof2(v, json_object_get(oq, k));
                json_t *w = json_object_get(oq, k) ? json_incref(mine) : allof2(mine, oa);
                json_decref(mine);
                json_object_set_new(pats, k, w);
            }
        }
        json_object_del(m, "patternProperties");
        if (pats && json_object_size(pats))
            json_object_set_new(m, "patternProperties", pats);
        else
            json_decref(pats);
        if (props && json_object_size(props))
            json_object_set_new(m, "properties", props);
        else
            json_decref(props);
        json_object_del(m, "additionalProperties");
        if (aa || ab)
            json_object_set_new(m, "additionalProperties", allof2(aa, ab));
    }
    /* items (a schema on both sides) */
    const json_t *ia = json_object_get(a, "items"), *ib = json_object_get(b, "items");
    if (ia && ib && !json_equal((json_t *)ia, (json_t *)ib)) {
        if (json_is_array(ia) || json_is_array(ib) || json_object_get(a, "prefixItems") ||
            json_object_get(b, "prefixItems")) {
            rc = merge_fail(err, "items");
            goto fail;
        }
        json_object_set_new(m, "items", allof2(ia, ib));
    } else if ((ia && !ib && json_object_get(b, "prefixItems")) ||
               (ib && !ia && json_object_get(a, "prefixItems"))) {
        /* one side's items would cover the other's tuple positions too */
        rc = merge_fail(err, "items");
        goto fail;
    }
    /* anyOf on both sides: every pair */
    const json_t *xa = json_object_get(a, "anyOf"), *xb = json_object_get(b, "anyOf");
    if (xa && xb && !json_equal((json_t *)xa, (json_t *)xb)) {
        if (json_array_size(xa) * json_array_size(xb) > 64) {
            rc = sw_error_set(err, SW_EUNSUPPORTED,
                              "allOf: two anyOf lists multiply out to more than 64 alternatives");
            goto fail;
        }
        json_t *l = json_array();
        for (size_t i = 0; l && i < json_array_size(xa); i++)
            for (size_t j = 0; j < json_array_size(xb); j++)
                json_array_append_new(l, allof2(json_array_get(xa, i), json_array_get(xb, j)));
        json_object_set_new(m, "anyOf", l);
    }
    /* not: neither */
    const json_t *na_ = json_object_get(a, "not"), *nb_ = json_object_get(b, "not");
    if (na_ && nb_ && !json_equal((json_t *)na_, (json_t *)nb_))
        json_object_set_new(m, "not", json_pack("{s:[OO]}", "anyOf", na_, nb_));
    /* multipleOf of two whole numbers: their least common multiple */
    const json_t *ma = json_object_get(a, "multipleOf"), *mb = json_object_get(b, "multipleOf");
    if (ma && mb && !json_equal((json_t *)ma, (json_t *)mb) && json_is_integer(ma) &&
        json_is_integer(mb) && json_integer_value(ma) > 0 && json_integer_value(mb) > 0) {
        long long x = json_integer_value(ma), y = json_integer_value(mb), g = x, h = y;
        while (h) {
            long long t = g % h;
            g = h;
            h = t;
        }
        if (x / g <= INT32_MAX / y)
            json_object_set_new(m, "multipleOf", json_integer(x / g * y));
    }
    /* uniqueItems: either */
    if (json_is_true(json_object_get(a, "uniqueItems")) ||
        json_is_true(json_object_get(b, "uniqueItems")))
        json_object_set(m, "uniqueItems", json_true());
    /* anything else on both sides with different values */
    json_object_foreach((json_t *)a, k, v) {
        if (!is_known_keyword(k) || json_object_get(m, k))
            continue;
        if (IN_LIST(k, min_keys) || IN_LIST(k, max_keys) || IN_LIST(k, bound_keys) ||
            ((strcmp(k, "const") == 0 || strcmp(k, "enum") == 0) && json_object_get(m, "enum")))
            continue;
        rc = merge_fail(err, k);
        goto fail;
    }
    json_object_foreach((json_t *)b, k, v) {
        if (!is_known_keyword(k) || json_object_get(m, k))
            continue;
        if (IN_LIST(k, min_keys) || IN_LIST(k, max_keys) || IN_LIST(k, bound_keys) ||
            ((strcmp(k, "const") == 0 || strcmp(k, "enum") == 0) && json_object_get(m, "enum")))
            continue;
        rc = merge_fail(err, k);
        goto fail;
    }
    *out = m;
    return SW_OK;
fail:
    json_decref(m);
    return rc;
}

/* ---- the compiler ----------------------------------------------------------- */

/* A schema no value of which is generated: false, a value nested deeper
 * than the automaton's stack (recursive schemas), an empty intersection.
 * Containers drop an optional property or item of it; a required one
 * makes the container CS_NEVER too. Never a node index. */
#define CS_NEVER (-2)

/* Keywords that constrain values of one type: a schema without "type" that
 * holds some of them generates values of those types only (a narrowing:
 * {"minLength": 2} also allows any number). */
static const char *const object_keywords[] = {
    "properties", "required", "additionalProperties", "patternProperties", "minProperties",
    "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
};
static const char *const array_keywords[] = {"items", "prefixItems", "additionalItems",
                                             "minItems", "maxItems", "contains",
                                             "minContains", "maxContains", "uniqueItems"};
static const char *const string_keywords[] = {"minLength", "maxLength", "pattern"};
static const char *const number_keywords[] = {"minimum", "maximum", "exclusiveMinimum",
                                              "exclusiveMaximum", "multipleOf"};

static int inferred_types(const json_t *s)
{
    int m = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (IN_LIST(k, object_keywords))
            m |= T_OBJECT;
        else if (IN_LIST(k, array_keywords) && !(strcmp(k, "uniqueItems") == 0 && json_is_false(v)))
            m |= T_ARRAY;
        else if (IN_LIST(k, string_keywords))
            m |= T_STRING;
        else if (IN_LIST(k, number_keywords))
            m |= T_NUMBER | T_INTEGER;
    }
    return m ? m : T_ALL;
}

/* The first keyword of s that is a known assertion the compiler cannot
 * enforce, or NULL. Unknown keywords are annotations. */
static const char *refused_keyword(const sc_doc *d, const json_t *s)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!is_known_keyword(key))
            continue;
        if (strcmp(key, "uniqueItems") == 0)
            continue; /* at most one item is generated */
        if (strcmp(key, "format") == 0) {
            if (json_is_string(v) && IN_LIST(json_string_value(v), known_formats) &&
                !eng_format_pattern(json_string_value(v), NULL))
                return key;
            continue;
        }
        if (strcmp(key, "items") == 0 || strcmp(key, "additionalItems") == 0)
            continue; /* draft 7 tuples too */
        if (strcmp(key, "minContains") == 0 || strcmp(key, "maxContains") == 0 ||
            strcmp(key, "then") == 0 || strcmp(key, "else") == 0) {
            continue; /* without contains / if: no effect; with them: refused there */
        }
        if (strcmp(key, "$ref") == 0 && d->dialect == SC_2020)
            continue;
        if (strcmp(key, "$ref") == 0)
            return NULL; /* draft 7: the other keywords are ignored */
        if (
            strcmp(key, "unevaluatedItems") == 0 || strcmp(key, "unevaluatedProperties") == 0 ||
            strcmp(key, "$dynamicRef") == 0 || strcmp(key, "$recursiveRef") == 0)
            return key;
    }
    return NULL;
}

/* True when every keyword of s other than `except` is an annotation. */
static bool only_annotations(const json_t *s, const char *except)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (strcmp(k, except) != 0 && is_known_keyword(k))
            return false;
    }
    return true;
}

/* ---- flattening allOf and $ref ---- */

/* Appends to atoms the schemas whose conjunction s is, without allOf or
 * $ref; base is where s's references resolve. */
static int flatten(sc_doc *d, const json_t *s, const char *base, json_t *atoms, int chain,
                   sw_error *err)
{
    if (json_is_true(s))
        return SW_OK;
    if (!json_is_object(s)) {
        if (json_is_false(s))
            return json_array_append(atoms, (json_t *)s) ? SW_ENOMEM : SW_OK;
        return sw_error_set(err, SW_EINVAL, "a schema must be an object or a boolean");
    }
    if (chain > SC_MAX_REF_CHAIN || json_array_size(atoms) > 256)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "allOf / $ref nest too deeply (a $ref cycle that never reaches a "
                            "value?)");
    const char *mine = doc_base_of(d, s);
    if (!mine)
        mine = base;
    const json_t *ref = json_object_get(s, "$ref");
    const json_t *all = json_object_get(s, "allOf");
    int rc;
    if (ref && !json_is_string(ref))
        return sw_error_set(err, SW_EINVAL, "'$ref' must be a string");
    if (all && (!json_is_array(all) || json_array_size(all) == 0))
        return sw_error_set(err, SW_EINVAL, "'allOf' must be a non-empty array of schemas");
    bool ref_only = ref && d->dialect != SC_2020;
    if (!ref_only) {
        if (!ref && !all) {
            if (json_array_append(atoms, (json_t *)s))
                return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
        } else {
            json_t *rest = json_copy((json_t *)s);
            if (!rest)
                return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
            json_object_del(rest, "$ref");
            json_object_del(rest, "allOf");
            char key[32];
            ptr_key(rest, key, sizeof key);
            if (!doc_keep(d, rest) || json_object_set_new(d->bases, key, json_string(mine)) ||
                json_array_append(atoms, rest))
                return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
        }
        for (size_t i = 0; all && i < json_array_size(all); i++)
            if ((rc = flatten(d, json_array_get(all, i), mine, atoms, chain + 1, err)))
                return rc;
    }
    if (ref) {
        const json_t *target;
        if ((rc = doc_resolve(d, mine, json_string_value(ref), &target, err)))
            return rc;
        const char *tb = doc_base_of(d, target);
        if ((rc = flatten(d, target, tb ? tb : mine, atoms, chain + 1, err)))
            return rc;
    }
    return SW_OK;
}

/* s without allOf / $ref: one schema (borrowed: the document's or its
 * arena's), or false. */
static int effective(sc_doc *d, const json_t *s, const char *base, const json_t **out,
                     sw_error *err)
{
    if (!json_is_object(s) || (!json_object_get(s, "allOf") && !json_object_get(s, "$ref"))) {
        *out = s;
        return SW_OK;
    }
    json_t *atoms = json_array();
    if (!atoms)
        return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
    int rc = flatten(d, s, base, atoms, 0, err);
    json_t *acc = NULL;
    for (size_t i = 0; rc == SW_OK && i < json_array_size(atoms); i++) {
        const json_t *x = json_array_get(atoms, i);
        if (json_is_false(x)) {
            json_decref(acc);
            acc = json_false();
            break;
        }
        if (!acc) {
            acc = json_incref((json_t *)x);
            continue;
        }
        json_t *m = NULL;
        rc = merge2(acc, x, &m, err);
        json_decref(acc);
        acc = m;
        if (json_is_false(acc))
            break;
    }
    json_decref(atoms);
    if (rc) {
        json_decref(acc);
        return rc;
    }
    if (!acc)
        acc = json_true();
    if (json_is_boolean(acc)) {
        *out = json_is_true(acc) ? json_true() : json_false();
        json_decref(acc);
        return SW_OK;
    }
    char key[32];
    ptr_key(acc, key, sizeof key);
    bool known = doc_base_of(d, acc) != NULL;
    if (!doc_keep(d, acc) || (!known && json_object_set_new(d->bases, key, json_string(base))))
        return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
    *out = acc;
    return SW_OK;
}


/* ---- compiling one schema ---- */

static int compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
static int val_judge(const sc_doc *d, const json_t *schema, const json_t *value, sw_error *err);

static int oom(builder *b)
{
    return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
}

/* A non-negative integer keyword, clamped to INT32_MAX; absent: dflt. */
static int get_count(builder *b, const json_t *s, const char *key, size_t plen, int32_t dflt,
                     int32_t *out)
{
    const json_t *v = json_object_get(s, key);
    if (!v) {
        *out = dflt;
        return SW_OK;
    }
    if (json_is_real(v) && json_real_value(v) >= 0 &&
        json_real_value(v) == floor(json_real_value(v))) {
        double d = json_real_value(v);
        *out = d > INT32_MAX ? INT32_MAX : (int32_t)d;
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

/* enum / const: the values that the whole schema s accepts (the validator
 * judges each, so any keyword beside the enum is honoured exactly). */
static int compile_literals(builder *b, const json_t *s, size_t plen, int32_t *out)
{
    const json_t *c = json_object_get(s, "const");
    const json_t *e = json_object_get(s, "enum");
    const char *key = c ? "const" : "enum";
    size_t n = c ? 1 : json_array_size(e);
    if (!c && !json_is_array(e)) {
        size_t l = path_push(b, plen, "enum");
        return fail_at(b, l, SW_EINVAL, "'enum' must be an array");
    }
    if (!c && n == 0)
        return fail_at(b, path_push(b, plen, "enum"), SW_EINVAL, "'enum' is empty");
    /* every generated byte is checked against each literal: a bound keeps
     * a request from making every token slow */
    if (n > 4096)
        return fail_at(b, path_push(b, plen, "enum"), SW_EUNSUPPORTED,
                       "more than 4096 enum values");
    const json_t **vals = sw_calloc(n ? n : 1, sizeof *vals);
    if (!vals)
        return oom(b);
    size_t kept = 0;
    int rc = SW_OK;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = c ? c : json_array_get(e, i);
        sw_error verr;
        int vrc = val_judge(b->doc, s, v, &verr);
        if (vrc == SW_OK) {
            vals[kept++] = v;
        } else if (vrc != SW_EINVAL) {
            rc = fail_at(b, plen, vrc, verr.message);
            goto done;
        }
    }
    if (kept == 0) {
        *out = CS_NEVER;
        if (plen <= 1) {
            size_t l = path_push(b, plen, key);
            rc = fail_at(b, l, SW_EINVAL, "no value of the enum/const matches the schema");
        }
    } else if ((*out = make_literals(b->g, vals, kept)) < 0) {
        rc = oom(b);
    }
done:
    sw_free(vals);
    return rc;
}

/* An object node of the given keys (JSON-escaped with the colon) and value
 * nodes. Takes over nothing: copies keys. */
static int make_object(builder *b, char **keys, const int32_t *children, const bool *required,
                       size_t n, int32_t *out)
{
    eng_grammar *g = b->g;
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_OBJECT;
    nd.keys = sw_calloc(n ? n : 1, sizeof *nd.keys);
    nd.key_lens = sw_calloc(n ? n : 1, sizeof *nd.key_lens);
    nd.children = sw_calloc(n ? n : 1, sizeof *nd.children);
    nd.required = sw_calloc(n ? n : 1, sizeof *nd.required);
    nd.req_from = sw_calloc(n + 1, sizeof *nd.req_from);
    nd.any_from = sw_calloc(n + 1, sizeof *nd.any_from);
    nd.next_req = sw_calloc(n + 1, sizeof *nd.next_req);
    if (!nd.keys || !nd.key_lens || !nd.children || !nd.required || !nd.req_from ||
        !nd.any_from || !nd.next_req) {
        node_clear(&nd);
        return oom(b);
    }
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        nd.keys[i] = sw_strndup(keys[i], kl);
        nd.n_props = (int32_t)i + 1;
        if (!nd.keys[i]) {
            node_clear(&nd);
            return oom(b);
        }
        nd.key_lens[i] = (int32_t)kl;
        nd.children[i] = children[i];
        nd.required[i] = required[i];
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
    if ((*out = add_node(g, &nd)) < 0)
        return oom(b);
    return SW_OK;
}

/* "\"name\":" as generated, sw_malloc'd. */
static char *key_text(const char *name)
{
    json_t *ks = json_string(name);
    int32_t kl = 0;
    char *text = ks ? dump_value(ks, &kl) : NULL;
    json_decref(ks);
    char *k = text ? sw_malloc((size_t)kl + 2) : NULL;
    if (k) {
        memcpy(k, text, (size_t)kl);
        k[kl] = ':';
        k[kl + 1] = '\0';
    }
    sw_free(text);
    return k;
}

/* forbid: a property that must be absent (from not: {required: [...]}),
 * or NULL. */
/* required with dependentRequired (and draft 7's array dependencies)
 * folded in: a property's dependencies are required whenever it is
 * declared or required (a narrowing). New reference, or NULL (oom). */
static json_t *required_closure(const json_t *s)
{
    const json_t *req = json_object_get(s, "required");
    json_t *all = json_is_array(req) ? json_copy((json_t *)req) : json_array();
    const json_t *props = json_object_get(s, "properties");
    static const char *const dep_keys[] = {"dependentRequired", "dependencies"};
    for (int round = 0; all && round < 4; round++) {
        for (int d = 0; d < 2; d++) {
            const json_t *deps = json_object_get(s, dep_keys[d]);
            const char *k;
            const json_t *list;
            json_object_foreach((json_t *)deps, k, list) {
                if (!json_is_array(list))
                    continue;
                bool present = json_object_get(props, k) != NULL;
                for (size_t i = 0; !present && i < json_array_size(all); i++)
                    present = json_string_value(json_array_get(all, i)) &&
                              strcmp(json_string_value(json_array_get(all, i)), k) == 0;
                for (size_t i = 0; present && i < json_array_size(list); i++) {
                    const json_t *name = json_array_get(list, i);
                    bool dup = false;
                    for (size_t j = 0; j < json_array_size(all) && !dup; j++)
                        dup = json_equal(json_array_get(all, j), (json_t *)name);
                    if (!dup && json_is_string(name))
                        json_array_append(all, (json_t *)name);
                }
            }
        }
    }
    return all;
}

static int compile_object(builder *b, const json_t *s, const char *forbid, int32_t depth,
                          size_t plen, int32_t *out)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *addl = json_object_get(s, "additionalProperties");
    const json_t *names = json_object_get(s, "propertyNames");
    const json_t *pprops = json_object_get(s, "patternProperties");
    if (pprops && !json_is_object(pprops))
        return fail_at(b, path_push(b, plen, "patternProperties"), SW_EINVAL,
                       "'patternProperties' must be an object of schemas");
    eng_grammar *g = b->g;
    int rc = SW_OK;
    int32_t min_props, max_props;
    if ((rc = get_count(b, s, "minProperties", plen, 0, &min_props)) ||
        (rc = get_count(b, s, "maxProperties", plen, INT32_MAX, &max_props)))
        return rc;
    if (json_object_get(s, "required") && !json_is_array(json_object_get(s, "required")))
        return fail_at(b, path_push(b, plen, "required"), SW_EINVAL,
                       "'required' must be an array of strings");
    json_t *req_all = required_closure(s);
    if (!req_all || !doc_keep(b->doc, req_all))
        return oom(b);
    const json_t *req = json_array_size(req_all) ? req_all : json_object_get(s, "required");
    if (props && !json_is_object(props))
        return fail_at(b, path_push(b, plen, "properties"), SW_EINVAL,
                       "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail_at(b, path_push(b, plen, "required"), SW_EINVAL,
                       "'required' must be an array of strings");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail_at(b, path_push(b, plen, "additionalProperties"), SW_EINVAL,
                       "'additionalProperties' must be a schema");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i)))
            return fail_at(b, path_push_index(b, path_push(b, plen, "required"), i), SW_EINVAL,
                           "'required' must be an array of strings");
    /* The declared properties, then the required ones not declared (their
     * schema is additionalProperties). */
    size_t n_decl = json_object_size(props), n_max = n_decl + json_array_size(req);
    if (n_max > 4096)
        return fail_at(b, path_push(b, plen, "properties"), SW_EUNSUPPORTED,
                       "more than 4096 properties");
    if (n_max == 0) {
        if (json_is_false(addl) || max_props == 0) {
            /* only {} */
            if (min_props > 0) {
                *out = CS_NEVER;
                return SW_OK;
            }
            return make_object(b, NULL, NULL, NULL, 0, out);
        }
        /* free keys may repeat: a count of entries bounds the properties
         * from above, and from below only as "at least one" */
        if (min_props > 1)
            return fail_at(b, path_push(b, plen, "minProperties"), SW_EUNSUPPORTED,
                           "minProperties above 1 is enforced only for declared properties");
        bool counted = min_props > 0 || max_props < INT32_MAX;
        /* free keys could name a property that has dependencies */
        static const char *const dep_keys[] = {"dependentRequired", "dependencies"};
        for (int d = 0; d < 2; d++)
            if (json_object_size(json_object_get(s, dep_keys[d])) > 0)
                return fail_at(b, path_push(b, plen, dep_keys[d]), SW_EUNSUPPORTED,
                               "dependencies are enforced only for declared properties");
        if (json_object_size(pprops) > 0 && !json_is_false(addl)) {
            /* a free key may match any pattern: its value satisfies them all
             * and additionalProperties (a narrowing) */
            json_t *all = json_array();
            const char *pat;
            const json_t *ps;
            if (!all || !doc_keep(b->doc, all) || json_array_append(all, addl ? (json_t *)addl
                                                                             : json_true()))
                return oom(b);
            json_object_foreach((json_t *)pprops, pat, ps) {
                sw_error perr;
                eng_regex *re = NULL;
                /* a pattern the regex module refuses is refused here too */
                if ((rc = eng_regex_compile(pat, strlen(pat), &re, &perr)))
                    return fail_at(b, path_push(b, plen, "patternProperties"), rc, perr.message);
                eng_regex_free(re);
                json_array_append(all, (json_t *)ps);
            }
            json_t *w = json_pack("{s:O}", "allOf", all);
            if (!w || !doc_keep(b->doc, w))
                return oom(b);
            addl = w;
        }
        int32_t item, key_node = -1;
        if (names && !json_is_true(names)) {
            /* keys: strings of the propertyNames schema */
            json_t *w = json_pack("{s:[{s:s}O]}", "allOf", "type", "string", names);
            if (!w || !doc_keep(b->doc, w))
                return oom(b);
            if ((rc = compile(b, w, depth + 1, path_push(b, plen, "propertyNames"), &key_node)))
                return rc;
            if (key_node == CS_NEVER)
                return make_object(b, NULL, NULL, NULL, 0, out);
        }
        if (key_node >= 0 && g->nodes[key_node].kind == CS_LITERALS &&
            g->nodes[key_node].n_lits <= 256) {
            /* a finite set of names: each an optional declared property,
             * so none is written twice */
            const cs_node *kn = &g->nodes[key_node];
            int32_t n_names = kn->n_lits, item_node;
            if (addl && !json_is_true(addl)) {
                if ((rc = compile(b, addl, depth + 1, path_push(b, plen, "additionalProperties"),
                                  &item_node)))
                    return rc;
                if (item_node == CS_NEVER)
                    return make_object(b, NULL, NULL, NULL, 0, out);
            } else if ((item_node = make_any(g, any_levels(depth + 1))) < 0) {
                return oom(b);
            }
            char **ktext = sw_calloc((size_t)n_names, sizeof *ktext);
            int32_t *kids = sw_calloc((size_t)n_names, sizeof *kids);
            bool *kreq = sw_calloc((size_t)n_names, sizeof *kreq);
            rc = ktext && kids && kreq ? SW_OK : oom(b);
            for (int32_t i = 0; rc == SW_OK && i < n_names; i++) {
                kn = &g->nodes[key_node];
                ktext[i] = sw_malloc((size_t)kn->lit_lens[i] + 2);
                if (!ktext[i]) {
                    rc = oom(b);
                    break;
                }
                memcpy(ktext[i], kn->lits[i], (size_t)kn->lit_lens[i]);
                ktext[i][kn->lit_lens[i]] = ':';
                ktext[i][kn->lit_lens[i] + 1] = '\0';
                kids[i] = item_node;
            }
            /* min/maxProperties over these names, as for declared ones */
            int32_t n_used = n_names < max_props ? n_names : max_props;
            for (int32_t i = 0; i < n_used && i < min_props; i++)
                kreq[i] = true;
            if (rc == SW_OK && min_props > n_used)
                *out = CS_NEVER;
            else if (rc == SW_OK)
                rc = make_object(b, ktext, kids, kreq, (size_t)n_used, out);
            for (int32_t i = 0; ktext && i < n_names; i++)
                sw_free(ktext[i]);
            sw_free(ktext);
            sw_free(kids);
            sw_free(kreq);
            return rc;
        }
        if (key_node >= 0 || (addl && !json_is_true(addl)) || counted) {
            if (addl && !json_is_true(addl)) {
                size_t l = path_push(b, plen, "additionalProperties");
                if ((rc = compile(b, addl, depth + 1, l, &item)))
                    return rc;
                if (item == CS_NEVER)
                    return make_object(b, NULL, NULL, NULL, 0, out);
            } else if ((item = make_any(g, any_levels(depth + 1))) < 0) {
                return oom(b);
            }
            if (key_node < 0) {
                if (g->any_key < 0 && (g->any_key = make_string(g, 0, INT32_MAX)) < 0)
                    return oom(b);
                key_node = g->any_key;
            }
            cs_node obj;
            memset(&obj, 0, sizeof obj);
            obj.kind = CS_ANYOBJ;
            obj.item = item;
            obj.key_node = key_node;
            obj.counted = counted;
            obj.min_items = min_props;
            obj.max_items = max_props;
            if ((*out = add_node(g, &obj)) < 0)
                return oom(b);
            return SW_OK;
        }
        if ((*out = make_any_object(g, any_levels(depth) > 0 ? any_levels(depth) : 1)) < 0)
            return oom(b);
        return SW_OK;
    }
    char **keys = sw_calloc(n_max, sizeof *keys);
    int32_t *children = sw_calloc(n_max, sizeof *children);
    bool *required = sw_calloc(n_max, sizeof *required);
    json_t *req_set = json_object(), *seen = json_object();
    size_t n = 0;
    if (!keys || !children || !required || !req_set || !seen) {
        rc = oom(b);
        goto done;
    }
    /* The required names as a set: a lookup per property instead of a
     * scan of 'required' (properties x required strcmp took seconds for a
     * 1 MiB body). */
    for (size_t r = 0; r < json_array_size(req); r++)
        if (json_object_set_new(req_set, json_string_value(json_array_get(req, r)), json_true())) {
            rc = oom(b);
            goto done;
        }
    size_t plen_props = path_push(b, plen, "properties");
    for (size_t pass = 0; pass < 2; pass++) {
        size_t count = pass == 0 ? n_decl : json_array_size(req);
        void *iter = pass == 0 ? json_object_iter((json_t *)props) : NULL;
        for (size_t i = 0; i < count; i++) {
            const char *key;
            const json_t *sub;
            size_t l;
            if (pass == 0) {
                key = json_object_iter_key(iter);
                sub = json_object_iter_value(iter);
                iter = json_object_iter_next((json_t *)props, iter);
                l = path_push(b, plen_props, key);
            } else {
                key = json_string_value(json_array_get(req, i));
                if (json_object_get(props, key) || json_object_get(seen, key))
                    continue;
                sub = addl ? addl : json_true();
                l = path_push(b, plen, addl ? "additionalProperties" : "required");
            }
            if (json_object_get(s, "patternProperties")) {
                /* the patterns that match the name apply too */
                json_t *w = NULL;
                sw_error perr;
                if ((rc = prop_schema(s, key, &w, &perr)) || !doc_keep(b->doc, w)) {
                    rc = rc ? fail_at(b, path_push(b, plen, "patternProperties"), rc, perr.message)
                            : oom(b);
                    goto done;
                }
                sub = w;
            }
            if (json_object_set_new(seen, key, json_true())) {
                rc = oom(b);
                goto done;
            }
            bool is_req = json_object_get(req_set, key) != NULL;
            int32_t child;
            bool name_ok = true;
            if (names) {
                /* a name propertyNames refuses is never generated */
                json_t *ks = json_string(key);
                sw_error verr;
                int vrc = ks ? val_judge(b->doc, names, ks, &verr) : SW_ENOMEM;
                json_decref(ks);
                if (vrc != SW_OK && vrc != SW_EINVAL) {
                    rc = vrc == SW_ENOMEM ? oom(b)
                                          : fail_at(b, path_push(b, plen, "propertyNames"), vrc,
                                                    verr.message);
                    goto done;
                }
                name_ok = vrc == SW_OK;
            }
            if ((forbid && strcmp(forbid, key) == 0) || !name_ok) {
                child = CS_NEVER;
            } else if ((rc = compile(b, sub, depth + 1, l, &child))) {
                goto done;
            }
            if (child == CS_NEVER) {
                if (is_req) {
                    *out = CS_NEVER;
                    goto done;
                }
                continue; /* never generated */
            }
            if (!(keys[n] = key_text(key))) {
                rc = oom(b);
                goto done;
            }
            children[n] = child;
            required[n] = is_req;
            n++;
        }
    }
    /* minProperties / maxProperties over the declared properties: the
     * first optional ones become required, the last ones are left out (a
     * narrowing) */
    {
        size_t n_req = 0;
        for (size_t i = 0; i < n; i++)
            n_req += required[i];
        for (size_t i = 0; i < n && n_req < (size_t)min_props; i++)
            if (!required[i]) {
                required[i] = true;
                n_req++;
            }
        if (n_req < (size_t)min_props || n_req > (size_t)max_props) {
            *out = CS_NEVER;
            goto done;
        }
        size_t room = (size_t)max_props - n_req, kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (!required[i]) {
                if (room == 0) {
                    sw_free(keys[i]);
                    keys[i] = NULL;
                    continue;
                }
                room--;
            }
            keys[kept] = keys[i];
            children[kept] = children[i];
            required[kept] = required[i];
            if (kept != i)
                keys[i] = NULL;
            kept++;
        }
        n = kept;
    }
    rc = make_object(b, keys, children, required, n, out);
done:
    for (size_t i = 0; keys && i < n_max; i++)
        sw_free(keys[i]);
    sw_free(keys);
    sw_free(children);
    sw_free(required);
    json_decref(req_set);
    json_decref(seen);
    return rc;
}

static int compile_array(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    const json_t *items = json_object_get(s, "items");
    const json_t *tuple = json_object_get(s, "prefixItems");
    const char *tuple_key = "prefixItems";
    cs_node nd;
    int rc;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_ARRAY;
    if (b->doc->dialect != SC_2020 || (json_is_array(items) && !tuple)) {
        /* draft 7 (and a 2020-12 schema written that way): items as an
         * array is the tuple, additionalItems the rest */
        tuple = json_is_array(items) ? items : NULL;
        tuple_key = "items";
        if (tuple)
            items = json_object_get(s, "additionalItems");
    } else if (json_is_array(items)) {
        return fail_at(b, path_push(b, plen, "items"), SW_EINVAL,
                       "'items' must be a schema beside 'prefixItems'");
    }
    if (tuple && !json_is_array(tuple))
        return fail_at(b, path_push(b, plen, tuple_key), SW_EINVAL,
                       "expected an array of schemas");
    if (json_array_size(tuple) > 256)
        return fail_at(b, path_push(b, plen, tuple_key), SW_EUNSUPPORTED,
                       "more than 256 tuple items");
    if ((rc = get_count(b, s, "minItems", plen, 0, &nd.min_items)) ||
        (rc = get_count(b, s, "maxItems", plen, INT32_MAX, &nd.max_items)))
        return rc;
    if (nd.min_items > nd.max_items) {
        *out = CS_NEVER;
        return plen <= 1 ? fail_at(b, path_push(b, plen, "minItems"), SW_EINVAL,
                                   "minItems is larger than maxItems")
                         : SW_OK;
    }
    /* contains: every item is generated matching it (a narrowing), so
     * minContains / maxContains become bounds on the item count */
    const json_t *contains = json_object_get(s, "contains");
    if (contains) {
        int32_t cmin = 1, cmax = INT32_MAX;
        if (b->doc->dialect == SC_2020 &&
            ((rc = get_count(b, s, "minContains", plen, 1, &cmin)) ||
             (rc = get_count(b, s, "maxContains", plen, INT32_MAX, &cmax))))
            return rc;
        if (cmin > 0 || cmax < INT32_MAX) {
            if (cmin > nd.min_items)
                nd.min_items = cmin;
            if (cmax < nd.max_items)
                nd.max_items = cmax;
        } else {
            contains = NULL; /* no effect */
        }
    }
    /* uniqueItems: at most one item is generated (a narrowing) */
    if (json_is_true(json_object_get(s, "uniqueItems")) && nd.max_items > 1)
        nd.max_items = 1;
    /* an item's schema: with contains, both */
    const json_t *item_s[257];
    size_t n_tuple = json_array_size(tuple);
    for (size_t i = 0; i <= n_tuple; i++) {
        const json_t *x = i < n_tuple ? json_array_get(tuple, i) : items;
        if (contains) {
            json_t *w = json_pack("{s:[OO]}", "allOf", x ? x : json_true(), contains);
            if (!w || !doc_keep(b->doc, w))
                return oom(b);
            x = w;
        }
        item_s[i] = x;
    }
    if (n_tuple > 0) {
        nd.prefix = sw_calloc(n_tuple, sizeof *nd.prefix);
        if (!nd.prefix)
            return oom(b);
    }
    for (size_t i = 0; i < n_tuple && (int64_t)i < nd.max_items; i++) {
        int32_t node;
        size_t l = path_push_index(b, path_push(b, plen, tuple_key), i);
        if ((rc = compile(b, item_s[i], depth + 1, l, &node))) {
            node_clear(&nd);
            return rc;
        }
        if (node == CS_NEVER) {
            nd.max_items = (int32_t)i; /* no array reaches past it */
            break;
        }
        nd.prefix[nd.n_prefix++] = node;
    }
    const json_t *rest = item_s[n_tuple];
    nd.item = CS_NEVER;
    if (nd.max_items > nd.n_prefix) {
        if (rest && !json_is_true(rest)) {
            size_t l = path_push(b, plen, tuple ? (b->doc->dialect != SC_2020 ? "additionalItems"
                                                                               : "items")
                                                : "items");
            if ((rc = compile(b, rest, depth + 1, l, &nd.item))) {
                node_clear(&nd);
                return rc;
            }
        } else if ((nd.item = make_any(g, any_levels(depth + 1))) < 0) {
            node_clear(&nd);
            return oom(b);
        }
    }
    if (nd.item == CS_NEVER) {
        /* nothing after the tuple */
        if (nd.max_items > nd.n_prefix)
            nd.max_items = nd.n_prefix;
        if ((nd.item = make_any(g, 0)) < 0) {
            node_clear(&nd);
            return oom(b);
        }
    }
    if (nd.min_items > nd.max_items) {
        node_clear(&nd);
        *out = CS_NEVER;
        return SW_OK;
    }
    if ((*out = add_node(g, &nd)) < 0)
        return oom(b);
    return SW_OK;
}

/* ---- numbers ----
 * Bounds become integer bounds on the integer part, written as decimal
 * digit strings, so any bound JSON can write is exact (1e308 has its 309
 * digits): minimum 1.5 is 2 for the integer part, exclusiveMaximum 10 is
 * 9. A fraction is generated only after an integer part strictly inside
 * (constrain-impl.h), so 9.5 is never generated under exclusiveMaximum
 * 10 (a narrowing). */

/* multipleOf 10^-p (0.1, 0.01, ...): p, else 0. */
static int32_t decimal_step(double mo)
{
    for (int32_t p = 1; p <= ENG_CS_MAX_FRAC_DIGITS; p++)
        if (mo == pow(10.0, -p))
            return p;
    return 0;
}

static int compile_number(builder *b, const json_t *s, bool integer, size_t plen, int32_t *out)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = integer ? CS_INTEGER : CS_NUMBER;
    for (size_t i = 0; i < 4; i++) {
        const json_t *v = json_object_get(s, bound_keys[i]);
        if (v && !is_num(v) && !(i >= 2 && json_is_boolean(v)))
            return fail_at(b, path_push(b, plen, bound_keys[i]), SW_EINVAL,
                           "a bound must be a number");
        if (sw_json_big_text(v) && !big_ok(v))
            return fail_at(b, path_push(b, plen, bound_keys[i]), SW_EUNSUPPORTED,
                           "a bound past a double's range is supported as an integer of at most "
                           "400 digits only (no fraction, no exponent)");
    }
    const json_t *mo = json_object_get(s, "multipleOf");
    if (sw_json_big_text(mo))
        return fail_at(b, path_push(b, plen, "multipleOf"), SW_EUNSUPPORTED,
                       "'multipleOf' above 214748364 is not supported");
    if (mo) {
        double m = json_number_value(mo);
        if (!json_is_number(mo) || !(m > 0))
            return fail_at(b, path_push(b, plen, "multipleOf"), SW_EINVAL,
                           "'multipleOf' must be a positive number");
        if (m == floor(m)) {
            if (m > INT32_MAX / 10)
                return fail_at(b, path_push(b, plen, "multipleOf"), SW_EUNSUPPORTED,
                               "'multipleOf' above 214748364 is not supported");
            /* numbers too: whole multiples only (a narrowing) */
            nd.kind = CS_INTEGER;
            nd.multiple_of = m == 1 ? 0 : (int32_t)m;
        } else if (decimal_step(m) > 0 && decimal_step(m) != 5) {
            /* 0.1, 0.01, ...: whole numbers only (a narrowing). Their
             * fractions are multiples too, but validators that divide in
             * doubles (python-jsonschema) call 0.07 / 0.01 inexact; a whole
             * number divides exactly for these steps (not for 1e-5) */
            nd.kind = CS_INTEGER;
        } else if (!(integer && 1 / m == floor(1 / m))) {
            return fail_at(b, path_push(b, plen, "multipleOf"), SW_EUNSUPPORTED,
                           "'multipleOf' is enforced for whole numbers and 10^-k only");
        }
    }
    num_bound lo = bound_get(s, true), hi = bound_get(s, false);
    if (lo.v || hi.v) {
        nd.ranged = true;
        /* Per sign, the magnitude's bounds: the non-negative side sees
         * [lo, hi], the negative one [-hi, -lo]. */
        for (int sign = 0; sign < 2; sign++) {
            num_bound l = sign ? hi : lo, h = sign ? lo : hi;
            /* magnitude bounds, rounded inwards: floor / ceil of the
             * value, negated for the negative side */
            dec il, ih, fl, fh;
            bool has_l = l.v != NULL, has_h = h.v != NULL;
            if (has_l) {
                dec_round(l.v, sign, &il); /* ceil(lo), or -floor(hi) */
                if (sign)
                    dec_negate(&il);
                fl = il;
                if (l.excl && num_whole(l.v))
                    dec_step(&il, +1);
            }
            if (has_h) {
                dec_round(h.v, !sign, &ih); /* floor(hi), or -ceil(lo) */
                if (sign)
                    dec_negate(&ih);
                if (h.excl && num_whole(h.v))
                    dec_step(&ih, -1);
                dec_round(h.v, !sign, &fh); /* floor(hi) - 1, or -ceil(lo) - 1 */
                if (sign)
                    dec_negate(&fh);
                dec_step(&fh, -1);
            }
            bool nonzero = has_l && l.excl && num_whole(l.v);
            dec zero = {false, "0"};
            if (!has_l || il.neg)
                il = zero;
            if (!has_l || fl.neg) {
                fl = zero; /* below zero: any fraction of 0 is inside */
                nonzero = false;
            }
            /* the integer part may be as long as the bounds (not with a
             * multiple: its arithmetic is in int64) */
            size_t digits = ENG_CS_MAX_INT_DIGITS;
            if (nd.multiple_of == 0) {
                if (has_l && strlen(il.mag) > digits)
                    digits = strlen(il.mag);
                if (has_h && !ih.neg && strlen(ih.mag) > digits)
                    digits = strlen(ih.mag);
                if (digits > ENG_CS_MAX_BIG_DIGITS)
                    digits = ENG_CS_MAX_BIG_DIGITS;
                if ((int32_t)digits > nd.int_digits)
                    nd.int_digits = (int32_t)digits;
            }
            bool int_ok = (!has_h || (!ih.neg && dec_cmp(&il, &ih) <= 0)) &&
                          strlen(il.mag) <= digits;
            bool frac_ok = !integer && nd.kind == CS_NUMBER &&
                           (!has_h || (!fh.neg && dec_cmp(&fl, &fh) <= 0)) &&
                           strlen(fl.mag) <= ENG_CS_MAX_INT_DIGITS;
            /* every value generated is below a bound past the digits */
            bool ih_cap = has_h && strlen(ih.mag) <= digits;
            bool fh_cap = has_h && strlen(fh.mag) <= ENG_CS_MAX_INT_DIGITS;
            nd.int_ok[sign] = int_ok;
            nd.frac_ok[sign] = frac_ok;
            nd.frac_nonzero[sign] = frac_ok && nonzero;
            if ((int_ok && (!(nd.int_lo[sign] = sw_strdup(il.mag)) ||
                            (ih_cap && !(nd.int_hi[sign] = sw_strdup(ih.mag))))) ||
                (frac_ok && (!(nd.frac_lo[sign] = sw_strdup(fl.mag)) ||
                             (fh_cap && !(nd.frac_hi[sign] = sw_strdup(fh.mag)))))) {
                node_clear(&nd);
                return oom(b);
            }
        }
        for (int sign = 0; sign < 2 && nd.multiple_of > 0; sign++) {
            /* with a multiple: the least magnitude is the first multiple at
             * or above int_lo (none in range: no value of that sign) */
            if (!nd.int_ok[sign])
                continue;
            long long lv = strtoll(nd.int_lo[sign], NULL, 10), m = nd.multiple_of;
            long long q = (lv + m - 1) / m * m;
            bool ok = q < 1000000000000000LL &&
                      (!nd.int_hi[sign] || q <= strtoll(nd.int_hi[sign], NULL, 10));
            char t[24];
            snprintf(t, sizeof t, "%lld", q);
            sw_free(nd.int_lo[sign]);
            nd.int_lo[sign] = ok ? sw_strdup(t) : NULL;
            nd.int_ok[sign] = ok && nd.int_lo[sign];
            if (ok && !nd.int_lo[sign]) {
                node_clear(&nd);
                return oom(b);
            }
        }
        if (!nd.int_ok[0] && !nd.int_ok[1] && !nd.frac_ok[0] && !nd.frac_ok[1]) {
            node_clear(&nd);
            *out = CS_NEVER;
            return SW_OK;
        }
    }
    if ((*out = add_node(b->g, &nd)) < 0)
        return oom(b);
    return SW_OK;
}

/* ---- pattern and format ------------------------------------------------------
 * A string's `pattern` and enforced `format` as one automaton over its
 * content (regex.h, formats.h; both: their intersection). *re is NULL when
 * the schema has neither. *max_chars: the format's own length bound
 * (hostname: 253), INT32_MAX when none. *key names the keyword at fault. */
static int string_automaton(const json_t *s, eng_regex **re, int32_t *max_chars,
                            const char **key, sw_error *err)
{
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    eng_regex *a = NULL;
    int rc;
    *re = NULL;
    *max_chars = INT32_MAX;
    *key = "pattern";
    if (pat) {
        if (!json_is_string(pat))
            return sw_error_set(err, SW_EINVAL, "'pattern' must be a string");
        if ((rc = eng_regex_compile(json_string_value(pat), json_string_length(pat), &a, err)))
            return rc;
    }
    const eng_regex *shared = NULL; /* formats.h's, compiled once */
    if (json_is_string(fmt) &&
        (rc = eng_format_regex(json_string_value(fmt), &shared, max_chars, err))) {
        *key = "format";
        eng_regex_free(a);
        return rc;
    }
    if (a && shared) {
        rc = eng_regex_intersect(a, shared, re, err);
        eng_regex_free(a);
        return rc;
    }
    if (shared) {
        *key = "format";
        return eng_regex_clone(shared, re, err);
    }
    *re = a;
    return SW_OK;
}

/* An enforced format: an untyped schema holding one is not "any value"
 * (its strings must match; other types are free). */
static bool has_enforced_format(const json_t *s)
{
    const json_t *fmt = json_object_get(s, "format");
    return json_is_string(fmt) && eng_format_pattern(json_string_value(fmt), NULL);
}

/* What each content byte costs in the JSON text: escapes are longer. */
static void json_byte_costs(uint8_t cost[256])
{
    for (int c = 0; c < 256; c++)
        cost[c] = c < 0x20 ? 6 : 1; /* \u00XX */
    cost['"'] = cost['\\'] = 2;
    cost['\b'] = cost['\f'] = cost['\n'] = cost['\r'] = cost['\t'] = 2;
}

/* A CS_PATTERN node for re (taken over) and lo..hi code points; CS_NEVER
 * when no string within the bounds matches (an error at the root). */
static int make_pattern(builder *b, eng_regex *re, int32_t lo, int32_t hi, size_t plen,
                        const char *key, int32_t *out)
{
    uint8_t cost[256];
    eng_regex_costs *t = NULL;
    sw_error e;
    json_byte_costs(cost);
    /* A long maxLength beside a large automaton: at most as many code
     * points as the costs table holds are generated (a narrowing). */
    int64_t cap = ENG_REGEX_MAX_COST_CELLS / eng_regex_n_states(re) - 1;
    if (hi != INT32_MAX && hi > cap && cap >= lo)
        hi = (int32_t)cap;
    int rc = eng_regex_costs_build(re, cost, lo, hi, &t, &e);
    if (rc) {
        eng_regex_free(re);
        return fail_at(b, path_push(b, plen, key), rc, e.message);
    }
    int64_t m = eng_regex_costs_get(t, eng_regex_start(re), 0);
    if (m < 0) {
        eng_regex_free(re);
        eng_regex_costs_free(t);
        *out = CS_NEVER;
        return plen <= 1 ? fail_at(b, path_push(b, plen, key), SW_EINVAL,
                                   "no string of the allowed lengths matches")
                         : SW_OK;
    }
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_PATTERN;
    nd.min_chars = lo;
    nd.max_chars = hi;
    nd.re = re;
    nd.re_costs = t;
    nd.min_bytes = len_add(2, m);
    if ((*out = add_node(b->g, &nd)) < 0)
        return oom(b);
    return SW_OK;
}

static int compile_typed(builder *b, const json_t *s, int type, const char *forbid,
                         int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    int rc;
    switch (type) {
    case T_OBJECT: return compile_object(b, s, forbid, depth, plen, out);
    case T_ARRAY: return compile_array(b, s, depth, plen, out);
    case T_STRING: {
        int32_t lo, hi;
        if ((rc = get_count(b, s, "minLength", plen, 0, &lo)) ||
            (rc = get_count(b, s, "maxLength", plen, INT32_MAX, &hi)))
            return rc;
        if (lo > hi) {
            *out = CS_NEVER;
            return plen <= 1 ? fail_at(b, path_push(b, plen, "minLength"), SW_EINVAL,
                                       "minLength is larger than maxLength")
                             : SW_OK;
        }
        eng_regex *re = NULL;
        int32_t fmt_max;
        const char *key;
        sw_error e;
        if ((rc = string_automaton(s, &re, &fmt_max, &key, &e)))
            return fail_at(b, path_push(b, plen, key), rc, e.message);
        if (re)
            return make_pattern(b, re, lo, hi < fmt_max ? hi : fmt_max, plen, key, out);
        *out = make_string(g, lo, hi);
        break;
    }
    case T_NUMBER:
    case T_INTEGER: return compile_number(b, s, type == T_INTEGER, plen, out);
    case T_BOOLEAN: *out = make_bool(g); break;
    default: {
        json_t *z = json_null();
        const json_t *v[1] = {z};
        *out = make_literals(g, v, 1);
        break;
    }
    }
    if (*out < 0)
        return oom(b);
    return SW_OK;
}

/* What a "not" asks, where it can be enforced: types to leave out, a
 * property to leave out, or literal values to filter (the validator does
 * that when the value set is finite). */
typedef struct not_info {
    int types_out;
    int types_only;     /* the value must have one of these types */
    const char *forbid; /* a property never generated */
    bool filter;        /* const / enum inside: only a finite value set can honour it */
} not_info;

static int analyze_not(builder *b, const json_t *n, size_t plen, not_info *ni, int nest)
{
    if (json_is_false(n))
        return SW_OK;
    if (json_is_true(n)) {
        ni->types_only = 0;
        return SW_OK;
    }
    const json_t *eff;
    int rc;
    if (nest > 8)
        return fail_at(b, plen, SW_EUNSUPPORTED, "'not' nested too deeply");
    if ((rc = effective(b->doc, n, b->base, &eff, b->err)))
        return rc;
    if (json_is_boolean(eff))
        return analyze_not(b, eff, plen, ni, nest + 1);
    const char *k;
    const json_t *v;
    int kinds = 0;
    json_object_foreach((json_t *)eff, k, v) {
        if (!is_known_keyword(k))
            continue;
        kinds++;
        if (strcmp(k, "type") == 0 || strcmp(k, "const") == 0 || strcmp(k, "enum") == 0)
            continue;
        if (strcmp(k, "required") == 0 && json_array_size(v) > 0 &&
            json_is_string(json_array_get(v, 0)))
            continue;
        if (strcmp(k, "anyOf") == 0 && json_is_array(v))
            continue;
        return fail_at(b, plen, SW_EUNSUPPORTED,
                       "'not' is enforced only for type, const, enum and required");
    }
    const json_t *any = json_object_get(eff, "anyOf");
    if (any) {
        if (kinds != 1)
            return fail_at(b, plen, SW_EUNSUPPORTED,
                           "'not' is enforced only for type, const, enum and required");
        /* not (A or B) = not A and not B */
        for (size_t i = 0; i < json_array_size(any); i++)
            if ((rc = analyze_not(b, json_array_get(any, i), plen, ni, nest + 1)))
                return rc;
        return SW_OK;
    }
    if (json_object_get(eff, "const") || json_object_get(eff, "enum")) {
        ni->filter = true;
        return SW_OK;
    }
    const json_t *req = json_object_get(eff, "required");
    int tm = type_mask(json_object_get(eff, "type"));
    if (tm < 0)
        return fail_at(b, plen, SW_EINVAL, "a malformed 'type' inside 'not'");
    if (req) {
        if (json_object_get(eff, "type"))
            return fail_at(b, plen, SW_EUNSUPPORTED,
                           "'not' with both type and required is not supported");
        /* not required [a, ...]: an object that lacks one of them; a (the
         * first) is never generated */
        ni->types_only &= T_OBJECT;
        if (!ni->forbid)
            ni->forbid = json_string_value(json_array_get(req, 0));
        else if (strcmp(ni->forbid, json_string_value(json_array_get(req, 0))) != 0)
            return fail_at(b, plen, SW_EUNSUPPORTED, "two 'not required' in one schema");
        return SW_OK;
    }
    ni->types_out |= tm;
    return SW_OK;
}

/* Can two alternatives of a oneOf match the same value? false only when
 * that is sure: different types, or enum / const values the other
 * refuses, or a required property both declare with such values. */
static bool may_overlap(builder *b, const json_t *x, const json_t *y, int nest)
{
    if (json_is_false(x) || json_is_false(y))
        return false;
    if (!json_is_object(x) || !json_is_object(y) || nest > 4)
        return true;
    int tx = type_mask(json_object_get(x, "type")), ty = type_mask(json_object_get(y, "type"));
    if (tx >= 0 && ty >= 0 && (tx & ty) == 0)
        return false;
    for (int side = 0; side < 2; side++) {
        const json_t *p = side ? y : x, *q = side ? x : y;
        const json_t *c = json_object_get(p, "const"), *e = json_object_get(p, "enum");
        if (!c && !json_is_array(e))
            continue;
        size_t n = c ? 1 : json_array_size(e);
        bool all_refused = true;
        for (size_t i = 0; i < n && all_refused; i++) {
            sw_error verr;
            if (val_judge(b->doc, q, c ? c : json_array_get(e, i), &verr) != SW_EINVAL)
                all_refused = false;
        }
        if (all_refused)
            return false;
    }
    /* a property required by both, whose schemas cannot overlap */
    const json_t *rx = json_object_get(x, "required"), *ry = json_object_get(y, "required");
    for (size_t i = 0; i < json_array_size(rx); i++) {
        const char *name = json_string_value(json_array_get(rx, i));
        bool in_y = false;
        for (size_t j = 0; name && j < json_array_size(ry) && !in_y; j++)
            in_y = json_string_value(json_array_get(ry, j)) &&
                   strcmp(json_string_value(json_array_get(ry, j)), name) == 0;
        if (!in_y)
            continue;
        json_t *px = NULL, *py = NULL;
        const json_t *ex, *ey;
        sw_error scratch;
        bool apart = false;
        if (!prop_schema(x, name, &px, &scratch) && !prop_schema(y, name, &py, &scratch) &&
            doc_keep(b->doc, json_incref(px)) && doc_keep(b->doc, json_incref(py)) &&
            !effective(b->doc, px, b->base, &ex, &scratch) &&
            !effective(b->doc, py, b->base, &ey, &scratch))
            apart = !may_overlap(b, ex, ey, nest + 1);
        json_decref(px);
        json_decref(py);
        if (apart)
            return false;
    }
    return true;
}

static int compile_anyof(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    const json_t *any = json_object_get(s, "anyOf");
    const char *key = "anyOf";
    bool one = false;
    if (!any) {
        any = json_object_get(s, "oneOf");
        key = "oneOf";
        one = true;
    }
    size_t n = json_array_size(any);
    size_t l = path_push(b, plen, key);
    int rc;
    if (!json_is_array(any) || n == 0)
        return fail_at(b, l, SW_EINVAL, "expected a non-empty array of schemas");
    if (n > 64)
        return fail_at(b, l, SW_EUNSUPPORTED, "more than 64 alternatives");
    if (b->anyof_nesting[depth] >= ENG_CS_MAX_ANYOF_NESTING)
        return fail_at(b, l, SW_EUNSUPPORTED, "anyOf/oneOf nested too deeply");
    /* the other keywords go into every alternative */
    json_t *rest = json_copy((json_t *)s);
    if (!rest || !doc_keep(b->doc, rest))
        return oom(b);
    json_object_del(rest, key);
    bool siblings = !only_annotations(rest, "");
    const json_t *alts_s[64];
    bool excluded[64] = {false};
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(any, i);
        if (siblings) {
            json_t *w = json_pack("{s:[OO]}", "allOf", rest, a);
            if (!w || !doc_keep(b->doc, w))
                return oom(b);
            a = w;
        }
        alts_s[i] = a;
    }
    if (one) {
        /* exactly one: generated as any one of them, so they must not
         * overlap (a value of one must fail the others) */
        const json_t *eff[64];
        for (size_t i = 0; i < n; i++) {
            sw_error e;
            if ((rc = effective(b->doc, alts_s[i], b->base, &eff[i], &e)))
                return fail_at(b, path_push_index(b, l, i), rc, e.message);
        }
        /* Alternatives that may overlap are generated as "this one and not
         * the others it may overlap" where that not can be enforced (else
         * the alternative is left out, a narrowing) */
        const json_t *orig[64];
        memcpy(orig, alts_s, n * sizeof *orig);
        for (size_t i = 0; i < n; i++) {
            json_t *excl = NULL;
            for (size_t j = 0; j < n; j++) {
                if (j == i || !may_overlap(b, eff[i], eff[j], 0))
                    continue;
                if (!excl && !(excl = json_array()))
                    return oom(b);
                json_array_append_new(excl, json_pack("{s:O}", "not", orig[j]));
            }
            if (!excl)
                continue;
            json_array_insert(excl, 0, (json_t *)orig[i]);
            json_t *w = json_pack("{s:o}", "allOf", excl);
            if (!w || !doc_keep(b->doc, w))
                return oom(b);
            alts_s[i] = w;
            excluded[i] = true;
        }
    }
    int32_t alts[64], kept = 0, dropped = 0;
    b->anyof_nesting[depth]++;
    for (size_t i = 0; i < n; i++) {
        int32_t a;
        if ((rc = compile(b, alts_s[i], depth, path_push_index(b, l, i), &a))) {
            if (rc == SW_EUNSUPPORTED && excluded[i]) {
                dropped++; /* its "not the others" cannot be enforced: left out */
                continue;
            }
            b->anyof_nesting[depth]--;
            return rc;
        }
        if (a != CS_NEVER)
            alts[kept++] = a;
    }
    b->anyof_nesting[depth]--;
    if (kept == 0 && dropped > 0)
        return fail_at(b, l, SW_EUNSUPPORTED,
                       "oneOf alternatives may both match a value, and excluding the others "
                       "cannot be enforced");
    if (kept == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (kept == 1) {
        *out = alts[0];
        return SW_OK;
    }
    if ((*out = make_anyof(g, alts, kept)) < 0)
        return oom(b);
    if (g->nodes[*out].n_branches > ENG_CS_MAX_BRANCHES)
        return fail_at(b, l, SW_EUNSUPPORTED,
                       "anyOf/oneOf alternatives expand to more than 64 branches");
    return SW_OK;
}

/* dependentSchemas (and draft 7's schema dependencies): each schema is
 * applied whether its property is there or not (a narrowing: such a value
 * satisfies "if p then S" either way), false as "p is never generated". */
static int compile_dependent(builder *b, const json_t *s, int32_t depth, size_t plen,
                             int32_t *out)
{
    json_t *rest = json_copy((json_t *)s);
    json_t *all = json_array();
    if (!rest || !doc_keep(b->doc, rest) || !all || !doc_keep(b->doc, all))
        return oom(b);
    json_object_del(rest, "dependentSchemas");
    json_t *arrays = json_object(); /* dependencies that are lists stay */
    if (!arrays || json_array_append_new(all, arrays))
        return oom(b);
    json_array_append(all, rest);
    static const char *const keys[] = {"dependentSchemas", "dependencies"};
    for (int d = 0; d < 2; d++) {
        const json_t *deps = json_object_get(s, keys[d]);
        const char *k;
        const json_t *v;
        if (!json_is_object(deps))
            continue;
        json_object_foreach((json_t *)deps, k, v) {
            if (json_is_array(v)) {
                json_object_set(arrays, k, (json_t *)v);
            } else if (json_is_false(v)) {
                if (json_array_append_new(all, json_pack("{s:{s:b}}", "properties", k, 0)))
                    return oom(b);
            } else if (json_is_object(v)) {
                json_array_append(all, (json_t *)v);
            } else if (!json_is_true(v)) {
                return fail_at(b, path_push(b, path_push(b, plen, keys[d]), k), SW_EINVAL,
                               "a dependency must be a schema or a list of names");
            }
        }
    }
    json_object_del(rest, "dependencies");
    if (json_object_size(arrays))
        json_object_set(rest, "dependentRequired", arrays);
    json_array_remove(all, 0);
    json_t *w = json_pack("{s:O}", "allOf", all);
    if (!w || !doc_keep(b->doc, w))
        return oom(b);
    return compile(b, w, depth, plen, out);
}

/* if / then / else: the values of (if and then) or of (not if and else).
 * Where "not if" cannot be enforced (docs/api.md, not), only the first
 * alternative is generated (a narrowing). */
static int compile_if(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    const json_t *cond = json_object_get(s, "if");
    const json_t *then = json_object_get(s, "then"), *other = json_object_get(s, "else");
    json_t *rest = json_copy((json_t *)s);
    if (!rest || !doc_keep(b->doc, rest))
        return oom(b);
    json_object_del(rest, "if");
    json_object_del(rest, "then");
    json_object_del(rest, "else");
    json_t *yes = json_pack("{s:[OOO]}", "allOf", rest, cond, then ? then : json_true());
    json_t *no = json_pack("{s:[O{s:O}O]}", "allOf", rest, "not", cond,
                           other ? other : json_true());
    if (!yes || !doc_keep(b->doc, yes) || !no || !doc_keep(b->doc, no))
        return oom(b);
    int32_t alts[2], n = 0, a;
    int rc = compile(b, yes, depth, path_push(b, plen, "then"), &a);
    if (rc)
        return rc;
    if (a != CS_NEVER)
        alts[n++] = a;
    rc = compile(b, no, depth, path_push(b, plen, "else"), &a);
    if (rc == SW_EUNSUPPORTED && n > 0)
        rc = SW_OK, a = CS_NEVER; /* "not if" cannot be enforced: then only */
    if (rc)
        return rc;
    if (a != CS_NEVER)
        alts[n++] = a;
    if (n == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (n == 1) {
        *out = alts[0];
        return SW_OK;
    }
    if ((*out = make_anyof(b->g, alts, n)) < 0)
        return oom(b);
    if (b->g->nodes[*out].n_branches > ENG_CS_MAX_BRANCHES)
        return fail_at(b, plen, SW_EUNSUPPORTED,
                       "if/then/else alternatives expand to more than 64 branches");
    return SW_OK;
}

/* A positive schema meaning "not n", for the simple forms: one numeric
 * bound (not minimum 5: a number below 5), or one property's schema (not
 * {properties: {p: S}}: an object with p, not S). New reference, or NULL
 * when n is not of those forms. */
static json_t *negate_simple(const json_t *n)
{
    if (!json_is_object(n))
        return NULL;
    const char *k, *only = NULL;
    const json_t *v;
    json_object_foreach((json_t *)n, k, v) {
        if (!is_known_keyword(k))
            continue;
        if (only)
            return NULL;
        only = k;
    }
    if (!only)
        return NULL;
    v = json_object_get(n, only);
    if (strcmp(only, "not") == 0 && json_is_object(v))
        return json_incref((json_t *)v); /* not not S: S */
    static const char *const flip[4][2] = {{"minimum", "exclusiveMaximum"},
                                           {"maximum", "exclusiveMinimum"},
                                           {"exclusiveMinimum", "maximum"},
                                           {"exclusiveMaximum", "minimum"}};
    for (int i = 0; i < 4; i++)
        if (strcmp(only, flip[i][0]) == 0 && is_num(v))
            return json_pack("{s:s,s:O}", "type", "number", flip[i][1], v);
    if (strcmp(only, "properties") == 0 && json_is_object(v) && json_object_size(v) == 1) {
        void *it = json_object_iter((json_t *)v);
        const char *p = json_object_iter_key(it);
        json_t *sub = json_object_iter_value(it);
        return json_pack("{s:s,s:[s],s:{s:{s:O}}}", "type", "object", "required", p,
                         "properties", p, "not", sub);
    }
    return NULL;
}

static int compile_inner(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    int rc;
    if (json_is_true(s)) {
        if ((*out = make_any(g, any_levels(depth))) < 0)
            return oom(b);
        return SW_OK;
    }
    if (json_is_false(s)) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (!json_is_object(s))
        return fail_at(b, plen, SW_EINVAL, "a schema must be an object");
    const json_t *ref = json_object_get(s, "$ref");
    bool draft_ref = ref && b->doc->dialect != SC_2020;
    if (!draft_ref) {
        const char *key = refused_keyword(b->doc, s);
        if (key) {
            char what[160];
            snprintf(what, sizeof what, "unsupported JSON-schema keyword '%.64s'%s", key,
                     strcmp(key, "items") == 0 ? " (tuple 'items', an array of schemas)" : "");
            return fail_at(b, path_push(b, plen, key), SW_EUNSUPPORTED, what);
        }
    }
    if (ref && !json_object_get(s, "allOf") && (draft_ref || only_annotations(s, "$ref"))) {
        /* a plain reference: compile the target itself (so a recursive
         * schema reuses its nodes level by level) */
        const json_t *target;
        if (!json_is_string(ref))
            return fail_at(b, path_push(b, plen, "$ref"), SW_EINVAL, "'$ref' must be a string");
        sw_error e;
        if ((rc = doc_resolve(b->doc, b->base, json_string_value(ref), &target, &e)))
            return fail_at(b, path_push(b, plen, "$ref"), rc, e.message);
        if (b->chain[depth] >= SC_MAX_REF_CHAIN)
            return fail_at(b, path_push(b, plen, "$ref"), SW_EUNSUPPORTED,
                           "a $ref cycle that never reaches a value");
        b->chain[depth]++;
        rc = compile(b, target, depth, path_push(b, plen, "$ref"), out);
        b->chain[depth]--;
        return rc;
    }
    if (ref || json_object_get(s, "allOf")) {
        const json_t *m;
        sw_error e;
        if ((rc = effective(b->doc, s, b->base, &m, &e)))
            return fail_at(b, plen, rc, e.message);
        if (b->chain[depth] >= SC_MAX_REF_CHAIN)
            return fail_at(b, plen, SW_EUNSUPPORTED, "a $ref cycle that never reaches a value");
        b->chain[depth]++;
        rc = compile(b, m, depth, plen, out);
        b->chain[depth]--;
        return rc;
    }
    if (json_object_get(s, "dependentSchemas") ||
        (json_is_object(json_object_get(s, "dependencies")) && b->doc->dialect != SC_2020))
        return compile_dependent(b, s, depth, plen, out);
    if (json_object_get(s, "if") && (json_object_get(s, "then") || json_object_get(s, "else")))
        return compile_if(b, s, depth, plen, out);
    if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf"))
        return compile_anyof(b, s, depth, plen, out);

    const json_t *type = json_object_get(s, "type");
    int tm = type_mask(type);
    if (tm < 0)
        return fail_at(b, path_push(b, plen, "type"), SW_EINVAL,
                       "unknown type (expected object, array, string, number, integer, "
                       "boolean or null, or a list of them)");
    for (size_t i = 0; json_is_array(type) && i < json_array_size(type); i++)
        for (size_t j = 0; j < i; j++)
            if (json_equal(json_array_get(type, i), json_array_get(type, j)))
                return fail_at(b, path_push_index(b, path_push(b, plen, "type"), i), SW_EINVAL,
                               "'type' lists a type twice");
    if (json_is_array(type) && json_array_size(type) == 0)
        return fail_at(b, path_push(b, plen, "type"), SW_EINVAL, "'type' is an empty array");
    const json_t *not = json_object_get(s, "not");
    json_t *positive = not ? negate_simple(not) : NULL;
    if (positive) {
        /* not of one bound or one property: an equivalent positive schema */
        json_t *rest = json_copy((json_t *)s);
        json_t *w = rest ? json_pack("{s:[OO]}", "allOf", rest, positive) : NULL;
        json_decref(positive);
        json_decref(rest);
        if (!w || !doc_keep(b->doc, w))
            return oom(b);
        json_object_del(json_array_get(json_object_get(w, "allOf"), 0), "not");
        return compile(b, w, depth, plen, out);
    }
    not_info ni = {0, T_ALL, NULL, false};
    if (not && (rc = analyze_not(b, not, path_push(b, plen, "not"), &ni, 0)))
        return rc;
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return compile_literals(b, s, plen, out);
    if (!type)
        tm = inferred_types(s);
    bool untyped = !type && tm == T_ALL && !has_enforced_format(s);
    tm &= ~ni.types_out;
    tm &= ni.types_only;
    /* not integer: the numbers left are fractions, which the number node
     * cannot tell apart; no number is generated (a narrowing) */
    if (ni.types_out & T_INTEGER)
        tm &= ~(T_NUMBER | T_INTEGER);
    if (ni.filter) {
        /* a finite set of values: true, false, null */
        if (tm & ~(T_BOOLEAN | T_NULL))
            return fail_at(b, path_push(b, plen, "not"), SW_EUNSUPPORTED,
                           "'not' with const or enum is enforced only for booleans and null "
                           "(or beside an enum)");
        json_t *e = json_array();
        if (!e || !doc_keep(b->doc, e))
            return oom(b);
        if (tm & T_BOOLEAN) {
            json_array_append(e, json_true());
            json_array_append(e, json_false());
        }
        if (tm & T_NULL)
            json_array_append(e, json_null());
        if (json_array_size(e) == 0) {
            *out = CS_NEVER;
            return SW_OK;
        }
        json_t *with = json_copy((json_t *)s);
        if (!with || !doc_keep(b->doc, with))
            return oom(b);
        json_object_set(with, "enum", e);
        return compile_literals(b, with, plen, out);
    }
    if (untyped && ni.types_out == 0 && ni.types_only == T_ALL) {
        if ((*out = make_any(g, any_levels(depth))) < 0)
            return oom(b);
        return SW_OK;
    }
    int32_t alts[8], n = 0;
    static const int order[] = {T_OBJECT, T_ARRAY, T_STRING, T_NUMBER, T_INTEGER, T_BOOLEAN,
                                T_NULL};
    for (size_t i = 0; i < 7; i++) {
        int t = order[i];
        if (!(tm & t) || (t == T_INTEGER && (tm & T_NUMBER)))
            continue;
        int32_t a;
        if ((rc = compile_typed(b, s, t, ni.forbid, depth, plen, &a)))
            return rc;
        if (a != CS_NEVER)
            alts[n++] = a;
    }
    if (n == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (n == 1) {
        *out = alts[0];
        return SW_OK;
    }
    if ((*out = make_anyof(g, alts, n)) < 0)
        return oom(b);
    return SW_OK;
}

static int compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    if (++b->steps > SC_MAX_COMPILE_STEPS || b->g->n_nodes > SC_MAX_NODES)
        return fail_at(b, plen, SW_EUNSUPPORTED,
                       "the schema is too large to compile (too many nodes or steps)");
    /* A value in the last frame of the stack cannot hold anything: deeper
     * values are never generated (recursive schemas stop here). */
    if (depth + 1 > ENG_CS_MAX_DEPTH) {
        *out = CS_NEVER;
        return SW_OK;
    }
    const char *saved = b->base;
    const char *mine = json_is_object(s) ? doc_base_of(b->doc, s) : NULL;
    char key[48];
    if (mine)
        b->base = mine;
    snprintf(key, sizeof key, "%p/%d", (const void *)s, (int)depth);
    const json_t *memo = json_is_object(s) ? json_object_get(b->memo, key) : NULL;
    int rc = SW_OK;
    if (memo) {
        *out = (int32_t)json_integer_value(memo);
    } else {
        rc = compile_inner(b, s, depth, plen, out);
        if (rc == SW_OK && json_is_object(s) &&
            json_object_set_new(b->memo, key, json_integer(*out)))
            rc = oom(b);
    }
    b->base = saved;
    return rc;
}

int eng_grammar_from_schema(const json_t *schema, eng_grammar **out, sw_error *err)
{
    builder b;
    sc_doc doc;
    memset(&b, 0, sizeof b);
    b.err = err;
    strcpy(b.path, "#");
    if (!schema || !out)
        return sw_error_set(err, SW_EINVAL, "eng_grammar_from_schema: NULL argument");
    int rc = doc_init(&doc, schema, err);
    if (rc)
        return rc;
    b.doc = &doc;
    b.base = SC_DEFAULT_BASE;
    b.memo = json_object();
    if (!b.memo || !(b.g = grammar_new())) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the schema");
        goto fail;
    }
    rc = compile(&b, schema, 1, 1, &b.g->root);
    if (rc == SW_OK && b.g->root == CS_NEVER)
        rc = sw_error_set(err, SW_EUNSUPPORTED,
                          "the schema accepts no value that can be generated (it is 'false', "
                          "contradicts itself, or requires values that nest too deeply: at "
                          "most %d levels)",
                          ENG_CS_MAX_DEPTH - 2);
    if (rc)
        goto fail;
    json_decref(b.memo);
    doc_free(&doc);
    *out = b.g;
    return SW_OK;
fail:
    json_decref(b.memo);
    doc_free(&doc);
    eng_grammar_free(b.g);
    return rc;
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

/* A tool's parameters (NULL: none, an empty argument list) as an object
 * node in frame 2, with the document of those parameters. */
static int compile_params(builder *b, const json_t *params, size_t plen, int32_t *out)
{
    json_t *empty = NULL;
    sc_doc doc;
    int rc;
    if (!params) {
        empty = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                          "additionalProperties", 0);
        if (!empty)
            return oom(b);
        params = empty;
    }
    if ((rc = doc_init(&doc, params, b->err))) {
        json_decref(empty);
        return rc;
    }
    b->doc = &doc;
    b->base = SC_DEFAULT_BASE;
    b->memo = json_object();
    rc = b->memo ? compile(b, params, 2, plen, out) : oom(b);
    if (rc == SW_OK && (*out == CS_NEVER || (b->g->nodes[*out].kind != CS_OBJECT &&
                                             b->g->nodes[*out].kind != CS_ANYOBJ)))
        rc = fail_at(b, plen, SW_EUNSUPPORTED, "a tool's parameters must be an object schema");
    json_decref(b->memo);
    b->memo = NULL;
    b->doc = NULL;
    doc_free(&doc);
    json_decref(empty);
    return rc;
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
        if ((rc = compile_params(&b, tools[t].parameters, plen, &args)))
            goto fail;
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
 * A parsed value checked against a schema with JSON Schema's own meaning
 * (the router checks a model's tool-call arguments before it calls the
 * tool: they may come from an engine that did not generate them under this
 * grammar; the compiler filters enum values through it). Exact wherever it
 * judges: any property order, additional properties, a keyword constrains
 * only values of its type, numbers of any size, oneOf as exactly one. What
 * it cannot judge (formats without a pattern, unevaluated*, $dynamicRef, a
 * remote $ref) is SW_EUNSUPPORTED. */

typedef struct validator {
    const sc_doc *doc;
    sw_error *err;
    const char *base;
    int32_t depth;
    int64_t steps;          /* checks made: alternatives inside alternatives multiply them */
    char path[256];         /* JSON pointer into the value */
} validator;

#define VAL_MAX_STEPS 200000
#define VAL_MAX_DEPTH 64

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

/* A count keyword of the schema. */
static int val_count(validator *v, const json_t *s, const char *key, size_t plen, int64_t dflt,
                     int64_t *out)
{
    const json_t *c = json_object_get(s, key);
    if (!c) {
        *out = dflt;
        return SW_OK;
    }
    if (json_is_real(c) && json_real_value(c) >= 0 &&
        json_real_value(c) == floor(json_real_value(c))) {
        *out = json_real_value(c) > 9e18 ? INT64_MAX : (int64_t)json_real_value(c);
        return SW_OK;
    }
    if (!json_is_integer(c) || json_integer_value(c) < 0)
        return val_fail(v, plen, SW_EUNSUPPORTED, "a count keyword is not a non-negative integer");
    *out = json_integer_value(c);
    return SW_OK;
}

static bool type_matches(const json_t *x, int bit)
{
    switch (bit) {
    case T_OBJECT: return json_is_object(x);
    case T_ARRAY: return json_is_array(x);
    case T_STRING: return json_is_string(x) && !sw_json_big_text(x);
    case T_NUMBER: return is_num(x);
    case T_INTEGER:
        /* a marker with a fraction or an exponent is taken as no integer
         * (an enum keeps fewer values: a narrowing) */
        if (json_is_integer(x) || big_ok(x))
            return true;
        if (json_is_real(x)) {
            /* a whole number (1.0, 1e300) */
            double d = json_real_value(x);
            return isfinite(d) && d == floor(d);
        }
        return false;
    case T_BOOLEAN: return json_is_boolean(x);
    default: return json_is_null(x);
    }
}

static int val_check(validator *v, const json_t *s, const json_t *x, size_t plen);

/* Runs a check whose failure is an answer, not an error: *ok tells. */
static int val_try(validator *v, const json_t *s, const json_t *x, size_t plen, bool *ok)
{
    sw_error *outer = v->err;
    sw_error mine;
    v->err = &mine;
    int rc = val_check(v, s, x, plen);
    v->err = outer;
    if (rc == SW_OK || rc == SW_EINVAL) {
        *ok = rc == SW_OK;
        return SW_OK;
    }
    return sw_error_set(outer, rc, "%s", mine.message);
}

static int64_t utf8_count(const char *t, size_t n)
{
    int64_t chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += ((unsigned char)t[i] & 0xC0) != 0x80; /* code points */
    return chars;
}

static int val_object(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    const json_t *names = json_object_get(s, "propertyNames");
    int rc;
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
    int64_t lo, hi;
    if ((rc = val_count(v, s, "minProperties", plen, 0, &lo)) ||
        (rc = val_count(v, s, "maxProperties", plen, INT64_MAX, &hi)))
        return rc;
    if ((int64_t)json_object_size(x) < lo || (int64_t)json_object_size(x) > hi)
        return val_fail(v, plen, SW_EINVAL, "the object has too few or too many properties");
    /* dependentRequired, dependentSchemas and draft 7's dependencies */
    static const char *const dep_keys[] = {"dependentRequired", "dependentSchemas",
                                           "dependencies"};
    for (size_t d = 0; d < 3; d++) {
        const json_t *deps = json_object_get(s, dep_keys[d]);
        const char *k;
        const json_t *dv;
        json_object_foreach((json_t *)deps, k, dv) {
            if (!json_object_get(x, k))
                continue;
            if (json_is_array(dv)) {
                for (size_t i = 0; i < json_array_size(dv); i++) {
                    const char *name = json_string_value(json_array_get(dv, i));
                    if (name && !json_object_get(x, name))
                        return val_fail(v, plen, SW_EINVAL,
                                        "a property that another one depends on is missing");
                }
            } else if ((rc = val_check(v, dv, x, plen))) {
                return rc;
            }
        }
    }
    const json_t *pprops = json_object_get(s, "patternProperties");
    if (pprops && !json_is_object(pprops))
        return val_fail(v, plen, SW_EUNSUPPORTED, "'patternProperties' must be an object");
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)x, key, val) {
        const json_t *sub = json_object_get(props, key);
        size_t l = val_push(v, plen, key);
        bool matched = false;
        const char *pat;
        const json_t *ps;
        json_object_foreach((json_t *)pprops, pat, ps) {
            sw_error perr;
            int m = pattern_match_name(pat, key, &perr);
            if (m < 0)
                return val_fail(v, plen, SW_EUNSUPPORTED, perr.message);
            if (m) {
                matched = true;
                if ((rc = val_check(v, ps, val, l)))
                    return rc;
            }
        }
        if (names) {
            json_t *ks = json_string(key);
            if (!ks)
                return sw_error_set(v->err, SW_ENOMEM, "out of memory validating");
            rc = val_check(v, names, ks, l);
            json_decref(ks);
            if (rc)
                return rc;
        }
        if (sub) {
            if ((rc = val_check(v, sub, val, l)))
                return rc;
        } else if (!matched && addl && (rc = val_check(v, addl, val, l))) {
            return rc;
        }
    }
    return SW_OK;
}

static int val_array(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    int64_t lo, hi;
    int rc;
    const json_t *items = json_object_get(s, "items");
    const json_t *prefix = json_object_get(s, "prefixItems");
    const json_t *rest = items;
    if (json_is_array(items) && (v->doc->dialect != SC_2020 || !prefix)) {
        prefix = items;
        rest = json_object_get(s, "additionalItems");
    } else if (json_is_array(items)) {
        return val_fail(v, plen, SW_EUNSUPPORTED, "'items' must be a schema");
    }
    if ((rc = val_count(v, s, "minItems", plen, 0, &lo)) ||
        (rc = val_count(v, s, "maxItems", plen, INT64_MAX, &hi)))
        return rc;
    size_t n = json_array_size(x);
    if ((int64_t)n < lo || (int64_t)n > hi)
        return val_fail(v, plen, SW_EINVAL, "the array has too few or too many items");
    size_t np = json_array_size(prefix);
    for (size_t i = 0; i < n; i++) {
        const json_t *sub = i < np ? json_array_get(prefix, i) : rest;
        if (sub && (rc = val_check(v, sub, json_array_get(x, i), val_push_index(v, plen, i))))
            return rc;
    }
    const json_t *contains = json_object_get(s, "contains");
    if (contains) {
        int64_t cmin, cmax, found = 0;
        if ((rc = val_count(v, s, "minContains", plen, 1, &cmin)) ||
            (rc = val_count(v, s, "maxContains", plen, INT64_MAX, &cmax)))
            return rc;
        if (v->doc->dialect != SC_2020) {
            cmin = 1;
            cmax = INT64_MAX;
        }
        for (size_t i = 0; i < n; i++) {
            bool ok = false;
            if ((rc = val_try(v, contains, json_array_get(x, i), val_push_index(v, plen, i), &ok)))
                return rc;
            found += ok;
        }
        if (found < cmin || found > cmax)
            return val_fail(v, plen, SW_EINVAL, "too few or too many items match 'contains'");
    }
    if (json_is_true(json_object_get(s, "uniqueItems"))) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (val_equal(json_array_get(x, i), json_array_get(x, j)))
                    return val_fail(v, plen, SW_EINVAL, "the array's items are not unique");
    }
    return SW_OK;
}

/* x mod m for a marker integer, exactly (0 < m < 2^59). */
static int64_t big_mod(const char *t, int64_t m)
{
    int64_t r = 0;
    for (const char *p = t + (t[0] == '-'); *p; p++)
        r = (r * 10 + (*p - '0')) % m;
    return r;
}

static int val_number(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    double d = num_double(x);
    for (int lower = 0; lower < 2; lower++) {
        num_bound nb = bound_get(s, lower);
        if (!nb.v)
            continue;
        int c = num_cmp(x, nb.v);
        if (lower ? (c < 0 || (c == 0 && nb.excl)) : (c > 0 || (c == 0 && nb.excl)))
            return val_fail(v, plen, SW_EINVAL,
                            lower ? "the number is below the minimum"
                                  : "the number is above the maximum");
    }
    const json_t *mo = json_object_get(s, "multipleOf");
    if (mo) {
        if (sw_json_big_text(mo))
            return val_fail(v, plen, SW_EUNSUPPORTED,
                            "'multipleOf' past 64 bits is not supported");
        if (!json_is_number(mo) || json_number_value(mo) <= 0)
            return val_fail(v, plen, SW_EUNSUPPORTED, "'multipleOf' must be a positive number");
        bool ok = false;
        if (json_is_integer(mo) && json_is_integer(x)) {
            ok = json_integer_value(x) % json_integer_value(mo) == 0;
        } else if (json_is_integer(mo) && big_ok(x) && json_integer_value(mo) < (1LL << 59)) {
            ok = big_mod(sw_json_big_text(x), json_integer_value(mo)) == 0;
        } else if (sw_json_big_text(x)) {
            return val_fail(v, plen, SW_EUNSUPPORTED,
                            "'multipleOf' of a number past 64 bits: only whole multiples below "
                            "2^59 are checked");
        } else {
            /* in doubles 44.5988 / 0.0001 is 445987.99999999994: a
             * quotient this close to a whole number is taken as one */
            double q = d / json_number_value(mo);
            if (!isfinite(q))
                return val_fail(v, plen, SW_EUNSUPPORTED, "'multipleOf' overflows");
            ok = fabs(q - nearbyint(q)) <= 1e-9 * fmax(1.0, fabs(q));
        }
        if (!ok)
            return val_fail(v, plen, SW_EINVAL, "the number is not a multiple of 'multipleOf'");
    }
    return SW_OK;
}

static int val_check_inner(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    int rc;
    if (json_is_true(s))
        return SW_OK;
    if (json_is_false(s))
        return val_fail(v, plen, SW_EINVAL, "the schema allows no value here");
    if (!json_is_object(s))
        return val_fail(v, plen, SW_EUNSUPPORTED, "a schema must be an object");
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const json_t *target;
        sw_error e;
        if (!json_is_string(ref) ||
            (rc = doc_resolve(v->doc, v->base, json_string_value(ref), &target, &e)))
            return val_fail(v, plen, SW_EUNSUPPORTED, json_is_string(ref) ? e.message : "$ref");
        if ((rc = val_check(v, target, x, plen)))
            return rc;
        if (v->doc->dialect != SC_2020)
            return SW_OK; /* draft 7: the other keywords are ignored */
    }
    static const char *const refused[] = {"unevaluatedItems", "unevaluatedProperties",
                                          "$dynamicRef", "$recursiveRef"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (json_object_get(s, refused[i])) {
            char what[96];
            snprintf(what, sizeof what, "'%s' is not supported", refused[i]);
            return val_fail(v, plen, SW_EUNSUPPORTED, what);
        }
    const json_t *fmt = json_object_get(s, "format");
    if (json_is_string(fmt) && IN_LIST(json_string_value(fmt), known_formats) &&
        !eng_format_pattern(json_string_value(fmt), NULL) &&
        json_is_string(x))
        return val_fail(v, plen, SW_EUNSUPPORTED, "'format' is not supported");
    const json_t *type = json_object_get(s, "type");
    if (type) {
        int tm = type_mask(type);
        if (tm < 0)
            return val_fail(v, plen, SW_EUNSUPPORTED, "an unknown 'type'");
        bool match = false;
        for (int bit = 1; bit < 128; bit <<= 1)
            if ((tm & bit) && type_matches(x, bit))
                match = true;
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
    const json_t *all = json_object_get(s, "allOf");
    for (size_t i = 0; i < json_array_size(all); i++)
        if ((rc = val_check(v, json_array_get(all, i), x, plen)))
            return rc;
    static const char *const alt_keys[] = {"anyOf", "oneOf"};
    for (int k = 0; k < 2; k++) {
        const json_t *any = json_object_get(s, alt_keys[k]);
        if (!any)
            continue;
        size_t n = json_array_size(any), matched = 0;
        if (!json_is_array(any) || n == 0)
            return val_fail(v, plen, SW_EUNSUPPORTED, "anyOf/oneOf must be a non-empty array");
        for (size_t i = 0; i < n && (k == 1 || matched == 0); i++) {
            bool ok = false;
            if ((rc = val_try(v, json_array_get(any, i), x, plen, &ok)))
                return rc;
            matched += ok;
        }
        if (matched == 0)
            return val_fail(v, plen, SW_EINVAL,
                            "the value matches none of the anyOf/oneOf alternatives");
        if (k == 1 && matched > 1)
            return val_fail(v, plen, SW_EINVAL,
                            "the value matches more than one oneOf alternative");
    }
    const json_t *not = json_object_get(s, "not");
    if (not) {
        bool ok = false;
        if ((rc = val_try(v, not, x, plen, &ok)))
            return rc;
        if (ok)
            return val_fail(v, plen, SW_EINVAL, "the value matches the schema of 'not'");
    }
    const json_t *cond = json_object_get(s, "if");
    if (cond) {
        bool ok = false;
        if ((rc = val_try(v, cond, x, plen, &ok)))
            return rc;
        const json_t *branch = json_object_get(s, ok ? "then" : "else");
        if (branch && (rc = val_check(v, branch, x, plen)))
            return rc;
    }
    if (json_is_object(x))
        return val_object(v, s, x, plen);
    if (json_is_array(x))
        return val_array(v, s, x, plen);
    if (is_num(x))
        return val_number(v, s, x, plen);
    if (json_is_string(x)) {
        int64_t lo, hi;
        if ((rc = val_count(v, s, "minLength", plen, 0, &lo)) ||
            (rc = val_count(v, s, "maxLength", plen, INT64_MAX, &hi)))
            return rc;
        int64_t chars = utf8_count(json_string_value(x), json_string_length(x));
        if (chars < lo)
            return val_fail(v, plen, SW_EINVAL, "the string is shorter than minLength");
        if (chars > hi)
            return val_fail(v, plen, SW_EINVAL, "the string is longer than maxLength");
        eng_regex *re = NULL;
        int32_t fmt_max;
        const char *key;
        sw_error perr;
        if ((rc = string_automaton(s, &re, &fmt_max, &key, &perr)))
            return val_fail(v, plen, SW_EUNSUPPORTED, perr.message);
        bool ok = !re || (chars <= fmt_max &&
                          eng_regex_match(re, json_string_value(x), json_string_length(x)));
        eng_regex_free(re);
        if (!ok)
            return val_fail(v, plen, SW_EINVAL,
                            strcmp(key, "format") == 0 ? "the string does not match its 'format'"
                                                       : "the string does not match 'pattern'");
    }
    return SW_OK;
}

static int val_check(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    if (++v->steps > VAL_MAX_STEPS)
        return val_fail(v, plen, SW_EUNSUPPORTED, "too many alternatives to try");
    if (v->depth >= VAL_MAX_DEPTH)
        return val_fail(v, plen, SW_EUNSUPPORTED, "the schema nests too deeply");
    const char *saved = v->base;
    const char *mine = json_is_object(s) ? doc_base_of(v->doc, s) : NULL;
    if (mine)
        v->base = mine;
    v->depth++;
    int rc = val_check_inner(v, s, x, plen);
    v->depth--;
    v->base = saved;
    return rc;
}

/* The compiler's use: schema belongs to d (or its arena). */
static int val_judge(const sc_doc *d, const json_t *schema, const json_t *value, sw_error *err)
{
    validator v;
    memset(&v, 0, sizeof v);
    v.doc = d;
    v.err = err;
    v.base = SC_DEFAULT_BASE;
    strcpy(v.path, "#");
    return val_check(&v, schema, value, 1);
}

int eng_json_validate(const json_t *schema, const json_t *value, sw_error *err)
{
    if (!schema || !value)
        return sw_error_set(err, SW_EUNSUPPORTED, "eng_json_validate: NULL argument");
    sc_doc d;
    sw_error e;
    int rc = doc_init(&d, schema, &e);
    if (rc)
        return sw_error_set(err, rc == SW_ENOMEM ? SW_ENOMEM : SW_EUNSUPPORTED,
                            "the schema cannot be checked: %s", e.message);
    rc = val_judge(&d, schema, value, err);
    doc_free(&d);
    return rc;
}
