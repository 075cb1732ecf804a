#!/usr/bin/env node
// Drives a tern /ws echo endpoint with the `ws` package and prints one JSON
// object on stdout. Run by tests/integration/test_ws_clients.py:
//
//   node client.js ws://127.0.0.1:PORT/ws
//
// It checks what a ws user relies on: permessage-deflate is agreed, every
// message comes back byte for byte with its own type (text or binary) at
// the frame-length boundaries (0, 125, 126, 65535, 65536 bytes, 1 MiB),
// a ping gets its pong with the same payload, and a close with 4000 gets
// 4000 back. It does so twice: with permessage-deflate and without it.
// The JSON carries the facts; the Python test asserts on them.
// Any failure still prints JSON (with "error") and exits 1.
'use strict';

const crypto = require('crypto');
const WebSocket = require('ws');

const url = process.argv[2];
const TIMEOUT_MS = Number(process.env.CLIENT_TIMEOUT_MS || 30000);
const SIZES = [0, 125, 126, 65535, 65536, 1 << 20];

const result = {
  client: `ws ${require('ws/package.json').version}`,
  node: process.version,
  deflate: null,
  plain: null,
  error: null,
};

function finish(code) {
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(code));
}

if (!url) {
  result.error = 'usage: client.js WS_URL';
  finish(2);
}

const timer = setTimeout(() => {
  result.error = `timed out after ${TIMEOUT_MS} ms`;
  finish(1);
}, TIMEOUT_MS);

// Text: compressible, non-ASCII included, cut to an exact byte length on a
// character boundary (every character used here is 1 or 3 bytes; padding
// with ASCII makes up the difference).
function textOf(bytes) {
  const unit = 'tern ✓ echo ';   // 14 bytes in UTF-8
  let s = unit.repeat(Math.floor(bytes / Buffer.byteLength(unit)));
  s += 'x'.repeat(bytes - Buffer.byteLength(s));
  return s;
}

function binaryOf(bytes) {
  return crypto.randomBytes(bytes);   // incompressible
}

// One connection: every size both ways, a ping, and the closing handshake.
async function session(deflate) {
  const out = { deflate, extensions: null, messages: [], ping: null, close: null };
  const ws = new WebSocket(url, {
    // threshold 0: the client compresses every message, even the empty one,
    // so the server's inflater sees each size too.
    perMessageDeflate: deflate ? { threshold: 0 } : false,
    maxPayload: 4 << 20,
    rejectUnauthorized: false,   // wss:// to a test server's self-signed certificate
  });

  // One receive queue: each awaiter takes the next event in order.
  const inbox = [];
  const waiters = [];
  const push = (ev) => { const w = waiters.shift(); if (w) w(ev); else inbox.push(ev); };
  const next = () => inbox.length ? Promise.resolve(inbox.shift())
                                  : new Promise((resolve) => waiters.push(resolve));
  ws.on('open', () => push({ kind: 'open' }));
  ws.on('message', (data, isBinary) => push({ kind: 'message', data, isBinary }));
  ws.on('pong', (data) => push({ kind: 'pong', data }));
  ws.on('close', (code, reason) => push({ kind: 'close', code, reason: reason.toString() }));
  ws.on('error', (err) => push({ kind: 'error', message: String(err && err.message || err) }));
  const expect = async (kind) => {
    const ev = await next();
    if (ev.kind !== kind)
      throw new Error(`${deflate ? 'deflate' : 'plain'}: expected ${kind}, got ${JSON.stringify(
        ev.kind === 'message' ? { kind: ev.kind, len: ev.data.length } : ev)}`);
    return ev;
  };

  await expect('open');
  out.extensions = ws.extensions;

  for (const type of ['text', 'binary']) {
    for (const size of SIZES) {
      const payload = type === 'text' ? textOf(size) : binaryOf(size);
      const want = type === 'text' ? Buffer.from(payload, 'utf8') : payload;
      // Wire byte counts show whether and how the frames were encoded.
      const sock = ws._socket;
      const read0 = sock.bytesRead, written0 = sock.bytesWritten;
      ws.send(payload, { binary: type === 'binary', compress: deflate });
      const ev = await expect('message');
      const got = Buffer.isBuffer(ev.data) ? ev.data : Buffer.concat(ev.data);
      out.messages.push({
        type,
        size,
        got_type: ev.isBinary ? 'binary' : 'text',
        got_size: got.length,
        equal: got.equals(want),
        wire_in: sock.bytesRead - read0,
        wire_out: sock.bytesWritten - written0,
      });
    }
  }

  const pingData = Buffer.from('tern-ping-✓');
  ws.ping(pingData);
  const pong = await expect('pong');
  out.ping = { sent: pingData.toString(), pong: pong.data.toString(),
               equal: pong.data.equals(pingData) };

  ws.close(4000, 'node client done');
  const closed = await expect('close');
  out.close = { code: closed.code, reason: closed.reason };
  return out;
}

async function main() {
  // With permessage-deflate (what ws offers by default), then without it,
  // where the frame lengths on the wire are the message sizes themselves.
  result.deflate = await session(true);
  result.plain = await session(false);
}

main().then(
  () => { clearTimeout(timer); finish(0); },
  (err) => { clearTimeout(timer); result.error = String(err && err.stack || err); finish(1); },
);
