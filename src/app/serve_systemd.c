/* tern serve under systemd (Type=notify or notify-reload): READY=1 once
 * every thread listens, RELOADING=1 then READY=1 around a SIGHUP's
 * reload, STOPPING=1 when the drain begins, and WATCHDOG=1 from loop 0's
 * timer at half the unit's WatchdogSec, so that a loop that hangs is
 * restarted. Through libsystemd's sd_notify, which does nothing (and
 * costs a getenv) when NOTIFY_SOCKET is not set, that is, outside
 * systemd. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "app/app.h"

/* The status READY=1 gave, said again once a reload is done (loop 0 only). */
static char ready_status[480];

void app_serve_sd_ready(const char *status) {
    char msg[512];
    snprintf(ready_status, sizeof(ready_status), "%s", status);
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", status);
    sd_notify(0, msg);
}

void app_serve_sd_reloading(void) {
    /* systemd takes a RELOADING=1 only with the time it was sent (the
     * monotonic clock, in microseconds), to tell it from a stale one. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char msg[128];
    snprintf(msg, sizeof(msg), "RELOADING=1\nSTATUS=reloading\nMONOTONIC_USEC=%llu",
             (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
    sd_notify(0, msg);
}

void app_serve_sd_reloaded(void) {
    char msg[512];
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", ready_status);
    sd_notify(0, msg);
}

int app_serve_sd_sockets(app_sd_sockets *out) {
    *out = (app_sd_sockets){-1, -1, -1};
    char **names = NULL;
    int n = sd_listen_fds_with_names(1, &names);
    if (n < 0) {
        fprintf(stderr, "tern serve: the sockets from systemd (LISTEN_FDS): %s\n", strerror(-n));
        return -1;
    }
    int ok = 0;
    for (int i = 0; i < n; i++) {
        int fd = SD_LISTEN_FDS_START + i;
        const char *name = names && names[i] ? names[i] : "";
        int *slot = !strcmp(name, "https") ? &out->https
                    : !strcmp(name, "admin") ? &out->admin : &out->http;
        if (sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1) <= 0) {
            fprintf(stderr, "tern serve: the socket from systemd named %s is not a listening "
                            "stream socket\n", name);
            ok = -1;
        } else if (*slot >= 0) {
            fprintf(stderr, "tern serve: two sockets from systemd for the %s listener (named "
                            "http, https or admin by FileDescriptorName=)\n",
                    slot == &out->https ? "https" : slot == &out->admin ? "admin" : "http");
            ok = -1;
        } else {
            *slot = fd;
        }
    }
    for (int i = 0; names && names[i]; i++)
        free(names[i]);
    free(names);
    return ok;
}

void app_serve_sd_stopping(void) { sd_notify(0, "STOPPING=1\nSTATUS=draining"); }

static void watchdog_tick(tern_timer *t, void *user) { sd_notify(0, "WATCHDOG=1"); }

int app_serve_sd_watchdog(tern_loop *loop, tern_timer **out) {
    uint64_t usec = 0;
    *out = NULL;
    /* > 0: WATCHDOG_USEC is set (and WATCHDOG_PID, when set, is ours) */
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return 0;
    uint64_t ms = usec / 2000;   /* half the period, as sd_watchdog_enabled(3) advises */
    if (ms == 0)
        ms = 1;
    sd_notify(0, "WATCHDOG=1");
    return tern_timer_start(loop, out, ms, ms, watchdog_tick, NULL);
}
