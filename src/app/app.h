/* The tern command's subcommands. */
#ifndef TERN_APP_H
#define TERN_APP_H

int tern_app_serve(int argc, char **argv);
/* argv[0] is "load", argv[1] the mode (echo or pipeline). */
int tern_app_load(int argc, char **argv);
/* argv[0] is "connect": the interactive WebSocket client. */
int tern_app_connect(int argc, char **argv);

/* serve_pubsub.c: /pubsub, POST /publish/:topic and /fanout on srv (in
 * tern serve's setup); wo: the WebSocket options of the other routes. */
#include "tern/tern.h"
int tern__serve_pubsub_routes(tern_server *srv, const tern_ws_options *wo,
                              const tern_pubsub_options *po,
                              int (*on_upgrade)(tern_http_req *, void **, void *), void *user);

/* feed.c: the simulated market data ("market", rate updates a second; 0:
 * none) and live statistics ("stats", every second), from timers on srv's
 * loop; and the page that shows them at /market (and / when at_root). */
int tern__feed_start(tern_server *srv, unsigned rate);
void tern__page_routes(tern_server *srv, bool at_root);
/* The page, src/app/market.html, made into an array at build time. */
extern const unsigned char tern__market_html[];
extern const size_t tern__market_html_len;

#endif
