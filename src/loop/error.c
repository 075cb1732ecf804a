/* The names and sentences of the codes tern returns (tern_strerror,
 * tern_err_name). Every string returned is static and never changes:
 * strerror(3) may hand out a per-thread buffer that its next call
 * overwrites (glibc does for unknown codes), so it is not used. */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "tern/loop.h"
/* Only for the values of tern_send_result, which are public constants:
 * naming them uses nothing of the net layer. */
#include "tern/net.h"
#include "platform/platform.h"

/* tern's own codes: 0 and the positive tern_send_result values (1 and 2
 * are also EPERM and ENOENT, but no call returns those positive), and the
 * negative ones outside the errno range. */
typedef struct tern__code {
    int code;
    const char *name;
    const char *text;
} tern__code;

static const tern__code tern__codes[] = {
    {TERN_SEND_OK, "OK", "Success"},
    {TERN_SEND_BUFFERED, "TERN_SEND_BUFFERED",
     "Sent to the connection's backlog: the kernel was full"},
    {TERN_SEND_DROPPED, "TERN_SEND_DROPPED",
     "Not sent, dropped: the connection's backlog is over its limit"},
    {TERN_ENOHOST, "TERN_ENOHOST", "Host name does not resolve"},
};

static const tern__code *own_code(int err) {
    for (size_t i = 0; i < sizeof(tern__codes) / sizeof(tern__codes[0]); i++)
        if (tern__codes[i].code == err)
            return &tern__codes[i];
    return NULL;
}

/* The errno value of err (errors are negative; errno itself, positive, is
 * taken too), or 0 when there is none (INT_MIN has no negation). */
static int errno_of(int err) {
    if (err == INT_MIN)
        return 0;
    return err < 0 ? -err : err;
}

const char *tern_strerror(int err) {
    const tern__code *c = own_code(err);
    if (c)
        return c->text;
    int e = errno_of(err);
    /* The platform's constant strings, NULL for an unknown code. */
    const char *s = e > 0 ? tern__plat_errno_text(e) : NULL;
    return s ? s : "Unknown error";
}

const char *tern_err_name(int err) {
    const tern__code *c = own_code(err);
    if (c)
        return c->name;
    int e = errno_of(err);
    const char *s = e > 0 ? tern__plat_errno_name(e) : NULL;
    return s ? s : "UNKNOWN";
}
