/* cli.h - the subcommands of the `spillway` binary, one file each.
 * Each takes the arguments after its own name (argv[0] is the subcommand)
 * and returns the process exit status. */
#ifndef SPILLWAY_CLI_H
#define SPILLWAY_CLI_H

#include <stdbool.h>
#include <stdint.h>

int cli_model_main(int argc, char **argv);      /* spillway model ... */
int cli_model_make(int argc, char **argv);      /* spillway model make */
int cli_model_info(int argc, char **argv);      /* spillway model info */
int cli_model_plan(int argc, char **argv);      /* spillway model plan */
/* `spillway model plan` on a file the engine refused (engine_refusal, its
 * message): a llama-server worker's figures from the metadata alone
 * (cli_model_plan_books.c). 0, or 1 with the reason on stderr. */
struct eng_plan_params;
int cli_model_plan_books(const char *path, const struct eng_plan_params *pp, bool json,
                         const char *engine_refusal);
/* The KV bytes llama-server -c ctx*seqs -np seqs allocates for the file
 * (a unified cache, f16 unless pp says otherwise); 0 when not counted. */
uint64_t cli_model_plan_server_kv(const char *path, const struct eng_plan_params *pp);
int cli_run_main(int argc, char **argv);        /* spillway run */
int cli_bench_main(int argc, char **argv);      /* spillway bench */
int cli_hog_main(int argc, char **argv);        /* spillway hog */
int cli_worker_main(int argc, char **argv);     /* spillway worker */
int cli_serve_main(int argc, char **argv);      /* spillway serve */
int cli_drill_main(int argc, char **argv);      /* spillway drill */
int cli_status_main(int argc, char **argv);     /* spillway status */
int cli_bench_profiles_main(int argc, char **argv); /* spillway bench profiles */

/* Parses sizes like "512", "64KiB", "512MiB", "2GiB" (also KB/MB/GB as
 * powers of 1000). Returns 0 on success. */
int cli_parse_bytes(const char *text, unsigned long long *out);

/* --kv-type's value: f16, q8_0, q4_0 or f32 into *out (an ENG_TYPE_*).
 * Returns 0, or 2 (the exit status for bad options) after printing
 * "spillway COMMAND: --kv-type is ..." to stderr. */
int cli_parse_kv_type(const char *command, const char *text, uint32_t *out);

#endif
