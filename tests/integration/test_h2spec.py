"""HTTP/2 conformance: h2spec (github.com/summerwind/h2spec, built by
scripts/install-h2spec.sh into build/tools) against `tern serve`'s TLS port
(h2 by ALPN) and its plain port with --http2 h2c, strict cases included
(-S; in h2spec 2.2.1 one: http2 5.4.1/2, "Sends an invalid PING frame to
receive GOAWAY frame"). Every case passes over TLS; on the h2c port all
but one, named in KNOWN: an invalid preface on a plain port that also
serves HTTP/1.1 is an HTTP/1.1 request (answered 400), where h2spec wants
the connection closed unanswered; without ALPN the port cannot tell an
h2 client's garbage from an HTTP/1.1 client's. The path is / (the live page), a body big enough for every
case (/ping's 4 bytes leave http2 6.9.2/2 skipped)."""
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conftest import SLOW
from test_h2 import cert, h2_tern   # noqa: F401 (fixtures)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
H2SPEC = os.path.join(ROOT, "build", "tools", "h2spec")


@pytest.fixture(scope="module")
def h2spec():
    if not os.access(H2SPEC, os.X_OK):
        r = subprocess.run([os.path.join(ROOT, "scripts", "install-h2spec.sh")],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip("h2spec could not be built (Go module proxy?): " + r.stderr[-500:])
    return H2SPEC


KNOWN = {False: {"http2/3.5 Sends invalid connection preface"}, True: set()}


def run_h2spec(h2spec, port, tls, report):
    """h2spec's failed cases, by the JUnit report (and its exit status)."""
    args = [h2spec, "-h", "127.0.0.1", "-p", str(port), "-P", "/",
            "-S", "-o", str(int(3 * SLOW)), "-j", report]
    if tls:
        args += ["-t", "-k"]
    r = subprocess.run(args, capture_output=True, text=True, check=False, timeout=600)
    failed = []
    for case in ET.parse(report).getroot().iter("testcase"):
        if any(case.find(x) is not None for x in ("failure", "error", "skipped")):
            failed.append(f"{case.get('package')} {case.get('classname')}")
    ran = sum(1 for _ in ET.parse(report).getroot().iter("testcase"))
    return r, failed, ran


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "h2c"])
def test_h2spec_every_case_passes(h2spec, h2_tern, tls, tmp_path):  # noqa: F811
    tern = h2_tern("--http2", "h2c")
    port = tern.tls_port if tls else tern.port
    r, failed, ran = run_h2spec(h2spec, port, tls, str(tmp_path / "h2spec.xml"))
    assert ran == 146, r.stdout[-2000:]
    assert set(failed) <= KNOWN[tls], "\n".join(failed) + "\n" + r.stdout[-4000:]
