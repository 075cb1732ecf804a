import os, sys, zlib
from test_h2_ws import *
def test_seq(h2_tern):
    tern = h2_tern()
    c = H2TLS(tern)
    sid, h = c.open_ws("/ws", extra=[("sec-websocket-extensions", "permessage-deflate; client_max_window_bits")])
    co = zlib.compressobj(wbits=-15)
    msgs = [b"h\xc3\xa9llo", b"", os.urandom(65000)*2, bytes(range(256)), os.urandom(70000), b""]
    data = b""
    for m in msgs:
        body = co.compress(m) + co.flush(zlib.Z_SYNC_FLUSH)
        data += frame(2, body[:-4], rsv1=True)
    c.send_ws(sid, data)
    got = c.messages(sid, 6, "echoes")
    print([len(g[2]) for g in got])
