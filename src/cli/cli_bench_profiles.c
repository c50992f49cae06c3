/* cli_bench_profiles.c - `spillway bench profiles` (being written). */
#include "cli/cli.h"

#include <stdio.h>

int cli_bench_profiles_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "spillway bench profiles: not built yet\n");
    return 2;
}
