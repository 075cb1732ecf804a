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
            "  man       print the manual page, tern(1), as roff (man -l -)\n"
            "  version   print the version, the TLS library and the I/O back ends\n"
            "            (also tern --version, tern serve --version)\n");
}

void app_print_version(FILE *f) {
    fprintf(f, "tern %s\nTLS: %s\nI/O back ends: %spoll%s (TERN_IO or --io chooses)\n",
            TERN_VERSION, tern_tls_library(),
#ifdef TERN_HAVE_EPOLL
            "epoll, ",
#else
            "",   /* the portable build: poll alone */
#endif
#ifdef TERN_HAVE_URING
            ", io_uring"
#else
            ""
#endif
    );
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
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        app_print_version(stdout);
        return 0;
    }
    if (strcmp(cmd, "man") == 0) {
        app_serve_man(stdout);
        return ferror(stdout) ? 1 : 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "tern: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
