"""tern serve --threads N: one loop per thread over one configuration
(tern_run). Connections spread over the threads, a SIGTERM drains every one
of them, and WebSocket echo and broadcast work across threads."""
import contextlib
import json
import signal
import socket
import threading
import time

import pytest
from websockets.sync.client import connect

from conftest import SLOW, read_response, recv_until_closed


def get(srv, path, host="t"):
    s = srv.connect()
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        return read_response(s, timeout=10 * SLOW)
    finally:
        s.close()


def stats(srv):
    return srv.stats()   # the admin listener's (on loop 0, not counted in these)


def test_connections_land_on_every_thread(tern_factory):
    srv = tern_factory("--threads", "3")
    for _ in range(200):
        status, _, body, _ = get(srv, "/ping")
        assert (status, body) == (200, b"pong")
    st = stats(srv)
    assert st["threads"] == 3
    assert len(st["each"]) == 3
    # SO_REUSEPORT hashes each connection's addresses to one listener.
    assert all(t["accepted"] > 0 for t in st["each"]), st
    # (/stats is the admin listener's: not counted among them.)
    assert st["total"]["accepted"] >= 200
    assert st["total"]["requests"] >= 200
    assert st["total"]["requests"] == sum(t["requests"] for t in st["each"])
    assert st["total"]["bytes_in"] > 0 and st["total"]["bytes_out"] > 0


def test_one_thread_is_the_default_of_the_tests(tern):
    assert stats(tern)["threads"] == 1


def test_delay_answered_on_every_thread(tern_factory):
    srv = tern_factory("--threads", "2")
    results = []

    def one():
        results.append(get(srv, "/delay?ms=200")[:3:2])

    threads = [threading.Thread(target=one) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(200, b"done\n")] * 40
    st = stats(srv)
    assert all(t["requests"] > 0 for t in st["each"]), st


def test_sigterm_under_load_loses_no_accepted_request(tern_factory):
    srv = tern_factory("--threads", "3", "--shutdown-timeout", "5000")
    n = 60
    socks = []
    for _ in range(n):
        s = srv.connect(timeout=10 * SLOW)
        s.sendall(b"GET /delay?ms=500 HTTP/1.1\r\nHost: t\r\n\r\n")
        socks.append(s)
    # Every request has been read by its thread once /stats counts them all
    # (/stats is the admin listener's: not one of them).
    deadline = time.time() + 5 * SLOW
    while stats(srv)["total"]["requests"] < n and time.time() < deadline:
        time.sleep(0.02)
    assert stats(srv)["total"]["requests"] >= n
    srv.proc.send_signal(signal.SIGTERM)
    for s in socks:
        status, headers, body, _ = read_response(s, timeout=10 * SLOW)
        assert (status, body) == (200, b"done\n")
        assert headers.get("connection") == "close"
        s.close()
    assert srv.proc.wait(timeout=10 * SLOW) == 0


def test_ws_echo_with_two_threads(tern_factory):
    srv = tern_factory("--threads", "2")
    for i in range(8):
        with connect(f"ws://127.0.0.1:{srv.port}/ws", open_timeout=5 * SLOW) as ws:
            ws.send(f"hello {i}")
            assert ws.recv(timeout=5 * SLOW) == f"hello {i}"
            ws.send(b"\x00\x01")
            assert ws.recv(timeout=5 * SLOW) == b"\x00\x01"
    st = stats(srv)
    assert st["total"]["ws_messages_in"] >= 16
    assert st["total"]["ws_messages_out"] >= 16


def test_broadcast_reaches_members_on_every_thread(tern_factory):
    srv = tern_factory("--threads", "2")
    with contextlib.ExitStack() as stack:
        # The kernel spreads connections by a hash: 12 of them all landed on
        # one thread once. Open more until both threads hold members (the
        # connections open on each: /stats' own is the admin listener's).
        def members_on_every_thread():
            st = stats(srv)
            return all(t["connections"] > 0 for t in st["each"]), st
        members = []
        while len(members) < 12 or (len(members) < 64 and not members_on_every_thread()[0]):
            members.append(stack.enter_context(connect(f"ws://127.0.0.1:{srv.port}/ws/broadcast",
                                                       open_timeout=5 * SLOW)))
        ok, st = members_on_every_thread()
        assert ok, st
        members[0].send("to all")
        for m in members:
            assert m.recv(timeout=5 * SLOW) == "to all"


def test_unix_socket_shared_by_threads(tern_factory, tmp_path):
    path = str(tmp_path / "tern.sock")
    srv = tern_factory("--threads", "2", "--unix", path)
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, body, _ = read_response(s, timeout=5 * SLOW)
        assert (status, body) == (200, b"pong")
        s.close()


def test_bad_thread_counts_are_refused(tern_factory):
    import subprocess
    from conftest import TERN_BIN
    for bad in ("0", "-1", "2000", "x"):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", bad],
                           capture_output=True, timeout=10)
        assert r.returncode == 2, (bad, r.stderr)


def test_broadcast_order_is_one_for_every_member(tern_factory):
    """Publishers on both threads send bursts at once: every member, on
    either thread, must see the same sequence (one order, as /pubsub keeps
    per topic), not its own thread's publishes first."""
    srv = tern_factory("--threads", "2")
    url = f"ws://127.0.0.1:{srv.port}/ws/broadcast"
    npub, nread, burst, rounds = 8, 8, 150, 4
    with contextlib.ExitStack() as stack:
        # SO_REUSEPORT spreads these over both threads: with 16 connections
        # both have publishers and readers but once in 2**15.
        members = [stack.enter_context(connect(url, open_timeout=5 * SLOW))
                   for _ in range(npub + nread)]
        st = stats(srv)
        assert all(t["connections"] > 0 for t in st["each"]), st
        pubs = members[:npub]
        deadline = time.time() + 15 * SLOW
        for r in range(rounds):
            go = threading.Barrier(npub)

            def publish(i):
                go.wait()
                for k in range(burst):
                    pubs[i].send(f"{r}.{i}.{k}")

            ts = [threading.Thread(target=publish, args=(i,)) for i in range(npub)]
            for t in ts:
                t.start()
            seqs = []
            for m in members:
                seq = [m.recv(timeout=max(0.1, deadline - time.time()))
                       for _ in range(npub * burst)]
                seqs.append(seq)
            for t in ts:
                t.join()
            for i, seq in enumerate(seqs):
                # each publisher's own order holds everywhere, before and after
                for p in range(npub):
                    mine = [x for x in seq if x.startswith(f"{r}.{p}.")]
                    assert mine == [f"{r}.{p}.{k}" for k in range(burst)]
                assert seq == seqs[0], (r, i, next(j for j in range(len(seq))
                                                   if seq[j] != seqs[0][j]))


def first_line(cmd, preexec_fn=None):
    """The listening line of a tern serve started by cmd (then stopped)."""
    import subprocess
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         preexec_fn=preexec_fn)
    try:
        return p.stderr.readline().decode()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10 * SLOW)


SERVE = ["serve", "--host", "127.0.0.1", "--port", "0", "--admin-listen", "off",
         "--feed", "off"]


def test_default_threads_follow_the_affinity_mask():
    """Under taskset -c 0 the default is one loop, not one per CPU of the
    machine (two loops would share the one core)."""
    import os
    from conftest import TERN_BIN
    cpu = sorted(os.sched_getaffinity(0))[0]
    line = first_line(["taskset", "-c", str(cpu), TERN_BIN, *SERVE])
    assert "(1 thread," in line, line
    n = len(os.sched_getaffinity(0))
    line = first_line([TERN_BIN, *SERVE])
    assert f"({n} thread" in line, line


def test_default_threads_follow_a_cgroup_cpu_quota():
    """In a cgroup allowed half a CPU (v2 cpu.max or v1's CFS quota), the
    default is one loop. Needs a cgroup tree this user may write (root on
    a machine or container that delegates it); skipped otherwise."""
    import os
    from conftest import TERN_BIN
    made = None
    for base, files, mark in (("/sys/fs/cgroup", {"cpu.max": "50000 100000"},
                               "cgroup.controllers"),   # v2's root
                              ("/sys/fs/cgroup/cpu", {"cpu.cfs_quota_us": "50000",
                                                      "cpu.cfs_period_us": "100000"},
                               "cpu.cfs_quota_us")):    # v1's cpu controller
        if not os.path.exists(os.path.join(base, mark)):
            continue
        d = os.path.join(base, "tern-test-%d" % os.getpid())
        try:
            os.mkdir(d)
        except OSError:
            continue
        try:
            for name, value in files.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(value)
            made = d
            break
        except OSError:
            os.rmdir(d)
    if made is None:
        pytest.skip("no writable cgroup with a CPU controller here")
    try:
        def enter():
            with open(os.path.join(made, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        line = first_line([TERN_BIN, *SERVE], preexec_fn=enter)
        assert "(1 thread," in line, line
    finally:
        for _ in range(50):   # the server's exit leaves the group empty
            try:
                os.rmdir(made)
                break
            except OSError:
                time.sleep(0.1)


def hold_delays_on(srv, loops):
    """Opens /delay?ms=30000 requests, one connection at a time, keeping
    those that land on a thread in loops until each of them holds one and
    closing the others; returns the kept sockets once the other threads
    have no connection left."""
    kept, held = [], set()
    for _ in range(64):
        if held == set(loops):
            break
        before = [t["requests"] for t in stats(srv)["each"]]
        s = srv.connect(timeout=10 * SLOW)
        s.sendall(b"GET /delay?ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n")
        deadline = time.time() + 5 * SLOW
        while time.time() < deadline:
            now = [t["requests"] for t in stats(srv)["each"]]
            if now != before:
                break
            time.sleep(0.01)
        on = next(i for i in range(len(now)) if now[i] != before[i])
        if on in loops:
            kept.append(s)
            held.add(on)
        else:
            s.close()
    assert held == set(loops)
    others = [i for i in range(2) if i not in loops]
    deadline = time.time() + 5 * SLOW
    while any(stats(srv)["each"][i]["connections"] for i in others) and time.time() < deadline:
        time.sleep(0.01)
    assert not any(stats(srv)["each"][i]["connections"] for i in others)
    return kept


@pytest.mark.parametrize("loops", [(0,), (1,), (0, 1)] * 2)
def test_a_second_signal_ends_the_drain_whichever_thread_holds_the_request(tern_factory,
                                                                            loops):
    # Loop 0 reads the signals: once its own shutdown is over (nothing of
    # its own held) it must still be there for the second one, which ends
    # the drain of loop 1 at once instead of after the 10 s timeout.
    srv = tern_factory("--threads", "2", "--shutdown-timeout", "10000")
    kept = hold_delays_on(srv, set(loops))
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=8 * SLOW) == 0
    assert time.monotonic() - t0 < 1.0 * SLOW
    for s in kept:   # closed, without an answer
        assert recv_until_closed(s, timeout=2 * SLOW) == b""
        s.close()
