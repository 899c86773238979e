/**
 * The HTTP API of `cairn serve` under attack, in this process: the handler `cairn serve` mounts, on
 * the real observability server and its access gate, over the memory adapter (whose readers are
 * counted). HEAD on the event stream, streams whose clients come and go (no reader or timer left
 * behind), streams open when the server closes, a token in the query string or a cookie, a foreign
 * Host or Origin, a huge header, a body that trickles or never ends, encoded slashes and `..` in a
 * run id, `__proto__` keys, an unexpected error (500 without a stack, the stack in the log),
 * concurrent submits of one run id.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { connect, type Socket } from "node:net";
import { request } from "node:http";
import { Writable } from "node:stream";
import pino from "pino";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import type { Reader, Storage } from "../../src/storage/contract.js";
import { Metrics } from "../../src/observability/metrics.js";
import { startObservabilityServer, type ObservabilityServer } from "../../src/observability/server.js";
import { createApiHandler, type ApiHandler } from "../../src/cli/api.js";
import { MAX_STREAMS } from "../../src/cli/api-http.js";
import { until } from "../support/wait.js";

const TOKEN = "hardening-token-0123456789";
const auth = { authorization: `Bearer ${TOKEN}` };

/** The memory adapter, with a count of the readers open now. */
function countingStorage(): { storage: Storage; open: () => number } {
  const inner = createMemoryStorage();
  let open = 0;
  const storage: Storage = {
    ...inner,
    adapter: inner.adapter,
    open: (n, o) => inner.open(n, o),
    post: (n, m) => inner.post(n, m),
    list: () => inner.list(),
    close: () => inner.close(),
    async reader(name: string): Promise<Reader> {
      const r = await inner.reader(name);
      open++;
      let closed = false;
      return new Proxy(r, {
        get(target, key, receiver) {
          if (key === "close") {
            return async () => {
              if (!closed) open--;
              closed = true;
              return target.close();
            };
          }
          const v = Reflect.get(target, key, receiver) as unknown;
          return typeof v === "function" ? (v as (...a: unknown[]) => unknown).bind(target) : v;
        },
      });
    },
  };
  return { storage, open: () => open };
}

const timers = () => process.getActiveResourcesInfo().filter((k) => k === "Timeout").length;

const logged: Record<string, unknown>[] = [];
const logger = pino(
  { level: "info" },
  new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString("utf8").split("\n")) if (line.trim() !== "") logged.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  }),
);

let counted: ReturnType<typeof countingStorage>;
let handler: ApiHandler;
let server: ObservabilityServer;
let host: string;

async function startServer(): Promise<void> {
  handler = createApiHandler({
    storage: counted.storage,
    name: "hard",
    logger,
    tokenInForce: true,
    pollMs: 20,
    heartbeatMs: 50,
    bodyTimeoutMs: 500,
    routes: [
      {
        method: "GET",
        path: "/api/v1/boom",
        summary: "fails as an unexpected bug would",
        async handle() {
          throw new Error("the widget index is corrupt\n    at secretFunction (/srv/cairn/src/secret.ts:12:3)");
        },
      },
    ],
  });
  server = await startObservabilityServer({ listen: "127.0.0.1:0", metrics: new Metrics({ adapter: "memory" }), logger, routes: handler, access: { allowHosts: [], token: TOKEN }, ready: () => ({ ready: true, reason: "test" }) });
  host = `127.0.0.1:${server.port}`;
}

before(async () => {
  counted = countingStorage();
  await startServer();
});
after(async () => {
  await handler.close();
  await server.close();
});

async function api(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string; json: any }> { // eslint-disable-line @typescript-eslint/no-explicit-any
  const h: Record<string, string> = { ...auth, ...headers };
  if (body !== undefined) h["content-type"] ??= "application/json";
  const r = await fetch(`${server.url}${path}`, { method, headers: h, ...(body !== undefined ? { body: typeof body === "string" ? body : JSON.stringify(body) } : {}) });
  const text = await r.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    // kept as text
  }
  return { status: r.status, headers: r.headers, text, json };
}

/** Sends `raw` on a fresh connection and resolves with all the server answered, once it closes the connection or `quietMs` pass. */
function raw(payload: string | ((s: Socket) => void), quietMs = 5_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(server.port, "127.0.0.1");
    let got = "";
    const t = setTimeout(() => {
      s.destroy();
      resolve(got);
    }, quietMs);
    s.setEncoding("utf8").on("data", (d: string) => (got += d));
    s.on("close", () => {
      clearTimeout(t);
      resolve(got);
    });
    s.on("error", reject);
    s.on("connect", () => (typeof payload === "string" ? s.write(payload) : payload(s)));
  });
}

/** Asserts a refusal: the status, a JSON `{error: {code, message}}` whose message is a sentence, no stack. */
function refusal(r: { status: number; text: string; json: any }, status: number, code?: string): string { // eslint-disable-line @typescript-eslint/no-explicit-any
  assert.equal(r.status, status, r.text);
  assert.equal(typeof r.json?.error?.message, "string", `a JSON refusal: ${r.text}`);
  if (code !== undefined) assert.equal(r.json.error.code, code, r.text);
  assert.doesNotMatch(r.text, /\n\s+at |\.ts:\d+/, "no stack trace reaches the client");
  return r.json.error.message as string;
}

describe("the HTTP API under attack", () => {
  it("answers HEAD on the event stream with headers only, leaving no stream behind", async () => {
    const sub = await api("POST", "/api/v1/runs", { goal: "wait", session: "r1" });
    assert.equal(sub.status, 201, sub.text);
    const base = counted.open();
    const answer = await new Promise<{ status: number; type: string; body: string }>((resolve, reject) => {
      const q = request({ host: "127.0.0.1", port: server.port, method: "HEAD", path: "/api/v1/runs/r1/events/stream", headers: auth }, (res) => {
        let body = "";
        res.setEncoding("utf8").on("data", (d: string) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, type: String(res.headers["content-type"]), body }));
      });
      q.on("error", reject);
      q.end();
      // Hang guard: a HEAD answered with an endless stream never ends.
      setTimeout(() => {
        q.destroy();
        reject(new Error("the HEAD's answer did not end (hang guard 30 s)"));
      }, 30_000).unref();
    });
    assert.deepEqual(answer, { status: 200, type: "text/event-stream; charset=utf-8", body: "" });
    await until("no reader open for the HEAD", () => counted.open() === base, 10_000);
    const ghost = await api("HEAD", "/api/v1/runs/ghost/events/stream");
    assert.equal(ghost.status, 404);
  });

  it("closes every stream whose client went away, however early: no reader and no timer left", async () => {
    const baseTimers = timers();
    for (let i = 0; i < 25; i++) {
      // A client that reads the stream's start, then leaves.
      const abort = new AbortController();
      const r = await fetch(`${server.url}/api/v1/runs/r1/events/stream`, { headers: auth, signal: abort.signal });
      assert.equal(r.status, 200);
      const it = (r.body as unknown as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
      await it.next();
      abort.abort();
      // A client that leaves right after sending its request, before the run is looked up.
      await raw((s) => {
        s.write(`GET /api/v1/runs/r1/events/stream HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${TOKEN}\r\n\r\n`);
        s.destroy();
      });
    }
    await until("every stream's reader to close", () => counted.open() === 0, 30_000);
    await until("every stream's poll and heartbeat timer to stop", () => timers() <= baseTimers, 30_000);
  });

  it("refuses the token in the query string or a cookie, a foreign Host or Origin, with JSON sentences", async () => {
    const q = await api("GET", `/api/v1/runs?token=${TOKEN}`, undefined, { authorization: "" });
    assert.match(refusal(q, 401, "token_required"), /Authorization: Bearer TOKEN.*does not take it from \?token= or a cookie/);
    assert.equal(q.headers.get("set-cookie"), null, "no cookie is handed out");
    const cookie = await api("POST", "/api/v1/runs/r1/cancel", undefined, { authorization: "", cookie: `cairn_token=${TOKEN}` });
    refusal(cookie, 401, "token_required");
    refusal(await api("GET", "/api/v1/runs", undefined, { authorization: "Bearer x" }), 401);
    refusal(await api("GET", "/api/v1", undefined, { authorization: "" }), 401, "token_required");
    const foreignHost = await raw(`GET /api/v1/runs HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer ${TOKEN}\r\nConnection: close\r\n\r\n`);
    assert.match(foreignHost, /^HTTP\/1.1 421/);
    assert.match(foreignHost, /"code":"host_refused"/);
    const origin = await api("POST", "/api/v1/runs/r1/cancel", {}, { origin: "http://evil.example" });
    assert.match(refusal(origin, 403, "cross_origin"), /other origins/);
    const own = await api("GET", "/api/v1/runs", undefined, { origin: `http://${host}` });
    assert.equal(own.status, 200, own.text);
    assert.equal((await api("GET", "/api/v1/runs/r1")).json.run.status, "submitted", "nothing was cancelled");
  });

  it("is not held by a huge header, a trickled body or an endless one", async () => {
    const huge = await raw(`GET /api/v1/runs HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${TOKEN}\r\nX-Pad: ${"a".repeat(100_000)}\r\n\r\n`);
    assert.match(huge, /^HTTP\/1.1 431/);
    // Headers, then 5 of the 60 bytes promised, then nothing: refused once the body's time is up, and the connection closed.
    const slow = await raw((s) => s.write(`POST /api/v1/runs HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{"goa`), 60_000);
    assert.match(slow, /^HTTP\/1.1 408/);
    assert.match(slow, /"code":"body_timeout"/);
    // A chunked body past the limit: refused as it arrives, never read to its end.
    const endless = await raw((s) => {
      s.write(`POST /api/v1/runs HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`);
      const chunk = "x".repeat(64 * 1024);
      for (let i = 0; i < 5; i++) s.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
    }, 60_000);
    assert.match(endless, /^HTTP\/1.1 413/);
    assert.match(endless, /"code":"too_large"/);
    assert.equal((await api("GET", "/api/v1/runs")).status, 200, "the server still answers");
  });

  it("keeps a run id inside its route: encoded slashes and dot segments reach no other route", async () => {
    for (const path of ["/api/v1/runs/r1%2Fpause", "/api/v1/runs/r1%2F..%2F..%2Fboom", "/api/v1/runs/%2e%2e/pause", "/api/v1/runs/..%2Fr1/cancel", "/api/v1/runs/r1/..%2F..%2Fboom"]) {
      const r = await api("POST", path, {});
      assert.ok(r.status === 404 || r.status === 405, `${path}: ${r.status} ${r.text}`);
      refusal(r, r.status);
    }
    const dots = await api("GET", "/api/v1/runs/..%2F..%2Fmetrics");
    refusal(dots, 404, "unknown_run");
    assert.equal((await api("GET", "/api/v1/runs/r1")).json.run.status, "submitted", "r1 was neither paused nor cancelled");
  });

  it("refuses __proto__ keys, and no object's prototype changes", async () => {
    const top = await api("POST", "/api/v1/runs", '{"goal": "x", "session": "p1", "__proto__": {"polluted": true}}');
    assert.match(refusal(top, 400, "unknown_field"), /"__proto__"/);
    const nested = await api("POST", "/api/v1/runs", '{"goal": "x", "session": "p2", "budgets": {"__proto__": {"polluted": true}}}');
    refusal(nested, 400);
    const payload = await api("POST", "/api/v1/runs/r1/observations", '{"id": "o1", "kind": "k", "payload": {"__proto__": {"polluted": true}, "constructor": {"prototype": {"polluted": true}}}}');
    assert.ok(payload.status < 500, payload.text);
    assert.equal(({} as { polluted?: unknown }).polluted, undefined);
    assert.equal(Object.prototype.hasOwnProperty.call(Object.prototype, "polluted"), false);
    const runs = await api("GET", "/api/v1/runs");
    assert.deepEqual(runs.json.pending_starts.map((p: { run: string }) => p.run).sort(), ["r1"], "neither p1 nor p2 was submitted");
  });

  it("answers an unexpected error with 500, one line and no stack, and logs the stack", async () => {
    const r = await api("GET", "/api/v1/boom");
    assert.match(refusal(r, 500, "internal"), /the widget index is corrupt\); it may not have been applied: retry it with the same id/);
    const entry = logged.find((e) => e.msg === "api: request failed");
    assert.ok(entry !== undefined, "the failure is logged");
    assert.match(String((entry.err as { stack?: string }).stack), /at /, "with its stack");
  });

  it("makes one run of two concurrent submits of one run id; with other bodies, refuses one with 409", async () => {
    const same = await Promise.all([0, 1, 2, 3].map(() => api("POST", "/api/v1/runs", { goal: "same", session: "c1" })));
    for (const r of same) assert.ok(r.status === 200 || r.status === 201, r.text);
    const other = await Promise.all(["one", "two"].map((goal) => api("POST", "/api/v1/runs", { goal, session: "c2" })));
    const statuses = other.map((r) => r.status).sort();
    assert.deepEqual(statuses, [201, 409], other.map((r) => r.text).join(" "));
    refusal(other.find((r) => r.status === 409)!, 409, "conflict");
    const runs = await api("GET", "/api/v1/runs");
    const pending = runs.json.pending_starts as { run: string; goal: string }[];
    assert.equal(pending.filter((p) => p.run === "c1").length, 1);
    assert.equal(pending.filter((p) => p.run === "c2").length, 1);
  });

  it("refuses a stream past the most open at once (429 with a sentence), and takes one again once a stream closed", async () => {
    const aborts = Array.from({ length: MAX_STREAMS }, () => new AbortController());
    const open = await Promise.all(aborts.map((a) => fetch(`${server.url}/api/v1/runs/r1/events/stream`, { headers: auth, signal: a.signal })));
    assert.deepEqual([...new Set(open.map((r) => r.status))], [200]);
    await until(`${MAX_STREAMS} streams to follow the log`, () => counted.open() === MAX_STREAMS, 30_000);
    const over = await api("GET", "/api/v1/runs/r1/events/stream");
    refusal(over, 429, "too_many_streams");
    assert.match(over.json.error.message, new RegExp(`^${MAX_STREAMS} event streams are open on this server; close one`));
    aborts[0]!.abort();
    await until("the closed stream's reader to close", () => counted.open() === MAX_STREAMS - 1, 30_000);
    const again = new AbortController();
    const one = await fetch(`${server.url}/api/v1/runs/r1/events/stream`, { headers: auth, signal: again.signal });
    assert.equal(one.status, 200);
    for (const a of [...aborts, again]) a.abort();
    await until("every stream's reader to close", () => counted.open() === 0, 30_000);
  });

  it("ends open streams when the server closes, and closes their readers", async () => {
    const streams = await Promise.all([0, 1, 2].map(() => fetch(`${server.url}/api/v1/runs/r1/events/stream`, { headers: auth })));
    const bodies = streams.map((r) => r.text().then(() => "ended", () => "cut"));
    await until("three streams to follow the log", () => counted.open() === 3, 30_000);
    await handler.close();
    await server.close();
    assert.equal((await Promise.all(bodies)).length, 3);
    await until("every stream's reader to close", () => counted.open() === 0, 30_000);
  });
});
