/* Host names resolved by c-ares on a loop, never blocking it: the
 * WebSocket client's dial (src/ws/client.c) and the Redis bridge
 * (src/pubsub/redis.c) both resolve through here. Loop thread only. */
#ifndef TERN_NET_RESOLVE_H
#define TERN_NET_RESOLVE_H

#include <stdint.h>
#include <sys/socket.h>

#include "tern/loop.h"

#define TERN__RESOLVE_MAX 8   /* addresses of one name kept, in the resolver's order */

typedef struct tern__resolve tern__resolve;

/* The answer. err 0: n (1..TERN__RESOLVE_MAX) addresses, IPv4 or IPv6,
 * with the port given to tern__resolve_start; TERN_ENOHOST: the name has
 * no address, why says c-ares' reason ("Domain name not found"); -ETIMEDOUT:
 * no answer within the timeout; -ENOMEM. The resolution is over and freed
 * before the call: its handle must be forgotten. Always from the loop (a
 * watcher or a timer), never from inside tern__resolve_start. */
typedef void (*tern__resolve_cb)(void *user, int err, const char *why,
                                 const struct sockaddr_storage *ss, const socklen_t *len, int n);

/* Starts resolving host for port: 0 and *out, after which cb is called
 * exactly once unless the resolution is cancelled first; or a negative
 * error (-ENOMEM, -EINVAL for servers c-ares refuses, TERN_ENOHOST when
 * c-ares cannot start) with nothing started and no call. servers: c-ares'
 * "host[:port],..." (NULL: the system's, /etc/resolv.conf). */
TERN_MUST_CHECK
int tern__resolve_start(tern__resolve **out, tern_loop *loop, const char *host, int port,
                        const char *servers, uint32_t timeout_ms, tern__resolve_cb cb,
                        void *user);

/* Ends a resolution under way (NULL: nothing): its sockets and timer go,
 * and cb is never called. */
void tern__resolve_cancel(tern__resolve *q);

#endif
