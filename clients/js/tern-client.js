// tern-client: the client of tern serve's /pubsub (src/app/serve_pubsub.c
// says the protocol), for browsers and Node. One ES module, no runtime
// dependency in a browser (its WebSocket); in Node the global WebSocket
// where there is one (Node 22 and later), else the `ws` package.
//
// What it does for the application: reconnects with exponential backoff
// and full jitter; resumes every subscription from its last (epoch, seq)
// so nothing is missed while the server's history reaches back, and says
// so when it does not (the messages then are the latest of each key,
// marked `snapshot`); keeps the latest message of each key per
// subscription; numbers publishes by the server's acks; keeps a bounded
// queue of publishes while disconnected; gets tokens again before they
// expire.

const DEFAULTS = {
  backoffInitial: 250,     // ms: the first retry waits up to this
  backoffMax: 10000,       // ms: no retry waits longer
  refreshMargin: 30000,    // ms before a token's exp to get a new one (at most half its life)
  queueMax: 1000,          // publishes held while disconnected
  queuePolicy: "reject-new",
};

const OPEN = 1;   // WebSocket.OPEN, the same in every implementation

/** An error of the client or the server; `code` says which (README). */
export class TernError extends Error {
  constructor(code, message, detail) {
    super(message);
    this.name = "TernError";
    this.code = code;
    if (detail !== undefined) this.detail = detail;
  }
}

/**
 * The delay before reconnect attempt `attempt` (0 for the first): full
 * jitter, uniform in [0, min(max, initial * 2^attempt)), so that clients
 * cut at once do not all come back at once.
 */
export function backoffDelay(attempt, initial, max, random = Math.random) {
  const ceiling = Math.min(max, initial * Math.pow(2, Math.min(attempt, 30)));
  return Math.floor(random() * ceiling);
}

/** The exp claim (seconds) of a JWT, or undefined when it has none. */
export function tokenExp(token) {
  try {
    const part = token.split(".")[1];
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4)));
    return typeof claims.exp === "number" ? claims.exp : undefined;
  } catch {
    return undefined;
  }
}

let wsModule = null;   // the `ws` package, loaded once when Node needs it

async function webSocketClass(given) {
  if (given) return given;
  if (typeof globalThis.WebSocket === "function") return globalThis.WebSocket;
  if (!wsModule) {
    try {
      wsModule = await import("ws");
    } catch (e) {
      throw new TernError("NO_WEBSOCKET",
        "no WebSocket here: install the `ws` package or pass options.WebSocket", e);
    }
  }
  return wsModule.WebSocket || wsModule.default;
}

/**
 * One subscription as the application holds it. `latest` maps each key to
 * its latest message (messages without a key are not in it).
 */
class Subscription {
  constructor(client, topic, handler, options) {
    this.topic = topic;
    this.latest = new Map();
    this._client = client;
    this._handler = handler;
    this._onSubscribed = options.onSubscribed;
    this._snapshot = options.snapshot !== false;
    this._closed = false;
    this.ready = new Promise((resolve, reject) => {
      this._ready = { resolve, reject };
    });
    // Nobody has to wait on ready: an unhandled refusal is also an error event.
    this.ready.catch(() => {});
  }

  /** Stops the handler; the server is told when no other subscription of the topic is left. */
  unsubscribe() {
    if (this._closed) return;
    this._closed = true;
    this._client._unsubscribe(this);
  }
}

/**
 * What the client knows of one topic it is subscribed to, for every
 * Subscription of it. Invariants: epoch/seq are where the stream stands
 * (the last ack's, then the last message's); pending is set from a
 * subscribe sent until its ack, and buffer holds the topic's messages
 * received meanwhile (the replay or snapshot, which only the ack says).
 */
class TopicState {
  constructor(topic, snapshot) {
    this.topic = topic;
    this.subs = new Set();
    this.snapshot = snapshot;
    this.epoch = null;
    this.seq = 0;
    this.pending = false;
    this.buffer = [];
    this.acked = false;   // subscribed at least once (a later ack is a resume)
  }
}

export class TernClient {
  /**
   * @param {string} url  ws:// or wss:// URL of /pubsub
   * @param {object} options  see tern-client.d.ts
   */
  constructor(url, options = {}) {
    this.url = url;
    this.options = { ...DEFAULTS, ...options };
    if (!["reject-new", "drop-oldest"].includes(this.options.queuePolicy))
      throw new TypeError("queuePolicy: reject-new or drop-oldest");
    this.state = "idle";
    this._token = options.token || null;
    this._tokenStale = false;
    this._listeners = new Map();
    this._topics = new Map();       // topic -> TopicState
    this._requests = [];            // replies awaited, in the order sent (the server answers in order)
    this._queue = [];               // publishes waiting for a connection
    this._socket = null;
    this._attempt = 0;
    this._retryTimer = null;
    this._refreshTimer = null;
    this._random = options.random || Math.random;
    this._browser = typeof window !== "undefined" && typeof document !== "undefined";
    if (this._browser) {
      // Back online, or the page shown again while a retry waits: try now.
      this._onOnline = () => this._retryNow();
      this._onVisible = () => { if (document.visibilityState === "visible") this._retryNow(); };
      window.addEventListener("online", this._onOnline);
      document.addEventListener("visibilitychange", this._onVisible);
    }
    if (options.connect !== false) this.connect();
  }

  /** Listens to "state" (state, previous) or "error" (TernError); returns a function that stops it. */
  on(event, fn) {
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(fn);
    return () => this._listeners.get(event).delete(fn);
  }

  _emit(event, ...args) {
    for (const fn of this._listeners.get(event) || []) {
      try {
        fn(...args);
      } catch (e) {
        // a listener's bug must not stop the client; it still shows
        setTimeout(() => { throw e; });
      }
    }
  }

  _error(code, message, detail) {
    const e = new TernError(code, message, detail);
    this._emit("error", e);
    return e;
  }

  _setState(s) {
    if (s === this.state) return;
    const prev = this.state;
    this.state = s;
    this._emit("state", s, prev);
  }

  /** Opens the connection (the constructor does unless options.connect is false). */
  connect() {
    if (this.state === "closed") throw new TernError("CLOSED", "the client is closed");
    if (this._socket || this._retryTimer) return;
    this._open();
  }

  /** Drops the connection and opens a new one at once; every subscription resumes. */
  reconnect() {
    if (this.state === "closed") return;
    this._attempt = 0;
    this._closeSocket(1000, "reconnect");
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._open();
  }

  async _open() {
    this._setState("connecting");
    const socketMarker = {};
    this._socket = socketMarker;   // taken: no second _open meanwhile
    let ws;
    try {
      const WS = await webSocketClass(this.options.WebSocket);
      if (this.options.getToken && (!this._token || this._tokenStale || this._expiresSoon())) {
        this._token = await this.options.getToken();
        this._tokenStale = false;
      }
      if (this._socket !== socketMarker) return;   // closed or reconnected meanwhile
      let url = this.url;
      if (this._token)
        url += (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(this._token);
      ws = new WS(url);
    } catch (e) {
      if (this._socket !== socketMarker) return;
      this._socket = null;
      this._error(e.code || "CONNECT", "could not connect: " + e.message, e);
      this._scheduleRetry();
      return;
    }
    this._socket = ws;
    let opened = false;
    ws.onopen = () => {
      if (this._socket !== ws) return;
      opened = true;
      this._attempt = 0;
      this._setState("open");
      this._resubscribe();
      this._flushQueue();
      this._scheduleRefresh();
    };
    ws.onmessage = (ev) => {
      if (this._socket === ws) this._onMessage(ev.data);
    };
    ws.onerror = () => {};   // onclose follows and says what to do
    ws.onclose = (ev) => {
      if (this._socket !== ws) return;
      this._drop(ws);
      if (ev.code === 4001) {
        // the server's "token expired": a new one, and back at once
        this._tokenStale = true;
        this._error("TOKEN_EXPIRED", "the token expired");
      } else if (!opened && this.options.getToken) {
        // Refused before it opened: a browser cannot tell a 401 from a
        // server that is down, so the next attempt gets a new token.
        this._tokenStale = true;
      }
      if (opened) this._error("DISCONNECTED", `connection closed (${ev.code})`, { code: ev.code, reason: ev.reason });
      this._scheduleRetry();
    };
  }

  _expiresSoon() {
    const exp = tokenExp(this._token);
    return exp !== undefined && exp * 1000 - Date.now() < 1000;
  }

  // What ends with a connection: its requests fail (a publish sent may or
  // may not have been published), its subscriptions wait for the next one.
  _drop(ws) {
    if (this._socket === ws) this._socket = null;
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.onerror = () => {};
    const reqs = this._requests;
    this._requests = [];
    for (const r of reqs)
      if (r.reject) r.reject(new TernError("DISCONNECTED", "the connection closed before the answer"));
    for (const t of this._topics.values()) {
      t.pending = false;
      t.buffer = [];
    }
  }

  // Ends the connection (or the attempt being made) on our side.
  _closeSocket(code, reason) {
    const ws = this._socket;
    if (!ws) return;
    if (typeof ws.close !== "function") {
      this._socket = null;   // an attempt still getting its token: it sees it is not wanted
      return;
    }
    this._drop(ws);
    try {
      ws.close(code, reason);
    } catch {
      // closing a socket that is still connecting throws in some implementations; it is dropped anyway
    }
  }

  _scheduleRetry() {
    if (this.state === "closed") return;
    this._setState("reconnecting");
    if (this._browser && navigator.onLine === false) return;   // "online" will call _retryNow
    const delay = backoffDelay(this._attempt++, this.options.backoffInitial,
                               this.options.backoffMax, this._random);
    this._retryTimer = setTimeout(() => {
      this._retryTimer = null;
      this._open();
    }, delay);
  }

  _retryNow() {
    if (this.state !== "reconnecting" || this._socket) return;
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._open();
  }

  // Before the token's exp, a new one over the same connection.
  _scheduleRefresh(expSeconds) {
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    if (!this.options.getToken || !this._token) return;
    const exp = expSeconds ?? tokenExp(this._token);
    if (exp === undefined) return;
    const left = exp * 1000 - Date.now();
    const wait = Math.max(0, Math.max(left / 2, left - this.options.refreshMargin));
    const ws = this._socket;
    this._refreshTimer = setTimeout(async () => {
      this._refreshTimer = null;
      let token;
      try {
        token = await this.options.getToken();
      } catch (e) {
        this._error("TOKEN", "getToken failed: " + e.message, e);
        return;   // the server closes at exp (4001); the reconnect asks again
      }
      if (this._socket !== ws || ws.readyState !== OPEN) return;
      this._token = token;
      this._request({ op: "refresh", token }, {
        resolve: (m) => this._scheduleRefresh(m.exp),
        reject: (e) => this._error("TOKEN", "the server refused the new token: " + e.message, e),
      });
    }, wait);
  }

  _send(msg) {
    this._socket.send(JSON.stringify(msg));
  }

  // A message the server answers (once, in order): r gets the answer.
  _request(msg, r) {
    this._send(msg);
    this._requests.push(r);
  }

  _onMessage(text) {
    let m;
    try {
      m = JSON.parse(text);
    } catch {
      this._error("PROTOCOL", "not JSON from the server", text);
      return;
    }
    if (m.ok !== undefined || m.error !== undefined) {
      const r = this._requests.shift();
      if (!r) return;
      if (m.error !== undefined) r.reject(new TernError("SERVER", m.error, m));
      else r.resolve(m);
      return;
    }
    if (typeof m.topic !== "string" || typeof m.seq !== "number") return;
    const t = this._topics.get(m.topic);
    if (!t || t.unsubscribing) return;   // its subscription ended
    if (t.pending) {
      t.buffer.push(m);   // a replay or a snapshot: the ack says which
      return;
    }
    this._deliver(t, m, false);
  }

  _deliver(t, m, snapshot) {
    t.seq = m.seq;
    const msg = { topic: m.topic, seq: m.seq, data: m.data, snapshot };
    if (m.key !== undefined) msg.key = m.key;
    for (const s of t.subs) {
      if (s._closed) continue;
      if (msg.key !== undefined) s.latest.set(msg.key, msg);
      try {
        s._handler(msg, s);
      } catch (e) {
        setTimeout(() => { throw e; });
      }
    }
  }

  _resubscribe() {
    for (const t of this._topics.values()) this._sendSubscribe(t);
  }

  _sendSubscribe(t) {
    const msg = { op: "subscribe", topic: t.topic };
    if (t.epoch) {
      msg.epoch = t.epoch;
      msg.after = String(t.seq);
    } else if (t.snapshot) {
      msg.snapshot = true;
    }
    t.pending = true;
    t.buffer = [];
    this._request(msg, {
      resolve: (ack) => this._subscribed(t, ack),
      reject: (e) => {
        t.pending = false;
        t.buffer = [];
        if (e.code === "DISCONNECTED") return;   // the next connection asks again
        this._topics.delete(t.topic);
        const err = new TernError("SUBSCRIBE", `subscribe ${t.topic}: ${e.message}`, e.detail);
        this._emit("error", err);
        for (const s of t.subs) {
          s._closed = true;
          s._ready.reject(err);
        }
      },
    });
  }

  _subscribed(t, ack) {
    const buffered = t.buffer;
    t.pending = false;
    t.buffer = [];
    if (ack.epoch === undefined) return;   // "already subscribed": nothing changes
    // A resume that could not be one (resumed:false: another epoch, or the
    // history no longer reaches back) and a snapshot both send the latest
    // message of each key: the application is told, and they are marked.
    const resumed = ack.resumed;
    const gap = resumed === false;
    const snapshot = gap || ack.snapshot !== undefined;
    const info = { topic: t.topic, epoch: ack.epoch, seq: ack.seq, resumed, gap,
                   replayed: ack.replayed ?? ack.snapshot ?? 0, first: !t.acked };
    t.acked = true;
    for (const s of t.subs) {
      s._ready.resolve(info);
      if (s._onSubscribed && !s._closed) {
        try {
          s._onSubscribed(info, s);
        } catch (e) {
          setTimeout(() => { throw e; });
        }
      }
    }
    for (const m of buffered) this._deliver(t, m, snapshot);
    t.epoch = ack.epoch;
    t.seq = ack.seq;
  }

  /**
   * Calls handler(message, subscription) for every message of topic.
   * options.snapshot (default true): start with the latest message of each
   * key; options.onSubscribed(info): at every (re)subscription.
   */
  subscribe(topic, handler, options = {}) {
    if (this.state === "closed") throw new TernError("CLOSED", "the client is closed");
    if (typeof topic !== "string" || topic === "") throw new TypeError("topic: a non-empty string");
    if (typeof handler !== "function") throw new TypeError("handler: a function");
    const s = new Subscription(this, topic, handler, options);
    let t = this._topics.get(topic);
    if (t && t.unsubscribing) {
      // subscribed again once the server has answered the unsubscribe
      if (!t.next) t.next = new TopicState(topic, s._snapshot);
      t.next.subs.add(s);
      return s;
    }
    if (t) {
      t.subs.add(s);
      // the topic's stream is already there: this one starts where it stands
      if (t.acked && !t.pending) {
        for (const m of t.subs.values().next().value.latest.values()) s.latest.set(m.key, m);
        s._ready.resolve({ topic, epoch: t.epoch, seq: t.seq, resumed: undefined, gap: false,
                           replayed: 0, first: true });
      }
      return s;
    }
    t = new TopicState(topic, s._snapshot);
    t.subs.add(s);
    this._topics.set(topic, t);
    if (this._socket && this._socket.readyState === OPEN) this._sendSubscribe(t);
    return s;
  }

  _unsubscribe(s) {
    const t = this._topics.get(s.topic);
    if (!t) return;
    if (t.unsubscribing) {
      // one waiting for the unsubscribe's answer
      if (t.next) t.next.subs.delete(s);
      if (t.next && t.next.subs.size === 0) t.next = null;
      return;
    }
    t.subs.delete(s);
    if (t.subs.size > 0) return;
    this._topics.delete(s.topic);
    if (!this._socket || this._socket.readyState !== OPEN || !t.acked && !t.pending) return;
    // Until the server's answer, messages of the topic belong to the old
    // subscription: a subscribe made meanwhile must not get them.
    const marker = new TopicState(s.topic, false);
    marker.unsubscribing = true;
    this._topics.set(s.topic, marker);
    const done = () => {
      if (this._topics.get(s.topic) !== marker) return;
      const next = marker.next;
      if (next) {
        this._topics.set(s.topic, next);
        if (this._socket && this._socket.readyState === OPEN) this._sendSubscribe(next);
      } else {
        this._topics.delete(s.topic);
      }
    };
    this._request({ op: "unsubscribe", topic: s.topic }, { resolve: done, reject: done });
  }

  /**
   * Publishes data (a string) to topic, with options.key for conflation.
   * Resolves with the message's seq (the server's ack); rejects with a
   * TernError (README: codes).
   */
  publish(topic, data, options = {}) {
    if (typeof data !== "string") return Promise.reject(new TypeError("data: a string"));
    if (this.state === "closed") return Promise.reject(new TernError("CLOSED", "the client is closed"));
    const msg = { op: "publish", topic, data };
    if (options.key !== undefined) msg.key = options.key;
    return new Promise((resolve, reject) => {
      const item = { msg, resolve: (ack) => resolve(ack.seq), reject };
      if (this._socket && this._socket.readyState === OPEN) {
        this._request(msg, item);
        return;
      }
      // Disconnected: held for the next connection, within the bound.
      if (this._queue.length >= this.options.queueMax) {
        if (this.options.queuePolicy === "drop-oldest" && this._queue.length > 0) {
          this._queue.shift().reject(new TernError("DROPPED", "dropped from the full queue (drop-oldest)"));
        } else {
          reject(new TernError("QUEUE_FULL", "disconnected and the queue is full"));
          return;
        }
      }
      this._queue.push(item);
    });
  }

  /** Publishes waiting in the queue. */
  get queued() {
    return this._queue.length;
  }

  _flushQueue() {
    const q = this._queue;
    this._queue = [];
    for (const item of q) this._request(item.msg, item);
  }

  /** Closes for good: the connection (1000), timers, the queue (rejected). */
  close() {
    if (this.state === "closed") return;
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._closeSocket(1000, "bye");
    for (const item of this._queue) item.reject(new TernError("CLOSED", "the client closed"));
    this._queue = [];
    for (const t of this._topics.values())
      for (const s of t.subs) {
        s._closed = true;
        s._ready.reject(new TernError("CLOSED", "the client closed"));
      }
    this._topics.clear();
    if (this._browser) {
      window.removeEventListener("online", this._onOnline);
      document.removeEventListener("visibilitychange", this._onVisible);
    }
    this._setState("closed");
  }
}
