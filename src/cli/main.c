/* main.c - entry point of the `spillway` binary: dispatches subcommands. */
#include "cli/cli.h"

#include "common/alloc.h"
#include "common/version.h"
#include "ledger/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "spillway %s - a local LLM inference service that keeps answering\n"
            "\n"
            "usage: spillway <command> [options]\n"
            "\n"
            "commands:\n"
            "  run      generate text from a prompt on the command line\n"
            "  model    make | info | plan  (make a test model, inspect a GGUF file, plan its memory)\n"
            "  bench    engine | memory | http | profiles  (speed, latency, placement profiles)\n"
            "  hog      hold device memory until stopped (fill a GPU on purpose)\n"
            "  worker   serve one model over HTTP (OpenAI API)\n"
            "  serve    the router: workers, admission, failover (--config FILE)\n"
            "  drill    the failover proof: scenarios, verdicts, report (--out DIR)\n"
            "  status   a running router's workers, memory, queue and failovers (--router URL)\n"
            "  version  print the version\n"
            "\n"
            "`spillway <command> --help` describes each command.\n",
            SPILLWAY_VERSION);
}

int main(int argc, char **argv)
{
    /* Every allocation through one hook (common/alloc.h), jansson's and
     * SQLite's too, so injected failures reach them: installed before
     * either library is used. The X-Spillway-Fault switch is read now,
     * before the router may take SPILLWAY_FAULT out of its environment. */
    sw_alloc_hook_jansson();
    if (ldg_alloc_hook() != 0)
        fprintf(stderr, "spillway: SQLite keeps its own allocator (it was already initialized)\n");
    if (sw_alloc_fault_header_enabled())
        fprintf(stderr, "spillway: SPILLWAY_FAULT fault_header:1: the X-Spillway-Fault request "
                        "header is honoured (tests only)\n");
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cli_run_main(argc - 1, argv + 1);
    if (strcmp(cmd, "model") == 0)
        return cli_model_main(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0 && argc > 2 && strcmp(argv[2], "profiles") == 0)
        return cli_bench_profiles_main(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0)
        return cli_bench_main(argc - 1, argv + 1);
    if (strcmp(cmd, "hog") == 0)
        return cli_hog_main(argc - 1, argv + 1);
    if (strcmp(cmd, "worker") == 0)
        return cli_worker_main(argc - 1, argv + 1);
    if (strcmp(cmd, "serve") == 0)
        return cli_serve_main(argc - 1, argv + 1);
    if (strcmp(cmd, "drill") == 0)
        return cli_drill_main(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0)
        return cli_status_main(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("spillway %s\n", SPILLWAY_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "spillway: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
