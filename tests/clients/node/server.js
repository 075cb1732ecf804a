// An echo server on the ws package for tern's client tests
// (tests/integration/test_client.py): listens on 127.0.0.1 at a free port,
// prints "PORT n", echoes every message with its type, with
// permessage-deflate when offered, and chooses the subprotocol "chat" when
// it is offered.
'use strict';
const { WebSocketServer } = require('ws');

const wss = new WebSocketServer({
  host: '127.0.0.1',
  port: 0,
  perMessageDeflate: { threshold: 0 },
  handleProtocols: (protocols) => (protocols.has('chat') ? 'chat' : false),
});
wss.on('listening', () => console.log(`PORT ${wss.address().port}`));
wss.on('connection', (ws) => {
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
});
