// 1 000 clients in one process, their server restarted under them: full
// jitter spreads their reconnects over the window instead of a stampede.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { Proxy, closeAll, newClient, retryTimers, startServer, stopAll, until } from "./helpers.js";

afterEach(async () => {
  closeAll();
  await stopAll();
});

test("1 000 clients reconnecting after a restart: no second holds more than a fifth", async () => {
  const N = 1000, WINDOW = 8000;   // the first retry waits up to WINDOW ms
  // When each retry is due: the moment the client asks for its timer (the
  // first setTimeout after it draws from random()) plus the wait it asks
  // for. Counted by when they are due, not by when the proxy sees them: a
  // busy machine stalls this one process of 1 000 clients, and timers that
  // fall due during a stall all fire together after it.
  const due = [];
  const timers = retryTimers((ms) => due.push(Date.now() + ms));
  const random = timers.random;
  try {
    let srv = await startServer(["--feed", "off"]);
    const proxy = await new Proxy(srv.port).listen();   // where the connections go through
    const clients = Array.from({ length: N }, () =>
      newClient(proxy.url, { backoffInitial: WINDOW, backoffMax: 30000, random }));
    await until(() => clients.every((c) => c.state === "open"), "all open", 20000);
    const before = due.length;
    // the restart: everything through the proxy reset, a new server behind it
    await srv.stop();
    proxy.cut();
    const cutAt = Date.now();
    srv = await startServer(["--feed", "off"]);
    proxy.targetPort = srv.port;
    await until(() => clients.every((c) => c.state === "open"), "all back", 4 * WINDOW);
    const seconds = new Map();
    for (const t of due.slice(before)) {
      const s = Math.floor((t - cutAt) / 1000);
      seconds.set(s, (seconds.get(s) || 0) + 1);
    }
    assert.ok(due.length - before >= N, `${due.length - before} retries for ${N} clients`);
    const busiest = Math.max(...seconds.values());
    const spread = [...seconds.entries()].sort((a, b) => a[0] - b[0]).map(([s, n]) => `${s}s:${n}`);
    console.log(`reconnects due per second after the restart: ${spread.join(" ")}`);
    assert.ok(busiest <= N / 5, `the busiest second had ${busiest}: ${spread.join(" ")}`);
  } finally {
    timers.restore();
  }
});
