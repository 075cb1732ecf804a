/* tern(1): the manual page, written in roff from tern serve's option table
 * (serve_options.c), so that it names every option --help names and says
 * the same of each. `tern man` prints it; the build writes build/tern.1
 * with it and `make install` puts that in share/man/man1. */
#include <stdio.h>

#include "app/app.h"
#include "app/serve_options.h"
#include "tern/tern.h"

void app_serve_man(FILE *f) {
    app_opt_set s;
    if (app_opt_init(&s, "tern serve", app_serve_opts, SV_COUNT) < 0)
        return;
    fprintf(f, ".TH TERN 1 \"\" \"tern %s\" \"User Commands\"\n", TERN_VERSION);
    fputs(".SH NAME\n"
          "tern \\- HTTP, WebSocket and pub/sub server, load generator and client\n"
          ".SH SYNOPSIS\n"
          ".B tern serve\n[\\fIoptions\\fR]\n.br\n"
          ".B tern load\n[\\fIoptions\\fR]\n.br\n"
          ".B tern connect\n[\\fIoptions\\fR] \\fIURL\\fR\n.br\n"
          ".B tern \\-\\-version\n"
          ".SH DESCRIPTION\n"
          ".B tern serve\n"
          "runs the server: HTTP/1.1 (and HTTPS), WebSocket and pub/sub on the public\n"
          "listener (/, /market, /pubsub, /ping, static files with \\-\\-root), and an admin\n"
          "listener (\\-\\-admin\\-listen) for POST /publish, /stats, /metrics, /healthz and\n"
          "/readyz, one event loop per thread.\n"
          ".B tern load\n"
          "is a WebSocket load generator and\n"
          ".B tern connect\n"
          "an interactive WebSocket client; each lists its options with \\-\\-help.\n"
          ".SH OPTIONS (tern serve)\n", f);
    app_opt_man(&s, f);
    fputs(".SH CONFIGURATION\n"
          "Each option may also be given in a file (\\-\\-config FILE, or the file\n"
          "TERN_CONFIG names): one option a line, its name without \\-\\- and its value;\n"
          "# starts a comment. Flags win over the environment, the environment over the\n"
          "file, the file over the defaults.\n"
          ".SH ENVIRONMENT\n"
          ".TP\n.B TERN_\\fINAME\\fR\n"
          "an option: TERN_MAX_CONNECTIONS=10000 is \\-\\-max\\-connections 10000. A TERN_\n"
          "variable that is no option's is named in a warning at start.\n"
          ".TP\n.B TERN_CONFIG\n"
          "the configuration file, when \\-\\-config is not given.\n"
          ".TP\n.B TERN_IO\n"
          "uring, epoll or poll: the I/O back end (as \\-\\-io).\n"
          ".TP\n.B NOTIFY_SOCKET\\fR, \\fBLISTEN_FDS\n"
          "systemd: READY=1, RELOADING=1, STOPPING=1 and WATCHDOG=1 notifications;\n"
          "sockets passed by socket activation (named http, https or admin).\n"
          ".SH SIGNALS\n"
          ".TP\n.B SIGTERM\\fR, \\fBSIGINT\n"
          "the drain: /readyz answers 503, after \\-\\-drain\\-delay the listeners close,\n"
          "responses in flight finish, WebSockets close with 1012; exit status 0.\n"
          "A second signal exits at once (during \\-\\-drain\\-delay: ends the delay,\n"
          "and a third exits at once).\n"
          ".TP\n.B SIGHUP\n"
          "reads the configuration file again and applies what may change while serving,\n"
          "the token keys and the certificates.\n"
          ".SH EXIT STATUS\n"
          "0 after a drain or for \\-\\-help, \\-\\-version and \\-\\-print\\-config;\n"
          "1 when the server cannot start; 2 for a bad option.\n"
          ".SH SEE ALSO\n"
          "README.md and docs/ of tern's sources.\n", f);
    app_opt_free(&s);
}
