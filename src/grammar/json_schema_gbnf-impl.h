/* json_schema_gbnf-impl.h - what the files writing a compiled schema as
 * GBNF share (json_schema_gbnf.c: the nodes and the whole grammar;
 * json_schema_gbnf_number.c: numbers with bounds;
 * json_schema_gbnf_pattern.c: pattern strings). Private to src/grammar.
 */
#ifndef SPILLWAY_GRAMMAR_JSON_SCHEMA_GBNF_IMPL_H
#define SPILLWAY_GRAMMAR_JSON_SCHEMA_GBNF_IMPL_H

#include "common/error.h"
#include "grammar/constrain-impl.h"
#include "grammar/gbnf-print.h"

#include <stdint.h>

typedef struct jg_writer {
    const eng_grammar *g;
    eng__gb_out o;
    uint8_t *reached; /* n_nodes */
    int rc;
    sw_error *err;
} jg_writer;

/* Records the first error: what has no GBNF form, at which node. */
int eng__jg_fail(jg_writer *w, int code, const char *what, int32_t node);
/* "n<node> ::= ", or "n<node>-<suffix>-<j> ::= " with a suffix. */
void eng__jg_rule_head(jg_writer *w, int32_t node, const char *suffix, int32_t j);
/* The rule of a number node (CS_NUMBER, CS_INTEGER). */
void eng__jg_write_number(jg_writer *w, int32_t node, const cs_node *n);
/* The rules of a pattern string node (CS_PATTERN). */
void eng__jg_write_pattern(jg_writer *w, int32_t node, const cs_node *n);

#endif
