/* GET /metrics on tern serve's admin listener: the counters of /stats in
 * Prometheus' text format (version 0.0.4).
 *
 * Each counter comes twice: summed over the threads (tern_http_requests_total)
 * and per thread, under a name of its own with a thread label
 * (tern_thread_http_requests_total{thread="0"}). Two names rather than one
 * name with and without the label, so that sum() over either never counts a
 * request twice. Read from the admin listener's loop while the other loops
 * run: each thread's counters are written by that thread alone and read
 * with relaxed loads (tern_server_stats), so a scrape is a consistent set
 * per counter, not a snapshot of the whole process. */
#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "app/app.h"
#include "app/serve_proxy.h"
#include "app/topic_rules.h"

/* One thread's counters, read together. */
typedef struct metrics_sample {
    tern_stats st;
    tern_pubsub_counters ps;
} metrics_sample;

/* A per-thread metric: its name without prefix, its type, help, and where
 * its value lies in a metrics_sample. max: summed as the largest, not the
 * total (a high-water mark). */
typedef struct metric_def {
    const char *name, *type, *help;
    size_t off;
    bool max;
} metric_def;

#define ST(f) offsetof(metrics_sample, st.f)
#define PS(f) offsetof(metrics_sample, ps.f)

static const metric_def per_thread[] = {
    {"connections_open", "gauge", "Connections open now (HTTP and WebSocket).", ST(connections), false},
    {"connections_accepted_total", "counter", "Connections accepted.", ST(accepted), false},
    {"listeners", "gauge", "Listening sockets open.", ST(listeners), false},
    {"listeners_paused", "gauge", "Listening sockets not accepting now (out of descriptors).", ST(listeners_paused), false},
    {"http_requests_total", "counter", "HTTP requests whose head was read (upgrades too).", ST(requests), false},
    {"ws_messages_in_total", "counter", "Whole WebSocket messages received.", ST(ws_messages_in), false},
    {"ws_messages_out_total", "counter", "WebSocket messages sent.", ST(ws_messages_out), false},
    {"bytes_in_total", "counter", "Bytes of requests and frames consumed.", ST(bytes_in), false},
    {"bytes_out_total", "counter", "Bytes of responses and frames sent.", ST(bytes_out), false},
    {"pubsub_subscriptions", "gauge", "Live pub/sub subscriptions.", PS(subscriptions), false},
    {"pubsub_messages_total", "counter", "Published messages that found subscribers.", PS(messages), false},
    {"pubsub_delivered_total", "counter", "Copies of messages given to subscribers.", PS(delivered), false},
    {"pubsub_dropped_total", "counter", "Copies not given: a subscriber too far behind.", PS(dropped), false},
    {"pubsub_closed_total", "counter", "Subscribers closed by the close policy.", PS(closed), false},
    {"pubsub_conflated_total", "counter", "Queued copies replaced by newer ones of their key.", PS(conflated), false},
    {"pubsub_queue_max", "gauge", "The most messages one subscription had queued.", PS(queue_max), true},
};

/* The answer being written: grows as needed; failed once out of memory. */
typedef struct metrics_buf {
    char *p;
    size_t len, cap;
    bool failed;
} metrics_buf;

static void put(metrics_buf *b, const char *fmt, ...) {
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void family(metrics_buf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static uint64_t value(const metrics_sample *s, size_t off) {
    uint64_t v;
    memcpy(&v, (const char *)s + off, sizeof(v));
    return v;
}

/* A per-rule pub/sub family: name, type, help, and where its value lies
 * in a tern_pubsub_rule_counters. */
typedef struct rule_metric_def {
    const char *name, *type, *help;
    size_t off;
} rule_metric_def;

#define RC(f) offsetof(tern_pubsub_rule_counters, f)

static const rule_metric_def per_rule[] = {
    {"tern_pubsub_rule_subscriptions", "gauge", "Live subscriptions to the rule's topics.", RC(subscriptions)},
    {"tern_pubsub_rule_published_total", "counter", "Publishes to the rule's topics made on this node.", RC(published)},
    {"tern_pubsub_rule_delivered_total", "counter", "Copies of the rule's messages given to subscribers.", RC(delivered)},
    {"tern_pubsub_rule_dropped_total", "counter", "Copies not given: a subscriber too far behind.", RC(dropped)},
    {"tern_pubsub_rule_conflated_total", "counter", "Queued copies replaced by newer ones of their key.", RC(conflated)},
    {"tern_pubsub_rule_replayed_total", "counter", "Messages from the history given to new subscriptions.", RC(replayed)},
};

/* The per-rule families: one series per rule, labelled with its pattern
 * as --topic gives it ("orders.*", "market"). Patterns are topic names,
 * which cannot hold '"', '\\' or a newline (check_topic), so they need no
 * escaping. */
static void put_rules(metrics_buf *b, tern_server *srv, const app_topic_rules *rules) {
    int n = rules ? rules->n : 0;
    tern_pubsub_rule_counters *rc = calloc((size_t)(n > 0 ? n : 1), sizeof(*rc));
    if (rc == NULL) {
        b->failed = true;
        return;
    }
    for (int i = 0; i < n; i++) {
        char prefix[TERN_TOPIC_MAX + 1];
        memcpy(prefix, rules->r[i].pattern, rules->r[i].len);
        prefix[rules->r[i].len] = '\0';
        tern_pubsub_rule_stats(srv, prefix, !rules->r[i].prefix, &rc[i]);
    }
    const size_t ndefs = sizeof(per_rule) / sizeof(per_rule[0]);
    for (size_t d = 0; d < ndefs; d++) {
        const rule_metric_def *m = &per_rule[d];
        family(b, m->name, m->type, m->help);
        for (int i = 0; i < n; i++) {
            const app_topic_rule *r = &rules->r[i];
            const char *star = r->prefix ? "*" : "";
            uint64_t v;
            memcpy(&v, (const char *)&rc[i] + m->off, sizeof(v));
            put(b, "%s{rule=\"%.*s%s\"} %llu\n", m->name, (int)r->len, r->pattern, star,
                (unsigned long long)v);
        }
    }
    family(b, "tern_pubsub_rule_resumes_total", "counter",
           "Resumes of a subscription, gap=\"true\" when not every missed message could be given.");
    for (int i = 0; i < n; i++) {
        const app_topic_rule *r = &rules->r[i];
        const char *star = r->prefix ? "*" : "";
        put(b, "tern_pubsub_rule_resumes_total{rule=\"%.*s%s\",gap=\"false\"} %llu\n",
            (int)r->len, r->pattern, star, (unsigned long long)rc[i].resumed);
        put(b, "tern_pubsub_rule_resumes_total{rule=\"%.*s%s\",gap=\"true\"} %llu\n",
            (int)r->len, r->pattern, star, (unsigned long long)rc[i].resumed_gap);
    }
    free(rc);
}

static void histogram_add(tern_histogram *to, const tern_histogram *h) {
    for (size_t i = 0; i < TERN_HISTOGRAM_BUCKETS; i++) {
        to->le_us[i] = h->le_us[i];
        to->below[i] += h->below[i];
    }
    to->count += h->count;
    to->sum_us += h->sum_us;
}

/* A histogram family: each loop's, read by get, summed here (each loop
 * counts in its own fixed buckets, so the hot path takes no lock). */
static void put_histogram(metrics_buf *b, const char *name, const char *help, tern_server *srv,
                          int (*get)(const tern_server *, tern_histogram *)) {
    tern_histogram sum = {0}, *h = &sum;
    for (int i = 0; i < tern_server_peer_count(srv); i++) {
        tern_histogram one;
        if (get(tern_server_peer(srv, i), &one) == 0)
            histogram_add(&sum, &one);
    }
    family(b, name, "histogram", help);
    for (size_t i = 0; i < TERN_HISTOGRAM_BUCKETS; i++)
        put(b, "%s_bucket{le=\"%llu.%06llu\"} %llu\n", name,
            (unsigned long long)(h->le_us[i] / 1000000), (unsigned long long)(h->le_us[i] % 1000000),
            (unsigned long long)h->below[i]);
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    put(b, "%s_sum %llu.%06llu\n", name, (unsigned long long)(h->sum_us / 1000000),
        (unsigned long long)(h->sum_us % 1000000));
    put(b, "%s_count %llu\n", name, (unsigned long long)h->count);
}

/* A family with one sample per kind proxied: name{kind="K"} v[K]. */
static void put_proxy_kinds(metrics_buf *b, const char *name, const char *type, const char *help,
                            const uint64_t v[APP_PROXY_KINDS]) {
    family(b, name, type, help);
    for (int k = 0; k < APP_PROXY_KINDS; k++)
        if (app_serve_proxy_on(k))
            put(b, "%s{kind=\"%s\"} %llu\n", name, app_proxy_kind_names[k],
                (unsigned long long)v[k]);
}

/* The backend proxy's (serve_proxy.h), per kind proxied: requests asked,
 * failures by reason, how many wait now, and how long the answers took. */
static void put_proxy(metrics_buf *b) {
    app_proxy_stats st[APP_PROXY_KINDS];
    uint64_t requests[APP_PROXY_KINDS], inflight[APP_PROXY_KINDS];
    bool any = false;
    for (int k = 0; k < APP_PROXY_KINDS; k++) {
        app_serve_proxy_stats_get(k, &st[k]);
        requests[k] = st[k].requests;
        inflight[k] = st[k].inflight;
        any = any || app_serve_proxy_on(k);
    }
    if (!any)
        return;
    put_proxy_kinds(b, "tern_proxy_requests_total", "counter",
                    "Operations asked of the backend proxy, by kind (refused as busy too).",
                    requests);
    family(b, "tern_proxy_errors_total", "counter",
           "Backend proxy requests without a usable answer, by kind and reason.");
    for (int k = 0; k < APP_PROXY_KINDS; k++)
        for (int e = 0; app_serve_proxy_on(k) && e < APP_PROXY_ERRS; e++)
            put(b, "tern_proxy_errors_total{kind=\"%s\",reason=\"%s\"} %llu\n",
                app_proxy_kind_names[k], app_proxy_err_names[e],
                (unsigned long long)st[k].errors[e]);
    put_proxy_kinds(b, "tern_proxy_inflight", "gauge",
                    "Backend proxy requests waiting for their answer now, by kind.", inflight);
    family(b, "tern_proxy_latency_seconds", "histogram",
           "From a backend proxy request to its usable answer, by kind.");
    for (int k = 0; k < APP_PROXY_KINDS; k++) {
        if (!app_serve_proxy_on(k))
            continue;
        const char *kn = app_proxy_kind_names[k];
        for (int i = 0; i < APP_PROXY_LATENCY_BUCKETS; i++)
            put(b, "tern_proxy_latency_seconds_bucket{kind=\"%s\",le=\"%llu.%03llu\"} %llu\n", kn,
                (unsigned long long)(st[k].le_ms[i] / 1000), (unsigned long long)(st[k].le_ms[i] % 1000),
                (unsigned long long)st[k].below[i]);
        put(b, "tern_proxy_latency_seconds_bucket{kind=\"%s\",le=\"+Inf\"} %llu\n", kn,
            (unsigned long long)st[k].count);
        put(b, "tern_proxy_latency_seconds_sum{kind=\"%s\"} %llu.%06llu\n", kn,
            (unsigned long long)(st[k].sum_us / 1000000), (unsigned long long)(st[k].sum_us % 1000000));
        put(b, "tern_proxy_latency_seconds_count{kind=\"%s\"} %llu\n", kn,
            (unsigned long long)st[k].count);
    }
}

/* Prometheus' standard process gauges, from /proc/self: resident memory
 * (statm's second field, in pages) and open descriptors (the directory
 * read itself holds one, not counted). -1 when /proc cannot tell. */
static long long resident_bytes(void) {
    long long pages = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%*s %lld", &pages) != 1)
        pages = -1;
    if (f)
        fclose(f);
    return pages < 0 ? -1 : pages * sysconf(_SC_PAGESIZE);
}

static long long open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    long long n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

/* CPU time used (user + system), in seconds; -1 when unknown. */
static double cpu_seconds(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* When the process started, in Unix seconds, as Prometheus' own clients
 * tell it: /proc/self/stat's starttime (clock ticks after boot) plus
 * /proc/stat's btime. -1 when /proc cannot tell. */
static double start_time_seconds(void) {
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces: count from its ')'. */
    char *p = strrchr(buf, ')');
    unsigned long long ticks = 0;
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d "
                                   "%*d %*d %*d %*d %*d %llu", &ticks) != 1)
        return -1;
    unsigned long long btime = 0;
    bool found = false;
    if ((f = fopen("/proc/stat", "r")) != NULL) {
        char line[256];
        while (!found && fgets(line, sizeof(line), f))
            found = sscanf(line, "btime %llu", &btime) == 1;
        fclose(f);
    }
    long hz = sysconf(_SC_CLK_TCK);
    return found && hz > 0 ? (double)btime + (double)ticks / (double)hz : -1;
}

/* The standard process families beside resident memory and descriptors. */
static void put_process(metrics_buf *b) {
    double cpu = cpu_seconds(), start = start_time_seconds();
    struct rlimit rl;
    if (cpu >= 0) {
        family(b, "process_cpu_seconds_total", "counter",
               "Total user and system CPU time spent in seconds.");
        put(b, "process_cpu_seconds_total %.6f\n", cpu);
    }
    if (start >= 0) {
        family(b, "process_start_time_seconds", "gauge",
               "Start time of the process since unix epoch in seconds.");
        put(b, "process_start_time_seconds %.2f\n", start);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        family(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        put(b, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
}

/* The bridge's families: tern_bridge_*, labelled with the engine
 * ("redis", "nats"); tern_bridge_configured alone is unlabelled, at 0,
 * when there is no bridge. For Redis the same counters come again under
 * their names from before the bridge had other engines, tern_redis_*
 * (deprecated: they go in the next release, README's metrics reference
 * says so; tern_redis_configured is 0 for any other engine). */
static void put_bridge(metrics_buf *b, tern_server *srv) {
    tern_bridge_counters rc;
    bool bridged = tern_pubsub_bridge_stats(srv, &rc) == 0;
    bool redis = bridged && strcmp(rc.engine, "redis") == 0;
    const struct {
        const char *name, *type, *help;   /* name: after "tern_bridge_" */
        unsigned long long v;
    } fam[] = {
        {"configured", "gauge", "1 when pub/sub is bridged (--bridge), labelled with the engine.", 1},
        {"up", "gauge", "1 while the links to the broker are up.", bridged && rc.connected},
        {"auth_refused", "gauge", "1 while the broker refuses the credentials (or their absence).",
         bridged && rc.auth_refused},
        {"reconnects_total", "counter", "Links to the broker made again after a loss.",
         bridged ? rc.reconnects : 0},
        {"published_total", "counter", "Publishes sent to the broker.", bridged ? rc.published : 0},
        {"received_total", "counter", "Messages received from the other nodes.", bridged ? rc.received : 0},
        {"dropped_total", "counter", "Publishes not sent: the broker was away.", bridged ? rc.dropped : 0},
        {"fills_total", "counter", "Missed numbered messages read back from the broker.",
         bridged ? rc.fills : 0},
    };
    char name[64], help[96];
    /* without a bridge, "configured" (0) alone */
    for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]) && (i == 0 || bridged); i++) {
        snprintf(name, sizeof(name), "tern_bridge_%s", fam[i].name);
        family(b, name, fam[i].type, fam[i].help);
        if (bridged)
            put(b, "%s{engine=\"%s\"} %llu\n", name, rc.engine, fam[i].v);
        else
            put(b, "%s 0\n", name);
    }
    for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]) && (i == 0 || redis); i++) {
        snprintf(name, sizeof(name), "tern_redis_%s", fam[i].name);
        snprintf(help, sizeof(help), "Deprecated: tern_bridge_%s{engine=\"redis\"}.", fam[i].name);
        family(b, name, fam[i].type, help);
        put(b, "%s %llu\n", name, redis ? fam[i].v : 0);
    }
}

/* tern_build_info: what this process is, as labels of a constant 1 (the
 * usual *_build_info shape, joined onto other series by node). The node
 * name needs no escaping (--node-name's check); the TLS library's name
 * has no quote, backslash or newline. */
static void put_build_info(metrics_buf *b, tern_server *srv, const char *node) {
    family(b, "tern_build_info", "gauge",
           "1, labelled with the version, TLS library, loop back end and node name.");
    put(b, "tern_build_info{version=\"%s\",tls=\"%s\",backend=\"%s\",node=\"%s\"} 1\n",
        TERN_VERSION, tern_tls_library(), tern_loop_backend(tern_server_loop(srv)), node);
}

/* tern_http_responses_total by status code: each loop counts in its own
 * array (tern_server_responses), summed here; codes never sent are left
 * out. */
static void put_responses(metrics_buf *b, tern_server *srv) {
    uint64_t sum[TERN_HTTP_STATUS_COUNT] = {0}, one[TERN_HTTP_STATUS_COUNT];
    for (int i = 0; i < tern_server_peer_count(srv); i++)
        if (tern_server_responses(tern_server_peer(srv, i), one) == 0)
            for (size_t c = 0; c < TERN_HTTP_STATUS_COUNT; c++)
                sum[c] += one[c];
    family(b, "tern_http_responses_total", "counter", "HTTP responses sent, by status code.");
    for (size_t c = 0; c < TERN_HTTP_STATUS_COUNT; c++)
        if (sum[c])
            put(b, "tern_http_responses_total{code=\"%zu\"} %llu\n", c + TERN_HTTP_STATUS_MIN,
                (unsigned long long)sum[c]);
}

void app_serve_metrics(tern_http_req *req, tern_server *srv, bool draining,
                         const app_topic_rules *rules, const char *node) {
    int n = tern_server_peer_count(srv);
    metrics_sample *each = calloc((size_t)(n > 0 ? n : 1), sizeof(*each));
    metrics_buf b = {.cap = 16384};
    b.p = malloc(b.cap);
    if (each == NULL || b.p == NULL) {
        free(each);
        free(b.p);
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    for (int i = 0; i < n; i++) {
        tern_server_stats(tern_server_peer(srv, i), &each[i].st);
        tern_pubsub_stats(tern_server_peer(srv, i), &each[i].ps);
    }
    const size_t ndefs = sizeof(per_thread) / sizeof(per_thread[0]);
    for (size_t d = 0; d < ndefs; d++) {
        const metric_def *m = &per_thread[d];
        uint64_t sum = 0;
        for (int i = 0; i < n; i++) {
            uint64_t v = value(&each[i], m->off);
            sum = m->max ? (v > sum ? v : sum) : sum + v;
        }
        char name[96];
        snprintf(name, sizeof(name), "tern_%s", m->name);
        family(&b, name, m->type, m->help);
        put(&b, "%s %llu\n", name, (unsigned long long)sum);
    }
    for (size_t d = 0; d < ndefs; d++) {
        const metric_def *m = &per_thread[d];
        char name[96];
        snprintf(name, sizeof(name), "tern_thread_%s", m->name);
        family(&b, name, m->type, m->help);
        for (int i = 0; i < n; i++)
            put(&b, "%s{thread=\"%d\"} %llu\n", name, i,
                (unsigned long long)value(&each[i], m->off));
    }
    /* Refusals by reason: the connection limits (per thread, summed here),
     * and /pubsub's limits (counted process-wide). */
    uint64_t max_conns = 0, per_ip = 0;
    for (int i = 0; i < n; i++) {
        max_conns += each[i].st.refused_max_connections;
        per_ip += each[i].st.refused_per_ip;
    }
    app_serve_pubsub_refusals pr;
    app_serve_pubsub_refusals_get(&pr);
    family(&b, "tern_refused_total", "counter",
           "Clients refused by a limit, by reason (connections answered 503; /pubsub "
           "operations over the rate, connections closed for going on or for a message too big).");
    put(&b, "tern_refused_total{reason=\"max_connections\"} %llu\n", (unsigned long long)max_conns);
    put(&b, "tern_refused_total{reason=\"max_connections_per_ip\"} %llu\n", (unsigned long long)per_ip);
    put(&b, "tern_refused_total{reason=\"pubsub_rate\"} %llu\n", (unsigned long long)pr.rate_refused);
    put(&b, "tern_refused_total{reason=\"pubsub_rate_closed\"} %llu\n", (unsigned long long)pr.rate_closed);
    put(&b, "tern_refused_total{reason=\"pubsub_too_big\"} %llu\n", (unsigned long long)pr.too_big);
    put(&b, "tern_refused_total{reason=\"pubsub_forbidden_subscribe\"} %llu\n",
        (unsigned long long)pr.forbidden_subscribe);
    put(&b, "tern_refused_total{reason=\"pubsub_forbidden_publish\"} %llu\n",
        (unsigned long long)pr.forbidden_publish);
    put_rules(&b, srv, rules);
    put_histogram(&b, "tern_pubsub_delivery_latency_seconds",
                  "From a publish to its loop handing it to the topic's subscribers, once per "
                  "message and loop.", srv, tern_pubsub_latency);
    put_histogram(&b, "tern_ws_session_seconds",
                  "Lengths of the WebSocket sessions that ended, from the 101 to the close.", srv,
                  tern_server_ws_sessions);
    long long rss = resident_bytes(), fds = open_fds();
    if (rss >= 0) {
        family(&b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        put(&b, "process_resident_memory_bytes %lld\n", rss);
    }
    if (fds >= 0) {
        family(&b, "process_open_fds", "gauge", "Number of open file descriptors.");
        put(&b, "process_open_fds %lld\n", fds);
    }
    put_process(&b);
    put_build_info(&b, srv, node);
    put_responses(&b, srv);
    family(&b, "tern_threads", "gauge", "Loops (threads) serving.");
    put(&b, "tern_threads %d\n", n);
    family(&b, "tern_draining", "gauge", "1 once SIGTERM began the drain.");
    put(&b, "tern_draining %d\n", draining ? 1 : 0);
    put_bridge(&b, srv);
    put_proxy(&b);
    free(each);
    if (b.failed)
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
    else
        tern_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
    free(b.p);
}
