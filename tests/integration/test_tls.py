"""HTTPS and WSS: `tern serve --tls-cert/--tls-key` driven by curl, Python's
ssl module, `websockets` over wss and `openssl s_client`.

The certificates are made per test session with the openssl command: a
default one for localhost (and a.test), and a second one for b.test and
*.wild.test that SNI must pick."""
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import SANITIZED, SLOW, TERN_BIN, read_response, recv_until_closed, tls_library
from test_faults import wait_fds


def make_cert(d, name, cn, sans, newkey=("rsa:2048",)):
    # A server's certificate, not a CA's (openssl req -x509 makes a CA by
    # default): rustls refuses a CA certificate as a server's.
    key, cert = os.path.join(d, name + ".key"), os.path.join(d, name + ".pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", *newkey, "-nodes", "-keyout", key,
                    "-out", cert, "-days", "30", "-subj", "/CN=" + cn,
                    "-addext", "subjectAltName=" + sans,
                    "-addext", "basicConstraints=critical,CA:FALSE"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("certs"))
    return {
        "default": make_cert(d, "default", "localhost", "DNS:localhost,DNS:a.test,IP:127.0.0.1"),
        "b": make_cert(d, "b", "b.test", "DNS:b.test,DNS:*.wild.test"),
        "renewed": make_cert(d, "renewed", "renewed.test", "DNS:localhost,DNS:renewed.test"),
        "dir": d,
    }


@pytest.fixture
def tls_tern(tern_factory, certs):
    def start(*args):
        cert, key = certs["default"]
        return tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key, *args)
    return start


def client_ctx(alpn=None, max_version=None):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if max_version:
        ctx.maximum_version = max_version
    return ctx


def tls_connect(tern, name="localhost", ctx=None, session=None):
    raw = socket.create_connection((tern.host, tern.tls_port), timeout=5 * SLOW)
    return (ctx or client_ctx()).wrap_socket(raw, server_hostname=name, session=session,
                                             suppress_ragged_eofs=False)


def peer_cn(s):
    der = s.getpeercert(binary_form=True)
    out = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-subject"], input=der,
                         capture_output=True, check=True).stdout.decode()
    return out.strip().split("CN = ")[-1].split("CN=")[-1]


# ---- HTTP over TLS ----------------------------------------------------------

def test_https_requests_pipelining_bodies_and_streams(tls_tern):
    tern = tls_tern()
    s = tls_connect(tern)
    assert s.version() in ("TLSv1.2", "TLSv1.3")
    body = os.urandom(200_000)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
              b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body +
              b"GET /stream?chunks=30&size=70000 HTTP/1.1\r\nHost: x\r\n\r\n"
              b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n0\r\n\r\n")
    st, h, b, rest = read_response(s)
    assert (st, b) == (200, b"pong")
    s2 = _Prefixed(s, rest)
    st, h, b, rest = read_response(s2)
    assert st == 200 and b == body
    s2 = _Prefixed(s, rest)
    st, h, b, rest = read_response(s2)
    assert st == 200 and len(b) == 30 * 70000 and b[-1:] == bytes([ord("a") + 29 % 26])
    s2 = _Prefixed(s, rest)
    st, h, b, rest = read_response(s2)
    assert st == 200 and b.startswith(b"5 ")
    s.close()


class _Prefixed:
    """A socket whose first recv returns bytes already read."""
    def __init__(self, s, first):
        self.s, self.first = s, first

    def settimeout(self, t):
        self.s.settimeout(t)

    def recv(self, n):
        if self.first:
            b, self.first = self.first, b""
            return b
        return self.s.recv(n)


def test_curl_https_and_a_static_file_read_and_encrypted(tls_tern, tmp_path):
    blob = os.urandom(3 << 20)
    (tmp_path / "f.bin").write_bytes(blob)
    tern = tls_tern("--root", str(tmp_path))
    out = subprocess.run(["curl", "-sk", "--http1.1", f"https://127.0.0.1:{tern.tls_port}/f.bin"],
                         capture_output=True, timeout=30)
    assert out.returncode == 0 and out.stdout == blob
    out = subprocess.run(["curl", "-sk", f"https://127.0.0.1:{tern.tls_port}/ping"],
                         capture_output=True, timeout=30)
    assert out.stdout == b"pong"


def test_close_notify_sent_and_honoured(tls_tern):
    tern = tls_tern()
    fds0 = tern.open_fds()
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = b""
    while True:   # suppress_ragged_eofs=False: a TCP end without close_notify raises
        b = s.recv(4096)
        if not b:
            break
        got += b
    assert got.endswith(b"pong")
    s.close()
    # Ours: the client's close_notify ends the connection at once.
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    read_response(s)
    raw = s.unwrap()
    raw.settimeout(2 * SLOW)
    assert raw.recv(100) == b""
    raw.close()
    assert wait_fds(tern, fds0) == fds0


# ---- handshake: versions, ALPN, SNI, resumption, timeout, garbage -----------

def test_alpn_http11_and_h2_only_is_refused(tls_tern):
    # With HTTP/2 off (it is offered by default: test_h2.py).
    tern = tls_tern("--http2", "off")
    s = tls_connect(tern, ctx=client_ctx(alpn=["h2", "http/1.1"]))
    assert s.selected_alpn_protocol() == "http/1.1"
    s.close()
    with pytest.raises(ssl.SSLError) as e:
        tls_connect(tern, ctx=client_ctx(alpn=["h2"]))
    assert "NO APPLICATION PROTOCOL" in str(e.value).upper().replace("_", " ")


def test_tls_1_1_is_refused(tls_tern):
    tern = tls_tern()
    ctx = client_ctx(max_version=ssl.TLSVersion.TLSv1_1)
    ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    try:
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        tls_connect(tern, ctx=ctx)
    s = tls_connect(tern, ctx=client_ctx(max_version=ssl.TLSVersion.TLSv1_2))
    assert s.version() == "TLSv1.2"
    s.close()


# ---- protocol options: versions, ciphers, client certificates --------------

def ping(s):
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return recv_until_closed(s, timeout=5 * SLOW)


def test_min_version_1_3_refuses_tls_1_2(tls_tern):
    tern = tls_tern("--tls-min-version", "1.3")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        tls_connect(tern, ctx=client_ctx(max_version=ssl.TLSVersion.TLSv1_2))
    s = tls_connect(tern)
    assert s.version() == "TLSv1.3"
    assert ping(s).startswith(b"HTTP/1.1 200")
    s.close()


def test_default_min_version_still_serves_tls_1_2(tls_tern):
    tern = tls_tern()
    s = tls_connect(tern, ctx=client_ctx(max_version=ssl.TLSVersion.TLSv1_2))
    assert s.version() == "TLSv1.2"
    s.close()


def test_tls13_prefers_aes128_gcm_over_the_clients_order(tls_tern):
    # Python's (OpenSSL's) client offers AES-256-GCM first; the server's
    # order wins, and it starts with AES-128-GCM (bench/micro/tls_record).
    tern = tls_tern()
    s = tls_connect(tern)
    assert s.version() == "TLSv1.3"
    assert s.cipher()[0] == "TLS_AES_128_GCM_SHA256"
    s.close()


# What only OpenSSL can do: a rustls build refuses it at start, tested below.
openssl_only = pytest.mark.skipif(tls_library().startswith("rustls"),
                                  reason="an OpenSSL option: refused by a rustls build")
rustls_only = pytest.mark.skipif(not tls_library().startswith("rustls"),
                                 reason="what a rustls build refuses")


@openssl_only
def test_cipher_lists_are_taken(tls_tern):
    tern = tls_tern("--tls-ciphers", "ECDHE-RSA-CHACHA20-POLY1305",
                    "--tls-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")
    s = tls_connect(tern, ctx=client_ctx(max_version=ssl.TLSVersion.TLSv1_2))
    assert s.cipher()[0] == "ECDHE-RSA-CHACHA20-POLY1305"
    s.close()
    s = tls_connect(tern)
    assert s.cipher()[0] == "TLS_CHACHA20_POLY1305_SHA256"
    s.close()
    # A client with none of them in common is refused.
    ctx = client_ctx(max_version=ssl.TLSVersion.TLSv1_2)
    ctx.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        tls_connect(tern, ctx=ctx)


@pytest.fixture(scope="session")
def client_certs(certs):
    d = certs["dir"]
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=d)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", "-days", "30", "-subj", "/CN=test client CA")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "alice.key",
        "-out", "alice.csr", "-subj", "/O=Example/CN=alice")
    # X.509 v3 (an extension makes it so): rustls refuses v1 certificates.
    with open(os.path.join(d, "alice.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\n")
    run("openssl", "x509", "-req", "-in", "alice.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "alice.pem", "-days", "30", "-extfile", "alice.ext")
    # One the CA never signed.
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "mallory.key",
        "-out", "mallory.pem", "-days", "30", "-subj", "/CN=mallory")
    j = lambda n: os.path.join(d, n)
    return {"ca": j("ca.pem"), "alice": (j("alice.pem"), j("alice.key")),
            "mallory": (j("mallory.pem"), j("mallory.key"))}


def with_client_cert(pair, max_version=None):
    ctx = client_ctx(max_version=max_version)
    if pair:
        ctx.load_cert_chain(*pair)
    return ctx


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_required_client_certificate(tls_tern, client_certs, version):
    tern = tls_tern("--tls-client-ca", client_certs["ca"], "--tls-client-verify", "require")
    s = tls_connect(tern, ctx=with_client_cert(client_certs["alice"], version))
    assert ping(s).startswith(b"HTTP/1.1 200")
    s.close()
    for pair in (None, client_certs["mallory"]):
        # TLS 1.2 fails in the handshake; TLS 1.3 clients finish theirs
        # first and learn it at the first read.
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            s = tls_connect(tern, ctx=with_client_cert(pair, version))
            got = ping(s)
            assert not got.startswith(b"HTTP/1.1 200"), got
            raise ssl.SSLError("refused after the handshake")


@openssl_only
def test_optional_client_certificate_lets_everyone_in(tls_tern, client_certs):
    tern = tls_tern("--tls-client-ca", client_certs["ca"], "--tls-client-verify", "optional")
    for pair in (None, client_certs["alice"], client_certs["mallory"]):
        s = tls_connect(tern, ctx=with_client_cert(pair))
        assert ping(s).startswith(b"HTTP/1.1 200")
        s.close()


@pytest.mark.parametrize("args,why", [
    (["--tls-client-verify", "require"], "go together"),
    (["--tls-client-ca", "CA"], "go together"),
    (["--tls-client-verify", "sometimes", "--tls-client-ca", "CA"], ""),
    (["--tls-min-version", "1.1"], ""),
])
def test_bad_tls_option_combinations(certs, client_certs, args, why):
    cert, key = certs["default"]
    args = [client_certs["ca"] if a == "CA" else a for a in args]
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--tls-port", "0", "--tls-cert", cert,
                        "--tls-key", key, *args], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert why in r.stderr


def test_tls_options_need_a_certificate():
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--tls-min-version", "1.3"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "need --tls-cert" in r.stderr, r.stderr


def test_sni_picks_the_certificate(tern_factory, certs):
    (c1, k1), (c2, k2) = certs["default"], certs["b"]
    tern = tern_factory("--tls-port", "0", "--tls-cert", c1, "--tls-key", k1,
                        "--tls-cert", c2, "--tls-key", k2)
    for name, cn in (("localhost", "localhost"), ("b.test", "b.test"),
                     ("x.wild.test", "b.test"), ("B.TEST", "b.test"),
                     ("unknown.example", "localhost"), ("a.b.wild.test", "localhost")):
        s = tls_connect(tern, name=name)
        assert peer_cn(s) == cn, name
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[2] == b"pong"
        s.close()


# Each kind of key a certificate comes with, in each PEM form key tools
# write: PKCS#8 ("PRIVATE KEY", openssl req's), PKCS#1 ("RSA PRIVATE
# KEY") and SEC1 ("EC PRIVATE KEY"), the traditional forms older tools and
# some ACME clients write. (The rustls build loads keys with AWS-LC's
# provider and signs with it: every kind must load and sign.)
KEY_KINDS = {
    "rsa-pkcs8": (("rsa:2048",), None, "PRIVATE KEY"),
    "rsa-pkcs1": (("rsa:2048",), ["rsa", "-traditional"], "RSA PRIVATE KEY"),
    "p256-sec1": (("ec", "-pkeyopt", "ec_paramgen_curve:P-256"), ["ec"], "EC PRIVATE KEY"),
    "p384-pkcs8": (("ec", "-pkeyopt", "ec_paramgen_curve:P-384"), None, "PRIVATE KEY"),
    "ed25519": (("ed25519",), None, "PRIVATE KEY"),
}


@pytest.mark.parametrize("kind", sorted(KEY_KINDS))
def test_every_kind_of_key_serves_tls_1_2_and_1_3(tern_factory, tmp_path, kind):
    newkey, convert, header = KEY_KINDS[kind]
    cert, key = make_cert(str(tmp_path), kind, "k.test", "DNS:localhost", newkey)
    if convert:
        subprocess.run(["openssl", *convert, "-in", key, "-out", key], check=True,
                       capture_output=True)
    with open(key) as f:
        assert f.read().startswith(f"-----BEGIN {header}-----")
    tern = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key)
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        s = tls_connect(tern, ctx=client_ctx(max_version=version))
        assert s.version() == version.name.replace("v1_", "v1.")
        assert peer_cn(s) == "k.test"
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_response(s)[2] == b"pong"
        s.close()


def test_sessions_are_resumed(tls_tern):
    tern = tls_tern()
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        ctx = client_ctx(max_version=version)
        s = tls_connect(tern, ctx=ctx)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        read_response(s)   # TLS 1.3 tickets come after the handshake: read first
        session = s.session
        s.close()
        s = tls_connect(tern, ctx=ctx, session=session)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[2] == b"pong"
        assert s.session_reused, version
        s.close()


def test_silent_or_stalled_handshake_is_cut(tls_tern):
    tern = tls_tern("--head-timeout", "500")
    fds0 = tern.open_fds()
    silent = socket.create_connection((tern.host, tern.tls_port))
    partial = socket.create_connection((tern.host, tern.tls_port))
    partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")   # a ClientHello's start
    t0 = time.monotonic()
    assert recv_until_closed(silent, 5 * SLOW) == b""
    recv_until_closed(partial, 5 * SLOW)   # closed (an alert at most)
    assert time.monotonic() - t0 < 3 * SLOW
    silent.close()
    partial.close()
    assert wait_fds(tern, fds0) == fds0


def test_plain_http_on_the_tls_port_is_closed_quickly(tls_tern):
    tern = tls_tern()
    fds0 = tern.open_fds()
    for junk in (b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(3000)):
        s = socket.create_connection((tern.host, tern.tls_port))
        s.sendall(junk)
        t0 = time.monotonic()
        recv_until_closed(s, 5 * SLOW)   # a 400 or an alert at most, then the end
        assert time.monotonic() - t0 < 1 * SLOW
        s.close()
    assert wait_fds(tern, fds0) == fds0


def test_plain_http_on_the_tls_port_gets_a_400_saying_so(tls_tern):
    tern = tls_tern()
    fds0 = tern.open_fds()
    for req in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
                b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
                b"DELETE /x HTTP/1.1\r\nHost: x\r\n\r\n",
                b"PATCH /x HTTP/1.1\r\nHost: x\r\n\r\n"):
        s = socket.create_connection((tern.host, tern.tls_port))
        s.sendall(req)
        st, h, body, rest = read_response(s, 5 * SLOW)
        assert st == 400, req
        assert b"The plain HTTP request was sent to HTTPS port" in body, body
        assert h.get("connection") == "close"
        assert recv_until_closed(s, 5 * SLOW) == b""   # then closed
        s.close()
    assert wait_fds(tern, fds0) == fds0
    # The port still speaks TLS.
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[2] == b"pong"


def test_failed_handshakes_are_logged_at_debug(tls_tern):
    tern = tls_tern("--log-level", "debug")
    junk = socket.create_connection((tern.host, tern.tls_port))
    junk_port = junk.getsockname()[1]
    junk.sendall(b"\x00\x01garbage, not a TLS record" + os.urandom(100))
    recv_until_closed(junk, 5 * SLOW)
    junk.close()
    # A handshake record whose ClientHello is cut short.
    old = socket.create_connection((tern.host, tern.tls_port))
    old_port = old.getsockname()[1]
    old.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00")   # a ClientHello far too short
    recv_until_closed(old, 5 * SLOW)
    old.close()
    plain = socket.create_connection((tern.host, tern.tls_port))
    plain_port = plain.getsockname()[1]
    plain.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    recv_until_closed(plain, 5 * SLOW)
    plain.close()
    time.sleep(0.2 * SLOW)
    assert tern.stop() == 0
    lines = tern.stderr.splitlines()
    mine = [l for l in lines if f"127.0.0.1:{junk_port}" in l]
    assert len(mine) == 1, tern.stderr                      # once
    # The library's own words: OpenSSL's, or rustls's.
    why = "corrupt message" if tls_library().startswith("rustls") else "wrong version number"
    assert "[debug]" in mine[0] and "handshake" in mine[0] and why in mine[0], mine
    mine = [l for l in lines if f"127.0.0.1:{old_port}" in l]
    assert len(mine) == 1 and "handshake" in mine[0], tern.stderr
    mine = [l for l in lines if f"127.0.0.1:{plain_port}" in l]
    assert len(mine) == 1 and "plain HTTP" in mine[0], tern.stderr


def test_failed_handshakes_are_not_logged_above_debug(tls_tern):
    tern = tls_tern()
    junk = socket.create_connection((tern.host, tern.tls_port))
    junk.sendall(b"\x00\x01garbage")
    recv_until_closed(junk, 5 * SLOW)
    junk.close()
    assert tern.stop() == 0
    assert "handshake" not in tern.stderr, tern.stderr


def test_renegotiation_is_refused(tls_tern):
    tern = tls_tern()
    # s_client renegotiates when it reads a line "R"; tern must refuse.
    p = subprocess.Popen(["openssl", "s_client", "-connect", f"127.0.0.1:{tern.tls_port}",
                          "-tls1_2", "-servername", "localhost"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.5 * SLOW)
    try:
        out, _ = p.communicate(b"R\n", timeout=5 * SLOW)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    text = out.decode(errors="replace")
    assert "RENEGOTIATING" in text
    assert "no renegotiation" in text.lower() or "alert" in text.lower() or p.returncode != 0
    # The server is fine afterwards.
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[2] == b"pong"


def test_sighup_reloads_certificates_without_dropping_connections(tern_factory, certs, tmp_path):
    cert, key = str(tmp_path / "c.pem"), str(tmp_path / "c.key")
    shutil.copy(certs["default"][0], cert)
    shutil.copy(certs["default"][1], key)
    tern = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key)
    old = tls_connect(tern)
    assert peer_cn(old) == "localhost"
    shutil.copy(certs["renewed"][0], cert)
    shutil.copy(certs["renewed"][1], key)
    tern.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5 * SLOW
    while True:
        s = tls_connect(tern)
        cn = peer_cn(s)
        s.close()
        if cn == "renewed.test" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert cn == "renewed.test"
    old.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")   # the old one is still served
    assert read_response(old)[2] == b"pong"
    # A broken renewal keeps the certificates that work.
    with open(key, "w") as f:
        f.write("not a key")
    tern.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3 * SLOW)
    s = tls_connect(tern)
    assert peer_cn(s) == "renewed.test"


def test_reloads_in_a_row_while_handshakes_run(tern_factory, certs):
    """SIGHUP after SIGHUP while clients handshake on every loop: each
    handshake gets a whole certificate, none fails, and the server lives
    (rustls: the set a handshake chose outlives the reloads that replace
    it, tests/unit/test_tls_retire.c; OpenSSL: SSL_CTX references)."""
    cert, key = certs["default"]
    tern = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key,
                        "--threads", "2")
    done, errors = [], []
    stop = threading.Event()

    def handshakes():
        while not stop.is_set():
            try:
                s = tls_connect(tern)
                s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert read_response(s)[2] == b"pong"
                s.close()
                done.append(1)
            except Exception as e:   # noqa: BLE001 (reported below, all of them)
                errors.append(repr(e))

    # Counted, not timed: a loaded machine (two runs side by side, ASan)
    # gets through fewer handshakes a second, so the storm lasts until 30
    # handshakes have overlapped at least 100 reloads.
    clients = [threading.Thread(target=handshakes) for _ in range(3)]
    for t in clients:
        t.start()
    reloads = 0
    deadline = time.monotonic() + 30 * SLOW
    while (len(done) < 30 or reloads < 100) and not errors and time.monotonic() < deadline:
        tern.proc.send_signal(signal.SIGHUP)
        reloads += 1
        time.sleep(0.002)
    stop.set()
    for t in clients:
        t.join()
    assert errors == []
    assert len(done) >= 30 and reloads >= 100, (len(done), reloads)
    assert tern.proc.poll() is None
    s = tls_connect(tern)
    assert peer_cn(s) == "localhost"


# ---- encrypted private keys (issue #25) -----------------------------------

@pytest.fixture(scope="session")
def encrypted_key(certs):
    """The default certificate's key encrypted with the passphrase "secret"."""
    d = certs["dir"]
    key = os.path.join(d, "encrypted.key")
    subprocess.run(["openssl", "pkey", "-in", certs["default"][1], "-out", key, "-aes256",
                    "-passout", "pass:secret"], check=True, capture_output=True)
    with open(key) as f:
        assert "ENCRYPTED" in f.read()
    return certs["default"][0], key


def serve_on_a_terminal(*args, timeout=5.0):
    """Runs `tern serve ARGS` on a pseudo-terminal of its own (its stdin and
    controlling terminal, which OpenSSL's prompt would read): returns
    (exit code or None when it did not exit, stderr, what reached the
    terminal). A prompt would block it, so a timeout means it asked."""
    import fcntl
    import pty
    import termios
    master, slave = pty.openpty()

    def on_the_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    from conftest import TERN_BIN
    p = subprocess.Popen([TERN_BIN, "serve", "--host", "127.0.0.1", "--port", "0",
                          "--threads", "1", "--admin-listen", "off", *args], stdin=slave, stdout=slave,
                         stderr=subprocess.PIPE, preexec_fn=on_the_terminal)
    os.close(slave)
    try:
        _, err = p.communicate(timeout=timeout * SLOW)
        code = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        code = None
    tty = b""
    while True:
        try:
            import select
            if not select.select([master], [], [], 0)[0]:
                break
            b = os.read(master, 4096)
        except OSError:
            break
        if not b:
            break
        tty += b
    os.close(master)
    return code, err.decode(errors="replace"), tty.decode(errors="replace")


@openssl_only
def test_encrypted_key_without_passphrase_fails_fast_and_never_prompts(encrypted_key):
    cert, key = encrypted_key
    t0 = time.monotonic()
    code, err, tty = serve_on_a_terminal("--tls-port", "0", "--tls-cert", cert, "--tls-key", key)
    assert code == 1, (code, err, tty)
    assert time.monotonic() - t0 < 3 * SLOW
    assert "pass phrase" not in tty.lower() and "passphrase" not in tty.lower(), tty
    assert f"the key in {key} is encrypted: give its passphrase" in err, err
    assert "--tls-key-passphrase-file" in err, err
    assert "UI routines" not in err, err


@openssl_only
def test_encrypted_key_with_a_wrong_passphrase_fails_clearly(encrypted_key, tmp_path):
    cert, key = encrypted_key
    pw = tmp_path / "pass"
    pw.write_text("not the secret\n")
    code, err, tty = serve_on_a_terminal("--tls-port", "0", "--tls-cert", cert, "--tls-key", key,
                                         "--tls-key-passphrase-file", str(pw))
    assert code == 1, (code, err, tty)
    assert "wrong passphrase" in err, err
    assert "pass phrase" not in tty.lower(), tty
    missing = str(tmp_path / "missing")
    code, err, tty = serve_on_a_terminal("--tls-port", "0", "--tls-cert", cert, "--tls-key", key,
                                         "--tls-key-passphrase-file", missing)
    assert code == 1 and missing in err, (code, err)


@openssl_only
def test_encrypted_key_with_its_passphrase_file_serves_and_reloads(tern_factory, encrypted_key,
                                                                   tmp_path):
    cert, key = encrypted_key
    pw = tmp_path / "pass"
    pw.write_text("secret\n")
    tern = tern_factory("--tls-port", "0", "--tls-cert", cert, "--tls-key", key,
                        "--tls-key-passphrase-file", str(pw))
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[2] == b"pong"
    s.close()
    # SIGHUP loads the key again with the file's passphrase, never a prompt;
    # a passphrase changed to a wrong one keeps the certificates in use.
    tern.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3 * SLOW)
    pw.write_text("wrong\n")
    tern.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3 * SLOW)
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[2] == b"pong"
    s.close()
    assert tern.stop() == 0
    assert "SIGHUP, certificates reloaded" in tern.stderr, tern.stderr
    assert "wrong passphrase" in tern.stderr, tern.stderr


# ---- WebSocket over TLS -----------------------------------------------------

def test_wss_echo_with_compression_and_backpressure(tls_tern):
    # The asyncio client, not the threaded one: websockets' sync client reads
    # in a background thread while the caller writes, and Python's SSL socket
    # lets SSL_read and SSL_write run at once on one OpenSSL session, which
    # OpenSSL forbids (a write racing the server's session tickets can be
    # lost). One thread keeps the client's TLS sound.
    import asyncio
    from websockets.asyncio.client import connect
    tern = tls_tern()
    url = f"wss://localhost:{tern.tls_port}/ws"

    async def session():
        async with connect(url, ssl=client_ctx(), compression="deflate", max_size=None,
                           open_timeout=10 * SLOW) as ws:
            assert "permessage-deflate" in ws.response.headers.get("Sec-WebSocket-Extensions", "")
            for size in (0, 10, 125, 126, 65535, 65536, 1 << 20):
                msg = os.urandom(size)
                await ws.send(msg)
                assert await asyncio.wait_for(ws.recv(), 10 * SLOW) == msg
            await ws.send("héllo" * 1000)
            assert await asyncio.wait_for(ws.recv(), 5 * SLOW) == "héllo" * 1000
            # Many messages before reading any: the echo backlog and the pause
            # policy work the same under TLS.
            for i in range(200):
                await ws.send(b"%d" % i + b"x" * 20000)
            for i in range(200):
                got = await asyncio.wait_for(ws.recv(), 10 * SLOW)
                assert got.startswith(b"%d" % i)

    asyncio.run(session())


def test_graceful_shutdown_with_tls_connections(tls_tern):
    tern = tls_tern()
    s = tls_connect(tern)
    s.sendall(b"GET /delay?ms=300 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    tern.proc.send_signal(signal.SIGTERM)
    st, h, b, rest = read_response(s, timeout=5 * SLOW)
    assert (st, b) == (200, b"done\n")
    assert tern.proc.wait(timeout=5 * SLOW) == 0


def test_idle_tls_connections_are_small(tls_tern):
    tern = tls_tern()
    ctx = client_ctx()
    socks = []
    for _ in range(50):   # warm up
        s = tls_connect(tern, ctx=ctx)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        read_response(s)
        socks.append(s)
    rss0 = tern.rss_kib()
    n = 1000
    for _ in range(n):
        s = tls_connect(tern, ctx=ctx)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        read_response(s)
        socks.append(s)
    per = (tern.rss_kib() - rss0) * 1024 / n
    print(f"RSS per idle TLS connection: {per:.0f} bytes")
    if not SANITIZED:
        assert per < 24 * 1024
    for s in socks:
        s.close()


# ---- faults over TLS ----------------------------------------------------------

def rst(s):
    import struct
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_tls_resets_at_every_stage(tls_tern):
    tern = tls_tern()
    fds0 = tern.open_fds()
    for _ in range(20):
        raw = socket.create_connection((tern.host, tern.tls_port))
        raw.sendall(b"\x16\x03\x01\x00")          # mid-handshake
        rst(raw)
        s = tls_connect(tern)
        s.sendall(b"GET /ping HTTP/1.1\r\nHo")  # mid-head
        rst(s)
        s = tls_connect(tern)
        s.sendall(b"GET /echo?size=10000000 HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(100)
        rst(s)                                   # mid-response
    assert wait_fds(tern, fds0) == fds0
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[2] == b"pong"


def test_tls_half_closed_client_still_gets_its_answers(tls_tern):
    tern = tls_tern()
    s = tls_connect(tern)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?size=300000 HTTP/1.1\r\nHost: x\r\n\r\n")
    # A TCP half-close under TLS (no close_notify): taken as the end of the
    # client's stream, as on plain TCP; what it asked for still comes.
    socket.socket.shutdown(s, socket.SHUT_WR)
    st, h, b, rest = read_response(s)
    assert b == b"pong"
    st, h, b, rest = read_response(_Prefixed(s, rest))
    assert len(b) == 300000


def test_tls_slowloris_and_non_reader_are_cut(tls_tern):
    tern = tls_tern("--head-timeout", "500", "--send-timeout", "500")
    fds0 = tern.open_fds()
    slow = tls_connect(tern)
    slow.sendall(b"GET /ping HTTP/1.1\r\n")
    for _ in range(5):
        slow.sendall(b"X")
        time.sleep(0.1)
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect((tern.host, tern.tls_port))
    never = client_ctx().wrap_socket(raw, server_hostname="localhost")
    never.sendall(b"GET /echo?size=20000000 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    assert wait_fds(tern, fds0, timeout=4) == fds0
    slow.close()
    never.close()


def test_tls_steady_slow_reader_is_not_cut_by_the_send_clock(tls_tern):
    # A reader slower than the kernel frees room, over TLS: its progress is
    # seen through the TLS transport's unsent op (the lower transport's
    # bytes: on io_uring, the send in flight) and the socket's queue, so
    # the 1 s send clock must not cut it, on either back end. At 1 MB/s
    # the kernel takes nothing for over a second at a time (a third of a
    # 4 MB send buffer); 1 s is long against a busy machine's stalls of
    # this reader (a few hundred ms under two CPU burners).
    tern = tls_tern("--send-timeout", "1000", "--log-level", "info")
    s = tls_connect(tern)
    s.sendall(b"GET /echo?size=6000000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = bytearray()
    while b"\r\n\r\n" not in got:
        got += s.recv(65536)
    head, _, got = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    got = bytearray(got)
    deadline = time.monotonic() + 60 * SLOW
    while len(got) < 6_000_000 and time.monotonic() < deadline:
        b = s.recv(32768)
        if not b:
            break
        got += b
        time.sleep(0.03)
    s.close()
    assert len(got) == 6_000_000
    assert tern.stop() == 0
    assert "send timeout" not in tern.stderr


def test_tls_sigterm_under_load_loses_no_accepted_request(tls_tern):
    import threading
    tern = tls_tern()
    results = []

    sent = []

    def client(i):
        try:
            s = tls_connect(tern)
            s.sendall(b"GET /delay?ms=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (100 + i % 200))
            sent.append(i)
            st, h, b, rest = read_response(s, timeout=10 * SLOW)
            results.append((st, b))
        except Exception as e:   # noqa: BLE001 - recorded, asserted below
            results.append(("error", repr(e)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    # the signal while requests are in flight: some sent (the handshakes of
    # 40 Python threads take a while on a busy machine), others not yet
    deadline = time.time() + 10 * SLOW
    while len(sent) < 10 and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    tern.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    answered = [r for r in results if r == (200, b"done\n")]
    refused = [r for r in results if r[0] == "error"]
    # Every request the server accepted before the signal is answered; one
    # that came after the listeners closed is refused at connect, never cut.
    assert len(answered) + len(refused) == 40, results
    assert answered, results
    for r in refused:
        assert "Refused" in r[1] or "reset" in r[1].lower() or "EOF" in r[1], r
    assert tern.proc.wait(timeout=10 * SLOW) == 0


@rustls_only
@pytest.mark.parametrize("args,why", [
    (["--tls-ciphers", "ECDHE-RSA-CHACHA20-POLY1305"], "cipher lists are OpenSSL's syntax"),
    (["--tls-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"], "cipher lists are OpenSSL's syntax"),
    (["--tls-client-ca", "CA", "--tls-client-verify", "optional"], "optional client certificates"),
    (["--tls-key-passphrase-file", "PASS"], "cannot read encrypted keys"),
])
def test_rustls_build_refuses_what_only_openssl_does(certs, client_certs, tmp_path, args, why):
    cert, key = certs["default"]
    (tmp_path / "pass").write_text("secret\n")
    args = [client_certs["ca"] if a == "CA" else str(tmp_path / "pass") if a == "PASS" else a
            for a in args]
    r = subprocess.run([TERN_BIN, "serve", "--port", "0", "--tls-port", "0", "--tls-cert", cert,
                        "--tls-key", key, *args], capture_output=True, text=True, timeout=10 * SLOW)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert why in r.stderr and "TERN_TLS=openssl" in r.stderr, r.stderr


@rustls_only
def test_rustls_build_refuses_an_encrypted_key_clearly(encrypted_key):
    cert, key = encrypted_key
    code, err, tty = serve_on_a_terminal("--tls-port", "0", "--tls-cert", cert, "--tls-key", key)
    assert code == 1, (code, err, tty)
    assert f"the key in {key} is encrypted, which this build's TLS library (rustls)" in err, err
    assert "pass phrase" not in tty.lower(), tty
