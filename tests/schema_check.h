/* schema_check.h - the independent check of generated JSON: outputs and
 * their schemas handed to python3-jsonschema (tests/jsonschema_check.py),
 * and the schema fixtures of tests/data/schemas (what zod 4 and pydantic 2
 * emit). Used by test_json_schema_suite and test_json_schema_generate.
 */
#ifndef SPILLWAY_TESTS_SCHEMA_CHECK_H
#define SPILLWAY_TESTS_SCHEMA_CHECK_H

#include <jansson.h>

/* A record for sc_check: {"file", "group", "schema", "outputs": []}; the
 * schema is copied by reference (json_incref). Append strings to the
 * "outputs" array (sc_outputs). */
json_t *sc_record(const char *file, const char *group, json_t *schema);
json_t *sc_outputs(json_t *record);

/* Runs the checker over records (a JSON array of sc_record) and prints its
 * report, once with each python3 whose jsonschema is a distinct
 * installation: Debian's /usr/bin/python3 (python3-jsonschema) first, then
 * python3 on PATH. Returns 0 when every output validates with each, 1 when
 * one does not (listed in the report), -1 when no python3 with jsonschema
 * is installed (skipped, said so). */
int sc_check(const json_t *records, const char *tag);

/* The fixture schemas of tests/data/schemas (*.json, sorted by name): a
 * JSON array of {"file": NAME, "schema": S}; NULL (after saying why) when
 * the directory is absent. */
json_t *sc_fixtures_load(void);

/* The keyword files of the JSON Schema Test Suite's draft ("draft2020-12",
 * "draft7") in ../shared/jsonschema-test-suite, sorted by name: a JSON
 * array of {"name": "allOf.json", "groups": [...]}, the file's groups as
 * parsed with NUL escapes allowed. NULL (after saying why) when the suite
 * is absent; a file that does not parse fails the test. */
json_t *sc_suite_load(const char *draft);

#endif
