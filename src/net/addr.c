/* Addresses as text, for logs. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "tern/net.h"

int tern_addr_format(const struct sockaddr *addr, socklen_t len, char *buf, size_t cap) {
    if (addr == NULL || buf == NULL || len < (socklen_t)sizeof(sa_family_t))
        return -EINVAL;
    char ip[INET6_ADDRSTRLEN];
    int n;
    switch (addr->sa_family) {
    case AF_INET: {
        if (len < (socklen_t)sizeof(struct sockaddr_in))
            return -EINVAL;
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        n = snprintf(buf, cap, "%s:%u", ip, (unsigned)ntohs(in->sin_port));
        break;
    }
    case AF_INET6: {
        if (len < (socklen_t)sizeof(struct sockaddr_in6))
            return -EINVAL;
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
        n = snprintf(buf, cap, "[%s]:%u", ip, (unsigned)ntohs(in6->sin6_port));
        break;
    }
    case AF_UNIX: {
        /* An unnamed socket (what a client usually is) has no path; an
         * abstract one starts with a NUL, shown as '@'. */
        const struct sockaddr_un *un = (const struct sockaddr_un *)addr;
        size_t plen = (size_t)len - offsetof(struct sockaddr_un, sun_path);
        if ((size_t)len <= offsetof(struct sockaddr_un, sun_path))
            plen = 0;
        if (plen > sizeof(un->sun_path))
            plen = sizeof(un->sun_path);
        const char *path = un->sun_path;
        const char *at = "";
        if (plen > 0 && path[0] == '\0') {
            at = "@";
            path++;
            plen--;
        } else {
            plen = strnlen(path, plen);
        }
        n = snprintf(buf, cap, "unix:%s%.*s", at, (int)plen, path);
        break;
    }
    default:
        return -EINVAL;
    }
    if (n < 0)
        return -EINVAL;
    if ((size_t)n >= cap)
        return -ENOSPC;
    return n;
}
