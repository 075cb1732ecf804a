/* tern load's statistics: the latency histogram, and the results of a run
 * as one table of fields (load_fields), each with its JSON name, its unit
 * and how to read it, printed as text or as JSON (--json) by one loop over
 * the table. A mode reports the rows whose modes name it; the values come
 * from a load_results the runner's figures (load_stats_common) and the
 * mode's own hook fill. The JSON's names are what bench/run and the tests
 * read: keep them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "app/json.h"
#include "app/load.h"

/* ---- latency histogram ---------------------------------------------------- */

/* The layout's upper bounds (load.h), made by the first load_hist_reset,
 * for the quantiles: bucket i holds [lo, lo + width - 1]. */
static uint64_t hist_le[LOAD_HIST_BUCKETS];

static void make_bounds(void) {
    for (size_t i = 0; i < LOAD_HIST_BUCKETS; i++) {
        uint64_t lo, width;
        if (i < LOAD_HIST_SUB) {
            lo = i;
            width = 1;
        } else {
            unsigned shift = (unsigned)(i / LOAD_HIST_SUB) - 1;
            lo = (uint64_t)(i % LOAD_HIST_SUB + LOAD_HIST_SUB) << shift;
            width = 1ull << shift;
        }
        hist_le[i] = lo + width - 1;
    }
}

void load_hist_reset(load_hist *h) {
    if (hist_le[LOAD_HIST_BUCKETS - 1] == 0)
        make_bounds();
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

void load_hist_record(load_hist *h, uint64_t v) {
    h->bucket[load_hist_bucket(v)]++;
    h->count++;
    h->sum += v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

uint64_t load_hist_quantile(const load_hist *h, double q) {
    if (h->count == 0)
        return 0;
    uint64_t v = tern_histogram_quantile(hist_le, h->bucket, LOAD_HIST_BUCKETS, q);
    return v < h->min ? h->min : v > h->max ? h->max : v;
}

/* ---- the figures ---------------------------------------------------------- */

void load_stats_common(const load_run *run, load_results *r) {
    const load_opts *o = run->o;
    const load_measured *m = &run->m;
    double secs = (double)(run->t1_ns - run->t0_ns) / 1e9;
    memset(r, 0, sizeof(*r));
    r->mode = run->mode->name;
    r->url = o->url;
    r->publish_path = o->pub_path;
    r->connections = o->connections;
    r->size = o->size;
    r->depth = o->depth;
    r->iterations = o->iterations;
    r->warmup_iterations = o->warmup_iterations;
    r->replies = o->replies;
    r->reply_size = o->reply_size;
    r->rate = o->rate;
    r->slow = run->market.nslow;
    r->instruments = o->instruments;
    r->slow_rate = o->slow_rate;
    r->interval_s = (double)o->interval_ms / 1e3;
    r->warmup_s = (double)o->warmup_ms / 1e3;
    r->drain_s = (double)o->drain_ms / 1e3;
    r->duration_s = r->seconds = secs;
    r->connect_s = (double)(run->open_ns - run->start_ns) / 1e9;
    r->messages = m->messages;
    r->msg_per_s = secs > 0 ? (double)m->messages / secs : 0;
    r->mb_per_s = r->msg_per_s * (double)o->size / 1e6;
    const load_hist *h = &m->hist;
    r->lat_mean = h->count ? (double)h->sum / (double)h->count / 1e3 : 0;
    r->lat_p50 = (double)load_hist_quantile(h, 0.50) / 1e3;
    r->lat_p99 = (double)load_hist_quantile(h, 0.99) / 1e3;
    r->lat_max = (double)h->max / 1e3;
    r->unclean_closes = run->unclean;
}

/* ---- the table ------------------------------------------------------------ */

#define M_ECHO (1u << LOAD_ECHO)
#define M_PIPE (1u << LOAD_PIPELINE)
#define M_FAN (1u << LOAD_FANOUT)
#define M_PUB (1u << LOAD_PUBSUB)
#define M_MKT (1u << LOAD_MARKET)
#define M_ALL (M_ECHO | M_PIPE | M_FAN | M_PUB | M_MKT)
#define M_TIMED (M_ECHO | M_FAN | M_PUB | M_MKT)   /* a warm-up and a duration */

enum load_kind { K_STR, K_UINT, K_REAL };

/* One figure. Invariant: at is the offset in load_results of a
 * const char * (K_STR), a uint64_t (K_UINT) or a double (K_REAL, printed
 * with `decimals` digits after the point). Rows of one group are
 * consecutive and of the same modes: the group is one JSON object
 * ("latency_us": {...}); the "cut" group is null when load_results.cut is
 * false. */
typedef struct load_field {
    const char *group;   /* NULL: at the top */
    const char *name;
    unsigned modes;      /* M_* bits: the modes that report it */
    enum load_kind kind;
    int decimals;
    size_t at;
    const char *unit;    /* after the value in the text; "" for a count */
    const char *about;   /* how to read it */
} load_field;

#define F(grp, nm, md, kd, dec, mem, un, ab) \
    {grp, nm, md, kd, dec, offsetof(load_results, mem), un, ab}

static const load_field load_fields[] = {
    F(NULL, "mode", M_ALL, K_STR, 0, mode, "", "echo, pipeline, fanout, pubsub or market"),
    F(NULL, "url", M_ALL, K_STR, 0, url, "", "the subscribers' (or every connection's) URL"),
    F(NULL, "publish_path", M_PUB | M_MKT, K_STR, 0, publish_path, "", "the publisher's path"),
    F(NULL, "connections", M_ALL, K_UINT, 0, connections, "",
      "connections (pubsub, market: subscribers, the publisher apart)"),
    F(NULL, "slow", M_MKT, K_UINT, 0, slow, "", "of the subscribers, those reading slowly"),
    F(NULL, "instruments", M_MKT, K_UINT, 0, instruments, "", "keys the messages update"),
    F(NULL, "depth", M_PIPE, K_UINT, 0, depth, "", "messages written at once per connection"),
    F(NULL, "size", M_ALL, K_UINT, 0, size, "B", "payload of each message sent"),
    F(NULL, "iterations", M_PIPE, K_UINT, 0, iterations, "", "measured messages per connection"),
    F(NULL, "warmup_iterations", M_PIPE, K_UINT, 0, warmup_iterations, "",
      "messages per connection before measuring"),
    F(NULL, "replies", M_FAN, K_UINT, 0, replies, "", "messages a round asks for"),
    F(NULL, "reply_size", M_FAN, K_UINT, 0, reply_size, "B", "bytes of each reply"),
    F(NULL, "interval_s", M_FAN, K_REAL, 3, interval_s, "s", "one round per connection this often"),
    F(NULL, "rate", M_PUB | M_MKT, K_UINT, 0, rate, "msg/s", "the publisher's rate asked for"),
    F(NULL, "slow_rate", M_MKT, K_UINT, 0, slow_rate, "B/s", "what a slow reader reads"),
    F(NULL, "warmup_s", M_TIMED, K_REAL, 3, warmup_s, "s", "before measuring"),
    F(NULL, "duration_s", M_TIMED, K_REAL, 3, duration_s, "s", "measured time, as it ran"),
    F(NULL, "drain_s", M_MKT, K_REAL, 3, drain_s, "s",
      "after publishing, for the slow readers to catch up"),
    F(NULL, "connect_s", M_ALL, K_REAL, 3, connect_s, "s", "to open every connection"),
    F(NULL, "seconds", M_PIPE, K_REAL, 3, seconds, "s", "measured time, as it ran"),
    F(NULL, "rounds_sent", M_FAN, K_UINT, 0, rounds_sent, "", "rounds asked while measuring"),
    F(NULL, "rounds", M_FAN, K_UINT, 0, rounds, "", "rounds whose every reply came"),
    F(NULL, "late", M_FAN, K_UINT, 0, late, "", "rounds done after their interval"),
    F(NULL, "skipped", M_FAN, K_UINT, 0, skipped, "",
      "rounds not asked: the last one still in flight"),
    F(NULL, "missed", M_FAN, K_UINT, 0, missed, "", "late + skipped: the server fell behind"),
    F(NULL, "published", M_PUB | M_MKT, K_UINT, 0, published, "", "messages published"),
    F(NULL, "publish_rate", M_PUB | M_MKT, K_REAL, 1, publish_rate, "msg/s",
      "published a second, as it ran"),
    F(NULL, "publisher_blocked", M_PUB, K_UINT, 0, publisher_blocked, "",
      "ticks the publisher waited: its last messages not through"),
    F(NULL, "shed", M_PUB | M_MKT, K_UINT, 0, shed, "",
      "messages not published: the server read the publisher too slowly"),
    F(NULL, "expected", M_PUB, K_UINT, 0, expected, "", "published x subscribers"),
    F(NULL, "messages", M_ALL, K_UINT, 0, messages, "",
      "echoes, replies or deliveries (fast readers') counted"),
    F(NULL, "echo_bytes", M_PIPE, K_UINT, 0, echo_bytes, "B",
      "the echoes' bytes on the wire, headers included"),
    F(NULL, "gaps", M_PUB | M_MKT, K_UINT, 0, gaps, "",
      "missing in the subscribers' sequences (dropped)"),
    F(NULL, "msg_per_s", M_ALL, K_REAL, 1, msg_per_s, "msg/s", "messages over the measured time"),
    F(NULL, "mb_per_s", M_ECHO | M_PIPE | M_FAN | M_PUB, K_REAL, 3, mb_per_s, "MB/s",
      "their payload (fanout: the replies')"),
    F("latency_us", "mean", M_TIMED, K_REAL, 1, lat_mean, "us",
      "echo: round trip; fanout: a round from when due; pubsub: publish to delivery"),
    F("latency_us", "p50", M_TIMED, K_REAL, 1, lat_p50, "us", "half took at most this"),
    F("latency_us", "p99", M_TIMED, K_REAL, 1, lat_p99, "us", "99 in 100 took at most this"),
    F("latency_us", "max", M_TIMED, K_REAL, 1, lat_max, "us", "the longest"),
    F(NULL, "slow_messages", M_MKT, K_UINT, 0, slow_messages, "", "delivered to slow readers"),
    F(NULL, "slow_msg_per_s", M_MKT, K_REAL, 1, slow_msg_per_s, "msg/s",
      "to slow readers, over the measured time"),
    F("slow_latency_us", "p50", M_MKT, K_REAL, 1, slow_p50, "us", "slow readers' median"),
    F("slow_latency_us", "p99", M_MKT, K_REAL, 1, slow_p99, "us", "slow readers' 99th"),
    F(NULL, "disconnects", M_MKT, K_UINT, 0, disconnects, "", "subscribers the server closed"),
    F(NULL, "stale_keys", M_MKT, K_UINT, 0, stale_keys, "",
      "after the drain, keys not at their latest on slow readers"),
    F(NULL, "stale_keys_fast", M_MKT, K_UINT, 0, stale_keys_fast, "", "the same on fast ones"),
    F(NULL, "key_reorders", M_MKT, K_UINT, 0, key_reorders, "",
      "updates older than one already seen"),
    F(NULL, "unclean_closes", M_ALL, K_UINT, 0, unclean_closes, "",
      "close handshakes at the end that went wrong"),
    F("cut", "at_s", M_PUB, K_REAL, 3, cut_at_s, "s", "into the measured time (-1: never)"),
    F("cut", "for_s", M_PUB, K_REAL, 3, cut_for_s, "s", "how long the subscribers were away"),
    F("cut", "reconnect_s", M_PUB, K_REAL, 3, reconnect_s, "s",
      "into the measured time, the reconnects began (-1: never)"),
    F("cut", "resumed_after_s", M_PUB, K_REAL, 3, resumed_after_s, "s",
      "after the reconnects, every resume answered (-1: not all)"),
    F("cut", "caught_up_after_s", M_PUB, K_REAL, 3, caught_up_after_s, "s",
      "after the reconnects, the last message over 500 ms old"),
    F("cut", "resumed", M_PUB, K_UINT, 0, resumed, "", "subscribers resumed without a gap"),
    F("cut", "not_resumed", M_PUB, K_UINT, 0, not_resumed, "",
      "subscribers the history could not resume"),
    F("cut", "unanswered", M_PUB, K_UINT, 0, unanswered, "", "resumes the server never answered"),
    F("cut", "replayed", M_PUB, K_UINT, 0, replayed, "", "messages replayed from the history"),
};
#undef F

static bool group_is_null(const load_field *f, const load_results *r) {
    return f->group && strcmp(f->group, "cut") == 0 && !r->cut;
}

/* The value of f in r, as text, into out. */
static void format_value(const load_field *f, const load_results *r, char *out, size_t cap) {
    const char *at = (const char *)r + f->at;
    if (f->kind == K_UINT)
        snprintf(out, cap, "%llu", (unsigned long long)*(const uint64_t *)(const void *)at);
    else if (f->kind == K_REAL)
        snprintf(out, cap, "%.*f", f->decimals, *(const double *)(const void *)at);
    else
        snprintf(out, cap, "%s", *(const char *const *)(const void *)at);
}

#define NFIELDS (sizeof(load_fields) / sizeof(load_fields[0]))

/* "name":value, after sep. */
static void print_member(const load_field *f, const load_results *r, const char *sep) {
    printf("%s\"%s\":", sep, f->name);
    if (f->kind == K_STR) {
        app_json_print_string(stdout, *(const char *const *)(const void *)((const char *)r +
                                                                             f->at));
    } else {
        char v[64];
        format_value(f, r, v, sizeof(v));
        fputs(v, stdout);
    }
}

/* One JSON object on one line: the rows of the mode in the table's order,
 * a group's rows as one object under its name. */
static void print_json(const load_results *r, unsigned mode) {
    const char *sep = "";
    putchar('{');
    for (size_t i = 0; i < NFIELDS;) {
        const load_field *f = &load_fields[i];
        size_t end = i + 1;   /* f's group is the rows [i, end) */
        while (f->group && end < NFIELDS && load_fields[end].group &&
               strcmp(load_fields[end].group, f->group) == 0)
            end++;
        if (!(f->modes & mode)) {
            /* not the mode's */
        } else if (f->group == NULL) {
            print_member(f, r, sep);
        } else if (group_is_null(f, r)) {
            printf("%s\"%s\":null", sep, f->group);
        } else {
            printf("%s\"%s\":{", sep, f->group);
            for (size_t k = i; k < end; k++)
                print_member(&load_fields[k], r, k == i ? "" : ",");
            putchar('}');
        }
        if (f->modes & mode)
            sep = ",";
        i = end;
    }
    puts("}");
}

/* One line a figure: its name, value, unit and how to read it; the
 * strings are the headline's already. */
static void print_text(const load_results *r, unsigned mode) {
    for (size_t i = 0; i < NFIELDS; i++) {
        const load_field *f = &load_fields[i];
        if (!(f->modes & mode) || f->kind == K_STR || group_is_null(f, r))
            continue;
        char name[48], v[64];
        snprintf(name, sizeof(name), "%s%s%s", f->group ? f->group : "", f->group ? " " : "",
                 f->name);
        format_value(f, r, v, sizeof(v));
        printf("  %-26s %14s %-5s  %s\n", name, v, f->unit, f->about);
    }
}

void load_stats_print(const load_run *run) {
    load_results r;
    load_stats_common(run, &r);
    if (run->mode->results)
        run->mode->results(run, &r);
    unsigned mode = 1u << run->o->mode;
    if (run->o->json) {
        print_json(&r, mode);
    } else {
        run->mode->headline(run, stdout);
        print_text(&r, mode);
    }
    if (run->unclean)
        fprintf(stderr, "tern load: %u connection%s did not close cleanly; %s\n", run->unclean,
                run->unclean == 1 ? "" : "s", run->unclean_why);
}
