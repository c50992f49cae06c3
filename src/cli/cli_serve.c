/* cli_serve.c - `spillway serve`: reads the router's configuration file,
 * applies the command-line overrides and runs the router (src/router). */
#include "cli/cli.h"

#include "router/router.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway serve --config FILE [options]\n"
            "  -c, --config FILE    INI configuration (docs/router.md)\n"
            "      --listen ADDR    HOST:PORT or unix:PATH (overrides [server] listen)\n"
            "      --state-dir DIR  overrides [server] state-dir\n"
            "      --ledger URL     overrides [server] ledger (postgresql://USER@HOST:PORT/DB,\n"
            "                       a ledger shared with other routers; the password from\n"
            "                       PGPASSWORD or ~/.pgpass)\n"
            "  -m, --model FILE     overrides [model] path\n"
            "Exit status: 0 after SIGTERM/SIGINT, 1 when a worker, the ledger or the socket\n"
            "cannot be set up, 2 for a bad configuration or options (an unset api-key-env\n"
            "variable included) or a state-dir another router is using.\n"
            "Environment: SPILLWAY_SABOTAGE=no-replay,no-resume,no-tool-ledger,no-restart,\n"
            "no-deadline turns safety features off for the drill's self-check (never in\n"
            "production); SPILLWAY_FAULT=router_exit_after_tool_started|_called makes the\n"
            "router exit for crash tests (docs/router.md).\n");
}

int cli_serve_main(int argc, char **argv)
{
    enum { OPT_LISTEN = 256, OPT_STATE, OPT_LEDGER };
    static const struct option longopts[] = {
        {"config", required_argument, 0, 'c'},
        {"model", required_argument, 0, 'm'},
        {"listen", required_argument, 0, OPT_LISTEN},
        {"state-dir", required_argument, 0, OPT_STATE},
        {"ledger", required_argument, 0, OPT_LEDGER},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *config = NULL, *listen = NULL, *state = NULL, *model = NULL, *ledger = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:m:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'm': model = optarg; break;
        case OPT_LISTEN: listen = optarg; break;
        case OPT_STATE: state = optarg; break;
        case OPT_LEDGER: ledger = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "spillway serve: --config is required\n");
        usage(stderr);
        return 2;
    }
    static rt_config cfg;
    sw_error err;
    sw_error_clear(&err);
    if (rt_config_read(&cfg, config, listen, state, model, ledger, &err)) {
        fprintf(stderr, "spillway serve: %s\n", err.message);
        return 2;
    }
    return rt_serve(&cfg);
}
