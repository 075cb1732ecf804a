#!/usr/bin/env bash
# Checks that what differs between systems stays in the platform files
# (no build needed): no file under src/ but src/platform/ and the Linux
# back ends (src/loop/epoll.c, src/loop/uring*.[ch]) calls a Linux-only
# function, names a Linux-only constant or includes a Linux-only header.
# Comments are left out (cpp -fpreprocessed strips them and expands
# nothing). The portable build checks the rest: it compiles without
# _GNU_SOURCE, where glibc hides most of them anyway.
#
#   scripts/check-platform.sh
set -euo pipefail
cd "$(dirname "$0")/.."
linux_only='\b(epoll_[a-z_]+|EPOLL[A-Z_]*|eventfd|EFD_[A-Z]+|signalfd|SFD_[A-Z]+|accept4|sendfile|getrandom|GRND_[A-Z]+|openat2|RESOLVE_BENEATH|TCP_INFO|tcp_info|sched_getaffinity|CPU_COUNT|MSG_NOSIGNAL|MSG_MORE|SOCK_NONBLOCK|SOCK_CLOEXEC|CLOCK_[A-Z]+_COARSE|SIOCOUTQ|pipe2|dup3|O_PATH|SO_DOMAIN|POLLRDHUP|strerrordesc_np|strerrorname_np|memmem|splice|prctl|syscall)\b'
linux_headers='#[[:space:]]*include[[:space:]]*<(linux/|sys/(epoll|eventfd|signalfd|sendfile|random|syscall|ioctl|prctl)\.h|sched\.h)'
status=0
while read -r f; do
    code=$(cpp -fpreprocessed -dD -P "$f" 2>/dev/null || cat "$f")
    hits=$(grep -E "$linux_only|$linux_headers" <<<"$code" || true)
    if [ -n "$hits" ]; then
        echo "   FAILED: $f uses what only Linux has (move it behind src/platform/platform.h):"
        sed 's/^/      /' <<<"$hits"
        status=1
    fi
done < <(find src -type f \( -name '*.c' -o -name '*.h' \) ! -path 'src/platform/*' \
             ! -path src/loop/epoll.c ! -path src/loop/uring.c \
             ! -path src/loop/uring.h ! -path src/loop/uring_stream.c | sort)
if [ $status -eq 0 ]; then
    echo "check-platform: no Linux-only call, constant or header outside src/platform/ and the Linux back ends"
else
    echo "check-platform: FAILED"
fi
exit $status
