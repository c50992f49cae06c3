/* cli_run.c - placeholder until this subcommand is written. */
#include "cli/cli.h"

#include <stdio.h>

int cli_run_main(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "spillway: '%s' is not implemented yet\n", argv[0]);
    return 2;
}
