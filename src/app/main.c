/* tern: the command. `tern serve` runs the demo server, `tern load` a
 * WebSocket load generator, `tern connect` a WebSocket client. */
#include <stdio.h>
#include <string.h>

#include "app/app.h"
#include "tern/tern.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve     the demo server: HTTP routes, static files (tern serve --help)\n"
            "  load      WebSocket load generator: echo, pipeline (tern load --help)\n"
            "  connect   interactive WebSocket client (tern connect --help)\n"
            "  version   print the version\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0)
        return tern_app_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "load") == 0)
        return tern_app_load(argc - 1, argv + 1);
    if (strcmp(cmd, "connect") == 0)
        return tern_app_connect(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("tern %s\n", TERN_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "tern: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
