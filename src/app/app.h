/* The tern command's subcommands. */
#ifndef TERN_APP_H
#define TERN_APP_H

int tern_app_serve(int argc, char **argv);
/* argv[0] is "load", argv[1] the mode (echo or pipeline). */
int tern_app_load(int argc, char **argv);

/* serve_pubsub.c: /pubsub, POST /publish/:topic and /fanout on srv (in
 * tern serve's setup); wo: the WebSocket options of the other routes. */
#include "tern/tern.h"
int tern__serve_pubsub_routes(tern_server *srv, const tern_ws_options *wo,
                              const tern_pubsub_options *po,
                              int (*on_upgrade)(tern_http_req *, void **, void *), void *user);

#endif
