// Peer: Node.js with the `ws` package (version pinned in package-lock.json):
// a WebSocket echo on / and /ws (each message sent back with the same type,
// permessage-deflate off) and the HTTP routes of `tern serve` on the same
// node:http server. One process, one thread of JavaScript. With -tls-cert F
// -tls-key F the same on a node:https server (HTTPS and WSS).
'use strict';
const fs = require('fs');
const http = require('http');
const https = require('https');
const { WebSocketServer } = require('ws');

let port = 9095, host = '127.0.0.1', cert = null, key = null;
for (let i = 2; i < process.argv.length; i++) {
  if (process.argv[i] === '-tls-cert') {
    cert = fs.readFileSync(process.argv[++i]);
  } else if (process.argv[i] === '-tls-key') {
    key = fs.readFileSync(process.argv[++i]);
  } else if (process.argv[i] === '-addr') {
    const a = process.argv[++i];
    const k = a.lastIndexOf(':');
    host = a.slice(0, k); port = Number(a.slice(k + 1));
  }
}
const xs = Buffer.alloc(1 << 20, 'x');

// -tls-cert/-tls-key: node:https (OpenSSL) on -addr instead of node:http
const handler = (req, res) => {
  const q = req.url.indexOf('?');
  const path = q < 0 ? req.url : req.url.slice(0, q);
  if (req.method === 'GET' && path === '/ping') {
    res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': 4 });
    res.end('pong');
  } else if (req.method === 'GET' && path === '/echo') {
    const n = Number(new URLSearchParams(req.url.slice(q + 1)).get('size'));
    if (!Number.isInteger(n) || n < 0 || n > xs.length) {
      res.writeHead(400); res.end('bad size'); return;
    }
    res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': n });
    res.end(xs.subarray(0, n));
  } else if (req.method === 'POST' && path === '/echo') {
    const parts = [];
    req.on('data', (c) => parts.push(c));
    req.on('end', () => {
      const body = Buffer.concat(parts);
      res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': body.length });
      res.end(body);
    });
  } else {
    res.writeHead(404); res.end('not found');
  }
};
const server = cert && key ? https.createServer({ cert, key }, handler)
  : http.createServer(handler);

// bench/run fanout: /fanout answers each message with 10 binary messages of
// 10 000 bytes; /fanout/sub connections get every message sent on
// /fanout/pub. A subscriber with over 1 MiB not yet written misses the
// message (dropped, as tern's default slow-consumer policy does).
const block = Buffer.alloc(10000);
const subs = new Set();
const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: 16 << 20 });
server.on('upgrade', (req, socket, head) => {
  const path = req.url.split('?')[0];
  const routes = ['/', '/ws', '/fanout', '/fanout/sub', '/fanout/pub', '/fanout/pub-keyed'];
  if (!routes.includes(path)) { socket.destroy(); return; }
  wss.handleUpgrade(req, socket, head, (ws) => {
    ws.on('error', () => {});
    if (path === '/fanout') {
      ws.on('message', () => { for (let i = 0; i < 10; i++) ws.send(block, { binary: true }); });
    } else if (path === '/fanout/sub') {
      subs.add(ws);
      ws.on('close', () => subs.delete(ws));
    } else if (path === '/fanout/pub' || path === '/fanout/pub-keyed') {   // no conflation: the key is not used
      ws.on('message', (data, isBinary) => {
        for (const s of subs) {
          if (s.bufferedAmount <= 1 << 20) s.send(data, { binary: isBinary });
        }
      });
    } else {
      ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
    }
  });
});
server.listen(port, host);
