"""Virtual hosts: tern serve --vhost NAME=ROOT routes by the Host header
(case-insensitive, port stripped); unknown names and requests without a
Host get the default host's routes."""
import pytest

from conftest import SLOW, read_response


@pytest.fixture
def roots(tmp_path):
    out = {}
    for name in ("a", "b", "default"):
        d = tmp_path / name
        d.mkdir()
        (d / "index.html").write_text(f"site {name}\n")
        (d / f"only-{name}.txt").write_text(f"{name} only\n")
        out[name] = str(d)
    return out


@pytest.fixture
def vsrv(tern_factory, roots):
    return tern_factory("--root", roots["default"], "--vhost", f"a.test={roots['a']}",
                        "--vhost", f"B.Test={roots['b']}")


def ask(srv, raw):
    s = srv.connect()
    try:
        s.sendall(raw)
        return read_response(s, timeout=5 * SLOW)[:3]
    finally:
        s.close()


def get(srv, path, host):
    return ask(srv, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())


def test_two_hosts_have_their_own_roots(vsrv):
    assert get(vsrv, "/", "a.test")[::2] == (200, b"site a\n")
    assert get(vsrv, "/", "b.test")[::2] == (200, b"site b\n")
    assert get(vsrv, "/only-a.txt", "a.test")[::2] == (200, b"a only\n")
    # A host's paths are its own: no falling back to another's files...
    assert get(vsrv, "/only-a.txt", "b.test")[0] == 404
    assert get(vsrv, "/only-default.txt", "a.test")[0] == 404
    # ...nor to the default host's routes.
    assert get(vsrv, "/ping", "a.test")[0] == 404
    assert get(vsrv, "/ping", "localhost")[::2] == (200, b"pong")


def test_names_match_without_case_port_or_final_dot(vsrv):
    assert get(vsrv, "/", "A.TEST")[::2] == (200, b"site a\n")
    assert get(vsrv, "/", "a.test:8080")[::2] == (200, b"site a\n")
    assert get(vsrv, "/", "a.test.")[::2] == (200, b"site a\n")
    assert get(vsrv, "/", "b.test:1")[::2] == (200, b"site b\n")


def test_unknown_host_gets_the_default(vsrv):
    assert get(vsrv, "/", "c.test")[::2] == (200, b"site default\n")
    assert get(vsrv, "/", "a.test.evil")[::2] == (200, b"site default\n")
    assert get(vsrv, "/", f"127.0.0.1:{vsrv.port}")[::2] == (200, b"site default\n")
    assert get(vsrv, "/", "[::1]:80")[::2] == (200, b"site default\n")


def test_http10_without_host_gets_the_default(vsrv):
    status, _, body = ask(vsrv, b"GET / HTTP/1.0\r\n\r\n")
    assert (status, body) == (200, b"site default\n")
    status, _, body = ask(vsrv, b"GET /ping HTTP/1.0\r\n\r\n")
    assert (status, body) == (200, b"pong")


def test_websocket_routes_are_the_default_hosts(vsrv):
    req = (b"GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert ask(vsrv, req % b"localhost")[0] == 101
    assert ask(vsrv, req % b"a.test")[0] == 404


def test_vhosts_with_threads(tern_factory, roots):
    srv = tern_factory("--threads", "2", "--vhost", f"a.test={roots['a']}")
    for _ in range(20):
        assert get(srv, "/", "a.test")[::2] == (200, b"site a\n")
        assert get(srv, "/ping", "other")[::2] == (200, b"pong")


def test_bad_vhost_arguments(tmp_path):
    import subprocess
    from conftest import TERN_BIN
    for bad in ("noequals", f"bad name={tmp_path}", f"x.test={tmp_path}/missing", f"={tmp_path}"):
        r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--threads", "1", "--vhost", bad],
                           capture_output=True, timeout=10)
        assert r.returncode in (1, 2), (bad, r.stderr)


def test_tls_sni_and_host_pick_the_site(tern_factory, roots, tmp_path):
    # Over TLS the certificate is chosen by SNI and the site by Host; a
    # request without Host (HTTP/1.0) goes by the SNI name.
    import socket
    import ssl
    from test_tls import make_cert
    ca, ka = make_cert(str(tmp_path), "a", "a.test", "DNS:a.test")
    cb, kb = make_cert(str(tmp_path), "b", "b.test", "DNS:b.test")
    srv = tern_factory("--root", roots["default"], "--vhost", f"a.test={roots['a']}",
                       "--vhost", f"b.test={roots['b']}", "--tls-port", "0",
                       "--tls-cert", ca, "--tls-key", ka, "--tls-cert", cb, "--tls-key", kb)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def tls_ask(sni, raw):
        s = ctx.wrap_socket(socket.create_connection((srv.host, srv.tls_port)), server_hostname=sni)
        try:
            s.sendall(raw)
            return read_response(s, timeout=5 * SLOW)[::2]
        finally:
            s.close()

    assert tls_ask("b.test", b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n") == (200, b"site b\n")
    assert tls_ask("b.test", b"GET / HTTP/1.0\r\n\r\n") == (200, b"site b\n")
    assert tls_ask("a.test", b"GET / HTTP/1.0\r\n\r\n") == (200, b"site a\n")
    assert tls_ask("other.test", b"GET / HTTP/1.0\r\n\r\n") == (200, b"site default\n")
