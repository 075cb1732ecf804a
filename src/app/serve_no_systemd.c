/* tern serve where there is no systemd (the portable build, CMake
 * TERN_PORTABLE, which has no libsystemd): no service manager is told
 * anything and none passes sockets, as serve_systemd.c behaves outside
 * systemd (NOTIFY_SOCKET and LISTEN_FDS unset). The same calls
 * (app.h), so serve.c has one path. */
#include <stddef.h>

#include "app/app.h"

void app_serve_sd_ready(const char *status) { (void)status; }
void app_serve_sd_reloading(void) {}
void app_serve_sd_reloaded(void) {}
void app_serve_sd_stopping(void) {}

int app_serve_sd_sockets(app_sd_sockets *out) {
    *out = (app_sd_sockets){-1, -1, -1};
    return 0;
}

int app_serve_sd_watchdog(tern_loop *loop, tern_timer **out) {
    (void)loop;
    *out = NULL;
    return 0;
}
