/* Static files: a GET/HEAD route that serves a directory with sendfile().
 *
 * Paths are opened beneath the root's descriptor (tern__plat_open_beneath:
 * openat2(RESOLVE_BENEATH) on Linux), so neither ".." nor a symlink can
 * lead out of the root, whatever the path looks like. What cannot be
 * resolved beneath it (EXDEV: an absolute symlink pointing back inside)
 * is opened normally and kept only if the opened descriptor lies under
 * the root (tern__plat_open_checked). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "http/server.h"
#include "platform/platform.h"

#define TERN__PATH_MAX 4096

/* Invariant: root_fd is a descriptor of the root directory
 * (tern__plat_open_root: O_PATH on Linux), open
 * for the server's lifetime (closed by the route's cleanup). */
typedef struct tern__static {
    int root_fd;
    char *root_path; /* realpath() of the root, for the EXDEV fallback */
    struct tern__static *next;
} tern__static;

static const struct {
    const char *ext;
    const char *type;
} content_types[] = {
    {"html", "text/html; charset=utf-8"}, {"htm", "text/html; charset=utf-8"},
    {"css", "text/css; charset=utf-8"},   {"js", "text/javascript; charset=utf-8"},
    {"mjs", "text/javascript; charset=utf-8"}, {"json", "application/json"},
    {"txt", "text/plain; charset=utf-8"}, {"md", "text/markdown; charset=utf-8"},
    {"xml", "application/xml"},           {"svg", "image/svg+xml"},
    {"png", "image/png"},                 {"jpg", "image/jpeg"},
    {"jpeg", "image/jpeg"},               {"gif", "image/gif"},
    {"webp", "image/webp"},               {"ico", "image/x-icon"},
    {"avif", "image/avif"},               {"wasm", "application/wasm"},
    {"pdf", "application/pdf"},           {"zip", "application/zip"},
    {"gz", "application/gzip"},           {"woff", "font/woff"},
    {"woff2", "font/woff2"},              {"mp4", "video/mp4"},
    {"webm", "video/webm"},               {"mp3", "audio/mpeg"},
    {"csv", "text/csv; charset=utf-8"},
};

static const char *content_type_of(const char *path) {
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash)) {
        for (size_t i = 0; i < sizeof(content_types) / sizeof(content_types[0]); i++)
            if (strcasecmp(dot + 1, content_types[i].ext) == 0)
                return content_types[i].type;
    }
    return "application/octet-stream";
}

static void simple(tern_http_req *req, int status) {
    char page[TERN__ERROR_PAGE_BUF];
    const char *ctype, *body;
    size_t len;
    tern__http_error_page(req->srv, status, page, &ctype, &body, &len);
    tern_http_respond(req, status, ctype, body, len);
}

static int status_of(int err) {
    switch (err) {
    case -ENOENT:
    case -ENOTDIR:
    case -ENAMETOOLONG:
        return 404;
    case -EXDEV:    /* would leave the root */
    case -ELOOP:
    case -EACCES:
    case -EPERM:
        return 403;
    default:
        return 500;
    }
}

static void format_http_date(time_t t, char *out, size_t cap) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, cap, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

static void serve_static(tern_http_req *req, void *user) {
    tern__static *st = user;
    size_t raw_len;
    const char *raw = tern_http_param_raw(req, "*", &raw_len);   /* decoded below, bounded */
    char path[TERN__PATH_MAX + 16];
    ssize_t n = tern__url_decode(path, TERN__PATH_MAX, raw, raw_len, false);
    if (n < 0 || memchr(path, '\0', (size_t)n)) {
        simple(req, n == -ENOSPC ? 414 : 400);
        return;
    }
    path[n] = '\0';
    /* The router hands the rest without its leading '/'; an empty rest is
     * the root itself. Leading slashes would make the path absolute. */
    char *rel = path;
    while (*rel == '/')
        rel++;
    bool dir_request = n == 0 || path[n - 1] == '/';
    int fd = tern__plat_open_beneath(st->root_fd, *rel ? rel : ".");
    if (fd == -EXDEV)
        fd = tern__plat_open_checked(st->root_fd, rel, st->root_path);
    if (fd < 0) {
        simple(req, status_of(fd));
        return;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        simple(req, 500);
        return;
    }
    const char *name = rel;
    if (S_ISDIR(sb.st_mode)) {
        if (!dir_request) {
            /* "/docs" -> "/docs/", so relative links in its index work. */
            close(fd);
            size_t plen;
            const char *p = tern_http_path(req, &plen);
            char loc[TERN__PATH_MAX + 2];
            if (plen + 2 > sizeof(loc)) {
                simple(req, 414);
                return;
            }
            memcpy(loc, p, plen);
            loc[plen] = '/';
            loc[plen + 1] = '\0';
            tern_http_add_header(req, "Location", loc);
            simple(req, 301);
            return;
        }
        int ifd = tern__plat_open_beneath(fd, "index.html");
        close(fd);
        if (ifd < 0) {
            simple(req, ifd == -ENOENT ? 404 : status_of(ifd));
            return;
        }
        fd = ifd;
        name = "index.html";
        if (fstat(fd, &sb) < 0) {
            close(fd);
            simple(req, 500);
            return;
        }
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        simple(req, 403);
        return;
    }
    char last_modified[64];
    format_http_date(sb.st_mtime, last_modified, sizeof(last_modified));
    size_t ims_len;
    const char *ims = tern_http_header(req, "If-Modified-Since", &ims_len);
    if (ims && ims_len < 64) {
        char tmp[64];
        memcpy(tmp, ims, ims_len);
        tmp[ims_len] = '\0';
        struct tm tm = {0};
        const char *end = strptime(tmp, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        if (end && *end == '\0' && sb.st_mtime <= timegm(&tm)) {
            close(fd);
            tern_http_add_header(req, "Last-Modified", last_modified);
            tern_http_respond(req, 304, NULL, NULL, 0);
            return;
        }
    }
    tern_http_add_header(req, "Last-Modified", last_modified);
    tern_http_respond_file(req, 200, content_type_of(name), fd, 0, (size_t)sb.st_size);
}

int tern_http_static(tern_server *srv, const char *prefix, const char *dir) {
    if (srv == NULL || prefix == NULL || dir == NULL)
        return -EINVAL;
    size_t plen = strlen(prefix);
    if (plen == 0 || prefix[0] != '/' || plen > 1024)
        return -EINVAL;
    int root = tern__plat_open_root(dir);
    if (root < 0)
        return root;
    tern__static *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        close(root);
        return -ENOMEM;
    }
    st->root_fd = root;
    st->root_path = realpath(dir, NULL);
    if (st->root_path == NULL) {
        int e = -errno;
        close(root);
        free(st);
        return e;
    }
    char pattern[1040];
    snprintf(pattern, sizeof(pattern), "%s%s*", prefix, prefix[plen - 1] == '/' ? "" : "/");
    int err = tern_http_route(srv, "GET", pattern, serve_static, st);
    if (err < 0) {
        close(root);
        free(st->root_path);
        free(st);
        return err;
    }
    st->next = srv->target->statics;   /* tern_http_route took it: srv is open */
    srv->target->statics = st;
    return 0;
}

void tern__http_static_free(tern__vhost *vh) {
    tern__static *st = vh->statics;
    while (st) {
        tern__static *next = st->next;
        close(st->root_fd);
        free(st->root_path);
        free(st);
        st = next;
    }
    vh->statics = NULL;
}
