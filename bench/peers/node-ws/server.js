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

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: 16 << 20 });
server.on('upgrade', (req, socket, head) => {
  const path = req.url.split('?')[0];
  if (path !== '/' && path !== '/ws') { socket.destroy(); return; }
  wss.handleUpgrade(req, socket, head, (ws) => {
    ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
    ws.on('error', () => {});
  });
});
server.listen(port, host);
