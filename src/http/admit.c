/* Connection limits: max_connections and max_connections_per_ip, counted
 * over every loop sharing a configuration (under tern_run, the process).
 *
 * The total is one atomic counter. The per-address counts are a small
 * chained hash table under a mutex: an accept and a close each take it
 * once, uncontended unless two loops accept at the same moment, which
 * costs less than the accept itself. Entries never move (the table grows
 * by realloc, indices stay), so a connection keeps its address's index in
 * 16 bits of its tern__conn (owner_tag) and its close needs no lookup of
 * the address, which a reset socket could no longer give. */
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/server.h"
#include "loop/log.h"
#include "platform/platform.h"

#define TERN__ADDR_MAX 65536   /* indices 1..65535 fit owner_tag; 0 is "none" */

static uint32_t addr_hash(uint64_t key, bool v6) {
    uint64_t h = (key ^ (v6 ? 0x9e3779b97f4a7c15u : 0)) * 0xff51afd7ed558ccdu;
    return (uint32_t)(h >> 32);
}

/* The address of fd as a key: the IPv4 address (an IPv4-mapped IPv6 one
 * too), or the first 64 bits of an IPv6 one. false when fd has none
 * (Unix socket) or it cannot be read. */
static bool peer_key(int fd, uint64_t *key, bool *v6) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
        return false;
    if (ss.ss_family == AF_INET) {
        *key = ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr);
        *v6 = false;
        return true;
    }
    if (ss.ss_family != AF_INET6)
        return false;
    const uint8_t *b = ((struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    uint64_t k = 0;
    if (memcmp(b, mapped, 12) == 0) {
        for (int i = 12; i < 16; i++)
            k = k << 8 | b[i];
        *v6 = false;
    } else {
        for (int i = 0; i < 8; i++)
            k = k << 8 | b[i];
        *v6 = true;
    }
    *key = k;
    return true;
}

/* Doubles the table (from 64 entries up to TERN__ADDR_MAX) and threads
 * the live entries onto the new buckets; their indices stay. Under lock. */
static bool grow(tern__http_admission *a) {
    uint32_t cap = a->cap ? a->cap * 2 : 64;
    if (cap > TERN__ADDR_MAX)
        return false;
    tern__http_addr *addrs = realloc(a->addrs, sizeof(*addrs) * cap);
    if (addrs == NULL)
        return false;
    a->addrs = addrs;
    uint16_t *buckets = calloc(cap, sizeof(*buckets));
    if (buckets == NULL)
        return false;
    free(a->buckets);
    a->buckets = buckets;
    a->cap = cap;
    if (a->used == 0)
        a->used = 1;   /* index 0 is "none" */
    for (uint32_t i = 1; i < a->used; i++) {
        tern__http_addr *e = &a->addrs[i];
        if (e->count == 0)
            continue;   /* the free list keeps its links */
        uint32_t b = addr_hash(e->key, e->v6) & (cap - 1);
        e->next = buckets[b];
        buckets[b] = (uint16_t)i;
    }
    return true;
}

/* A free entry's index, 0 when the table is full. Under lock. */
static uint16_t take_entry(tern__http_admission *a) {
    if (a->free_head) {
        uint16_t i = a->free_head;
        a->free_head = a->addrs[i].next;
        return i;
    }
    if ((a->used >= a->cap && !grow(a)) || a->used >= TERN__ADDR_MAX)
        return 0;
    return (uint16_t)a->used++;
}

int tern__http_admit(tern_server *srv, int fd, uint16_t *tag) {
    tern__server_config *cfg = srv->cfg;
    tern__http_admission *a = &cfg->admit;
    uint32_t max = cfg->opt.max_connections;
    *tag = 0;
    if (atomic_fetch_add_explicit(&a->open, 1, memory_order_relaxed) >= max) {
        atomic_fetch_sub_explicit(&a->open, 1, memory_order_relaxed);
        return 1;
    }
    uint32_t per_ip = cfg->opt.max_connections_per_ip;
    uint64_t key;
    bool v6;
    if (per_ip == TERN_UNLIMITED || !peer_key(fd, &key, &v6))
        return 0;
    int refused = 0;
    pthread_mutex_lock(&a->lock);
    if (a->cap == 0)
        grow(a);
    if (a->cap) {
        uint32_t b = addr_hash(key, v6) & (a->cap - 1);
        uint16_t i = a->buckets[b];
        while (i && (a->addrs[i].key != key || a->addrs[i].v6 != v6))
            i = a->addrs[i].next;
        if (i && a->addrs[i].count >= per_ip) {
            refused = 2;
        } else if (i) {
            a->addrs[i].count++;
            *tag = i;
        } else if ((i = take_entry(a)) != 0) {
            b = addr_hash(key, v6) & (a->cap - 1);   /* take_entry may have grown it */
            a->addrs[i] = (tern__http_addr){.key = key, .count = 1, .next = a->buckets[b], .v6 = v6};
            a->buckets[b] = i;
            *tag = i;
        }
        /* else: more addresses than the table tells apart; not counted */
    }
    pthread_mutex_unlock(&a->lock);
    if (refused)
        atomic_fetch_sub_explicit(&a->open, 1, memory_order_relaxed);
    return refused;
}

void tern__http_release(tern_server *srv, uint16_t tag) {
    tern__http_admission *a = &srv->cfg->admit;
    atomic_fetch_sub_explicit(&a->open, 1, memory_order_relaxed);
    if (tag == 0)
        return;
    pthread_mutex_lock(&a->lock);
    tern__http_addr *e = &a->addrs[tag];
    if (--e->count == 0) {
        /* Off its bucket's chain, onto the free list. */
        uint16_t *p = &a->buckets[addr_hash(e->key, e->v6) & (a->cap - 1)];
        while (*p != tag)
            p = &a->addrs[*p].next;
        *p = e->next;
        e->next = a->free_head;
        a->free_head = tag;
    }
    pthread_mutex_unlock(&a->lock);
}

void tern__http_refuse(int fd, bool tls) {
    static const char answer[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                 "Retry-After: 1\r\n"
                                 "Connection: close\r\n"
                                 "Content-Type: text/plain\r\n"
                                 "Content-Length: 20\r\n"
                                 "\r\n"
                                 "Service Unavailable\n";
    if (!tls) {
        /* Read what already came (a request sent right after the connect):
         * a close with unread bytes would be a reset, which can destroy
         * the answer before the client reads it. What comes later is the
         * client's to lose; the connection is not kept to linger. */
        char scratch[4096];
        for (int i = 0; i < 4 && recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0; i++)
            ;
        ssize_t w = tern__plat_send(fd, answer, sizeof(answer) - 1);
        (void)w;   /* a client that cannot take 150 bytes gets the close alone */
        shutdown(fd, SHUT_WR);
    }
    close(fd);
}

/* Refusals not yet in a log line (by limit), and the second of the last
 * line. Process-wide atomics: a refusal is rare next to a request, and
 * every loop's count belongs in the one line. */
static _Atomic uint64_t unlogged_max, unlogged_ip;
static _Atomic int64_t logged_sec = -1;

void tern__http_log_limit_refusal(bool max) {
    atomic_fetch_add_explicit(max ? &unlogged_max : &unlogged_ip, 1, memory_order_relaxed);
    int64_t now = tern__plat_mono_sec(), last = atomic_load_explicit(&logged_sec, memory_order_relaxed);
    /* One thread a second wins the exchange and writes the line; the
     * refusals of the seconds after it wait for the next refusal (a
     * limit that stops refusing has nothing more to say). */
    if (now == last || !atomic_compare_exchange_strong(&logged_sec, &last, now))
        return;
    uint64_t m = atomic_exchange(&unlogged_max, 0), ip = atomic_exchange(&unlogged_ip, 0);
    tern__log(TERN_LOG_WARN, TERN__LOG_CONN_LIMIT,
              "http: %llu connection(s) refused with 503 since the last such line: %llu over "
              "max_connections, %llu over max_connections_per_ip",
              (unsigned long long)(m + ip), (unsigned long long)m, (unsigned long long)ip);
}

void tern__http_admit_free(tern__http_admission *a) {
    pthread_mutex_destroy(&a->lock);
    free(a->addrs);
    free(a->buckets);
}
