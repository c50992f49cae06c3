/* cli_model.c - `spillway model <make|info|plan>`: dispatch to one file each. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

int cli_model_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: spillway model make -o FILE [shape options]  (a test model)\n"
                "       spillway model info FILE                      (metadata and tensors)\n"
                "       spillway model plan -m FILE --device D [...]  (memory budget)\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "make") == 0)
        return cli_model_make(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0)
        return cli_model_info(argc - 1, argv + 1);
    if (strcmp(argv[1], "plan") == 0)
        return cli_model_plan(argc - 1, argv + 1);
    fprintf(stderr, "spillway model: unknown subcommand '%s'\n", argv[1]);
    return 2;
}
