// 1 000 clients in one process, their server restarted under them: full
// jitter spreads their reconnects over the window instead of a stampede.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { Proxy, closeAll, newClient, startServer, stopAll, until } from "./helpers.js";

afterEach(async () => {
  closeAll();
  await stopAll();
});

test("1 000 clients reconnecting after a restart: no second holds more than a fifth", async () => {
  const N = 1000, WINDOW = 8000;   // the first retry waits up to WINDOW ms
  let srv = await startServer(["--feed", "off"]);
  const proxy = await new Proxy(srv.port).listen();   // where the connections are counted
  const clients = Array.from({ length: N }, () =>
    newClient(proxy.url, { backoffInitial: WINDOW, backoffMax: 30000 }));
  await until(() => clients.every((c) => c.state === "open"), "all open", 20000);
  const opened = proxy.acceptedAt.length;
  // the restart: everything through the proxy reset, a new server behind it
  await srv.stop();
  proxy.cut();
  const cutAt = Date.now();
  srv = await startServer(["--feed", "off"]);
  proxy.targetPort = srv.port;
  await until(() => clients.every((c) => c.state === "open"), "all back", 4 * WINDOW);
  const seconds = new Map();
  for (const t of proxy.acceptedAt.slice(opened)) {
    const s = Math.floor((t - cutAt) / 1000);
    seconds.set(s, (seconds.get(s) || 0) + 1);
  }
  const busiest = Math.max(...seconds.values());
  const spread = [...seconds.entries()].sort((a, b) => a[0] - b[0]).map(([s, n]) => `${s}s:${n}`);
  console.log(`reconnects per second after the restart: ${spread.join(" ")}`);
  assert.ok(busiest <= N / 5, `the busiest second had ${busiest}: ${spread.join(" ")}`);
});
