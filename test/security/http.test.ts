/**
 * The HTTP surface, attacked with real requests against real servers: `cairn serve`'s /metrics port
 * and `cairn ui`'s page, in this process (the library servers) and as the `cairn` command.
 *
 * - A Host that is not the server's (DNS rebinding: a web page's own name resolved to 127.0.0.1) is
 *   refused with 421 before anything is read, on every path but the probes.
 * - With a token in force, no token and a wrong one (header, cookie, query) are refused with 401; the
 *   right one is accepted in each form.
 * - A non-loopback --listen without a token gets a generated one, printed once; --no-auth says what it
 *   exposes; transcripts are not on serve's port without --ui.
 *
 * Each request goes through node:http so that the Host header is exactly what the test writes.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { request } from "node:http";
import { connect } from "node:net";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { event, identity } from "../../src/state/events.js";
import { Metrics } from "../../src/observability/metrics.js";
import { startObservabilityServer, type ObservabilityServer } from "../../src/observability/server.js";
import { createGate, decideAccess } from "../../src/observability/access.js";
import { createTimelineHandler } from "../../src/ui/server.js";
import { startPageServer, type PageServer } from "../../src/ui/http.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { tempDir } from "../harness/support.js";
import { killAll, spawnCairn, until, type Spawned } from "../ui/scenario.js";

const t = tempDir("cairn-sec-http-");
const children: ChildProcess[] = [];
const DB = "secret-runs";
const SECRET = "the-transcript-only-the-operator-may-read";
const TOKEN = "a-token-of-thirty-two-characters";
const dataDir = join(t.dir, "data");

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** GET (or `method`) `path` on 127.0.0.1:`port` with exactly these headers (Host included). */
function get(port: number, path: string, headers: Record<string, string> = {}, method = "GET"): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path, method, headers: { host: `127.0.0.1:${port}`, ...headers }, setHost: false }, (res) => {
      let body = "";
      res.setEncoding("utf8").on("data", (d: string) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.setTimeout(60_000, () => req.destroy(new Error(`no answer to ${path} (hang guard)`)));
    req.end();
  });
}

const OUTPUT = `/api/output?db=${DB}&session=s1&cell=1`;

/** Sends `head` as the raw request on a fresh connection; resolves with the status line. */
function raw(port: number, head: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1", () => socket.write(head));
    let text = "";
    socket.setEncoding("utf8").on("data", (d: string) => (text += d));
    socket.on("end", () => resolve(text.split("\r\n")[0] ?? ""));
    socket.on("error", reject);
    socket.setTimeout(60_000, () => socket.destroy(new Error("no answer (hang guard)")));
  });
}

before(async () => {
  // A database with one run whose cell printed SECRET: what an attacker wants.
  const storage = createSqliteStorage({ dataDir });
  const db = await storage.open(DB);
  const at = new Date().toISOString();
  await db.commit([
    event("session_created", "s1", identity.session("s1"), at, { goal: "read me", cwd: "/work", validators: [], budgets: {} }),
    event("owner_claimed", "s1", identity.owner("s1", db.epoch), at, { epoch: db.epoch, host: "h", boot_id: "b", pid: 1 }),
    event("turn_prepared", "s1", identity.turn("s1:t1"), at, { turn: "s1:t1", n: 1, revision: 0, delivered: [] }),
    event("patch_accepted", "s1", identity.patch("s1:t1"), at, {
      turn: "s1:t1",
      attempt: 1,
      patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["echo"] } }],
      revision: 1,
      new_cell_ids: [1],
      removed_ids: [],
      consumed: [],
    }),
    event("execution_queued", "s1", identity.queued("s1", 1), at, { cell_id: 1, kind: "cmd" }),
    event("execution_started", "s1", identity.execution("s1", 1), at, { cell_id: 1, host: "h", boot_id: "b", pid: 2, pgid: 2, start_time: "1" }),
    event("execution_output", "s1", identity.output("s1", 1, 0), at, { cell_id: 1, n: 0, stream: "stdout", data: `${SECRET}\n` }),
  ]);
  await db.close();
  await storage.close();
});
after(() => {
  killAll(children);
  t.cleanup();
});

/** The page and /metrics on one port, in this process, with `token` in force (or none). */
async function observability(token: string | null, allowHosts: string[] = []): Promise<{ server: ObservabilityServer; close(): Promise<void> }> {
  const storage = createSqliteStorage({ dataDir });
  const page = createTimelineHandler({ storage, databases: async () => [DB] });
  const server = await startObservabilityServer({ listen: "127.0.0.1:0", metrics: new Metrics({ defaultMetrics: false }), ready: () => ({ ready: true, reason: "ready" }), routes: page, access: { allowHosts, token } });
  return {
    server,
    async close() {
      await page.close();
      await server.close();
      await storage.close();
    },
  };
}

describe("the Host check (DNS rebinding)", () => {
  it("refuses every Host that is not the server's own, on the page, the API and /metrics; the probes answer", async () => {
    const s = await observability(null);
    try {
      const port = s.server.port;
      // A page's own name rebound to 127.0.0.1, with and without the port, look-alikes, and nothing.
      const foreign = [`evil.example:${port}`, "evil.example", `localhost.evil.example:${port}`, `127.0.0.1.nip.io:${port}`, `localhost:${port + 1}`, `127.0.0.1:${port}@evil.example`, ""];
      for (const host of foreign) {
        for (const path of [OUTPUT, "/", "/api/databases", `/api/timeline?db=${DB}`, `/api/stream?db=${DB}`, "/metrics"]) {
          const r = await get(port, path, { host });
          assert.equal(r.status, 421, `Host ${JSON.stringify(host)} on ${path}: ${r.status} ${r.body}`);
          assert.match(r.body, /does not answer to Host/);
          assert.doesNotMatch(r.body, new RegExp(SECRET));
        }
        for (const probe of ["/healthz", "/readyz"]) assert.equal((await get(port, probe, { host })).status, 200, `${probe} answers Host ${JSON.stringify(host)}`);
      }
      // The server's own names are served, the transcript included.
      for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `LOCALHOST:${port}`, `[::1]:${port}`, `localhost.:${port}`]) {
        const r = await get(port, OUTPUT, { host });
        assert.equal(r.status, 200, `Host ${host}: ${r.body}`);
        assert.match(r.body, new RegExp(SECRET));
      }
    } finally {
      await s.close();
    }
  });

  it("a request target that does not parse is refused with 400, and the server goes on answering", async () => {
    const s = await observability(null);
    const storage = createSqliteStorage({ dataDir });
    const page = createTimelineHandler({ storage, databases: async () => [DB] });
    const ui = await startPageServer("127.0.0.1:0", page);
    try {
      for (const port of [s.server.port, ui.port]) {
        assert.match(await raw(port, `GET //[ HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: close\r\n\r\n`), /^HTTP\/1\.1 400/);
        assert.equal((await get(port, "/healthz")).status, port === ui.port ? 404 : 200, "still answering");
      }
    } finally {
      await ui.close();
      await page.close();
      await storage.close();
      await s.close();
    }
  });

  it("--allow-host adds a name (any port, or the one written); a wildcard bind answers to this machine's addresses", async () => {
    const s = await observability(null, ["cairn.internal", "proxy.internal:8443"]);
    try {
      const port = s.server.port;
      assert.equal((await get(port, "/metrics", { host: "cairn.internal" })).status, 200);
      assert.equal((await get(port, "/metrics", { host: `cairn.internal:${port}` })).status, 200);
      assert.equal((await get(port, "/metrics", { host: "proxy.internal:8443" })).status, 200);
      assert.equal((await get(port, "/metrics", { host: "proxy.internal:8444" })).status, 421);
      assert.equal((await get(port, "/metrics", { host: "other.internal" })).status, 421);
    } finally {
      await s.close();
    }
    // The gate of a server bound to 0.0.0.0 on a machine whose address is 10.1.2.3 (a pod's IP: the
    // kubelet and Prometheus use it).
    const gate = createGate({ allowHosts: [], token: null }, "0.0.0.0", 9464, () => ["127.0.0.1", "10.1.2.3", "fe80::1"]);
    const verdict = (host: string): boolean => {
      let status = 0;
      const res = { headersSent: false, setHeader() {}, writeHead(s: number) { status = s; return res; }, end() {} };
      const ok = gate.check({ headers: { host }, url: "/metrics" } as never, res as never, "/metrics").allowed;
      return ok && status === 0;
    };
    assert.equal(verdict("10.1.2.3:9464"), true);
    assert.equal(verdict("[fe80::1]:9464"), true);
    assert.equal(verdict("10.1.2.4:9464"), false, "an address of another machine");
    assert.equal(verdict("10.1.2.3:9465"), false, "another port");
    assert.equal(verdict("evil.example:9464"), false);
  });
});

describe("the token", () => {
  it("refuses no token and a wrong one in every form; accepts the right one in every form", async () => {
    const s = await observability(TOKEN);
    try {
      const port = s.server.port;
      const wrong: Record<string, string>[] = [
        {},
        { authorization: "Bearer " },
        { authorization: `Bearer ${TOKEN}x` },
        { authorization: `Bearer ${TOKEN.slice(0, -1)}` },
        { authorization: `Basic ${Buffer.from(`u:${TOKEN}`).toString("base64")}` },
        { authorization: TOKEN },
        { cookie: "cairn_token=wrong" },
        { cookie: `cairn_token=${TOKEN.toUpperCase()}` },
        { cookie: "cairn_token=%E0%A4%A" },
      ];
      for (const path of [OUTPUT, "/", "/api/databases", "/metrics"]) {
        for (const headers of wrong) {
          const r = await get(port, path, headers);
          assert.equal(r.status, 401, `${path} with ${JSON.stringify(headers)}: ${r.status}`);
          assert.doesNotMatch(r.body, new RegExp(SECRET));
          assert.equal(r.headers["set-cookie"], undefined);
        }
        assert.equal((await get(port, `${path}${path.includes("?") ? "&" : "?"}token=nope`)).status, 401, `${path}?token=nope`);
      }
      // The right token: as a bearer, as ?token= (which sets the HttpOnly cookie), as that cookie.
      const bearer = await get(port, OUTPUT, { authorization: `Bearer ${TOKEN}` });
      assert.equal(bearer.status, 200);
      assert.match(bearer.body, new RegExp(SECRET));
      const home = await get(port, `/?token=${TOKEN}`);
      assert.equal(home.status, 200);
      const cookie = String(home.headers["set-cookie"]);
      assert.match(cookie, new RegExp(`^cairn_token=${TOKEN}; HttpOnly; SameSite=Strict; Path=/$`));
      assert.match(String(home.headers["content-security-policy"]), /default-src 'self'; style-src 'self'; script-src 'self'/);
      const viaCookie = await get(port, OUTPUT, { cookie: cookie.split(";")[0]! });
      assert.equal(viaCookie.status, 200);
      assert.match(viaCookie.body, new RegExp(SECRET));
      assert.equal((await get(port, "/metrics", { authorization: `Bearer ${TOKEN}` })).status, 200, "/metrics with the token");
      // Probes need nothing; nothing changes state.
      assert.equal((await get(port, "/healthz")).status, 200);
      assert.equal((await get(port, "/readyz")).status, 200);
      assert.equal((await get(port, OUTPUT, { authorization: `Bearer ${TOKEN}` }, "POST")).status, 405);
      // A right token does not excuse a foreign Host.
      assert.equal((await get(port, OUTPUT, { host: "evil.example", authorization: `Bearer ${TOKEN}` })).status, 421);
    } finally {
      await s.close();
    }
  });

  it("cairn ui's own server: the same gate", async () => {
    const storage = createSqliteStorage({ dataDir });
    const page = createTimelineHandler({ storage, databases: async () => [DB] });
    let server: PageServer | null = null;
    try {
      server = await startPageServer("127.0.0.1:0", page, { access: { allowHosts: [], token: TOKEN } });
      assert.equal((await get(server.port, OUTPUT, { host: `evil.example:${server.port}`, authorization: `Bearer ${TOKEN}` })).status, 421);
      assert.equal((await get(server.port, OUTPUT)).status, 401);
      assert.equal((await get(server.port, OUTPUT, { authorization: "Bearer wrong-token-wrong-token" })).status, 401);
      const ok = await get(server.port, OUTPUT, { authorization: `Bearer ${TOKEN}` });
      assert.equal(ok.status, 200);
      assert.match(ok.body, new RegExp(SECRET));
    } finally {
      await server?.close();
      await page.close();
      await storage.close();
    }
  });

  it("decides: a given token everywhere, a generated one off loopback, --no-auth says what it exposes, short tokens refused", () => {
    const base = { allowHosts: [], exposes: "/metrics", noAuth: false };
    assert.equal(decideAccess({ ...base, bindHost: "127.0.0.1", token: undefined }).policy.token, null);
    assert.equal(decideAccess({ ...base, bindHost: "::1", token: undefined }).policy.token, null);
    assert.equal(decideAccess({ ...base, bindHost: "127.0.0.1", token: TOKEN }).policy.token, TOKEN);
    for (const bindHost of ["0.0.0.0", "::", "10.0.0.5", "cairn.internal"]) {
      const d = decideAccess({ ...base, bindHost, token: undefined, generate: () => "generated-token-generated-token" });
      assert.equal(d.policy.token, "generated-token-generated-token", bindHost);
      assert.equal(d.notice!.split("generated-token-generated-token").length, 2, "the token appears once");
    }
    const open = decideAccess({ ...base, bindHost: "0.0.0.0", token: undefined, noAuth: true });
    assert.equal(open.policy.token, null);
    assert.match(open.notice!, /warning: --no-auth: \/metrics on 0\.0\.0\.0 answer anyone/);
    assert.throws(() => decideAccess({ ...base, bindHost: "0.0.0.0", token: "short" }), /at least 16 characters/);
    assert.throws(() => decideAccess({ ...base, bindHost: "0.0.0.0", token: TOKEN, noAuth: true }), /contradicts/);
    assert.throws(() => decideAccess({ ...base, bindHost: "0.0.0.0", token: undefined, allowHosts: ["a/b"] }), /--allow-host/);
  });
});

describe("the cairn command", () => {
  const script = join(t.dir, "idle.json");
  before(() => writeFileSync(script, JSON.stringify({ rounds: [] })));
  const storageFlags = ["--db", DB, "--data-dir", dataDir];

  async function listening(p: Spawned, re: RegExp): Promise<number> {
    const m = await until(`the server to listen (${re})`, () => re.exec(p.err()) ?? (p.child.exitCode !== null ? new Error(p.err()) : undefined));
    if (m instanceof Error) throw m;
    return Number(m[1]);
  }

  it("cairn ui on 0.0.0.0 without a token prints a generated one once, then requires it", async () => {
    const ui = spawnCairn(["ui", ...storageFlags, "--listen", "0.0.0.0:0"], children, { CAIRN_UI_TOKEN: "" });
    try {
      const port = await listening(ui, /at http:\/\/0\.0\.0\.0:(\d+)\//);
      const token = /made one \(shown once, nowhere else\): (\S+)/.exec(ui.err())![1]!;
      assert.ok(token.length >= 40, token);
      assert.equal(ui.err().split(token).length, 2, `the token is printed once:\n${ui.err()}`);
      assert.equal((await get(port, OUTPUT)).status, 401);
      assert.equal((await get(port, OUTPUT, { authorization: "Bearer not-the-generated-token" })).status, 401);
      assert.equal((await get(port, OUTPUT, { host: `evil.example:${port}`, authorization: `Bearer ${token}` })).status, 421);
      const ok = await get(port, OUTPUT, { authorization: `Bearer ${token}` });
      assert.equal(ok.status, 200);
      assert.match(ok.body, new RegExp(SECRET));
    } finally {
      ui.child.kill("SIGTERM");
      await ui.exit;
    }
  });

  it("cairn ui --no-auth on 0.0.0.0 warns what it exposes and serves without a token; a token from a file is required", async () => {
    const open = spawnCairn(["ui", ...storageFlags, "--listen", "0.0.0.0:0", "--no-auth"], children, { CAIRN_UI_TOKEN: "" });
    try {
      const port = await listening(open, /at http:\/\/0\.0\.0\.0:(\d+)\//);
      assert.match(open.err(), /warning: --no-auth: the timeline page and every run's transcripts .* on 0\.0\.0\.0 answer anyone who can reach this address/);
      assert.doesNotMatch(open.err(), /made one/);
      assert.equal((await get(port, OUTPUT)).status, 200);
      assert.equal((await get(port, OUTPUT, { host: "evil.example" })).status, 421, "--no-auth keeps the Host check");
    } finally {
      open.child.kill("SIGTERM");
      await open.exit;
    }
    const file = join(t.dir, "token");
    writeFileSync(file, `${TOKEN}\n`);
    const tokened = spawnCairn(["ui", ...storageFlags, "--listen", "127.0.0.1:0", "--token-file", file], children, { CAIRN_UI_TOKEN: "" });
    try {
      const port = await listening(tokened, /at http:\/\/127\.0\.0\.1:(\d+)\//);
      assert.doesNotMatch(tokened.err(), new RegExp(TOKEN), "a given token is never printed");
      assert.equal((await get(port, OUTPUT)).status, 401);
      assert.equal((await get(port, OUTPUT, { authorization: `Bearer ${TOKEN}` })).status, 200);
    } finally {
      tokened.child.kill("SIGTERM");
      await tokened.exit;
    }
  });

  it("cairn serve: no transcripts on the metrics port without --ui; with --ui and a token, the gate holds", async () => {
    const plain = spawnCairn(["serve", ...storageFlags, "--model", `scripted:${script}`, "--listen", "127.0.0.1:0"], children, { CAIRN_UI_TOKEN: "" });
    try {
      const port = await listening(plain, /metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/);
      for (const path of [OUTPUT, "/", `/api/timeline?db=${DB}`, `/api/stream?db=${DB}`]) {
        const r = await get(port, path);
        assert.equal(r.status, 404, path);
        assert.match(r.body, /only with `cairn serve --ui`/);
      }
      assert.equal((await get(port, "/metrics")).status, 200);
      assert.equal((await get(port, "/metrics", { host: "evil.example" })).status, 421);
    } finally {
      plain.child.kill("SIGTERM");
      assert.equal((await plain.exit).code, 0, plain.err());
    }
    const ui = spawnCairn(["serve", ...storageFlags, "--model", `scripted:${script}`, "--listen", "127.0.0.1:0", "--ui"], children, { CAIRN_UI_TOKEN: TOKEN, CAIRN_ALLOW_HOST: "cairn.internal" });
    try {
      const port = await listening(ui, /metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/);
      assert.doesNotMatch(ui.err(), new RegExp(TOKEN));
      assert.equal((await get(port, OUTPUT)).status, 401);
      assert.equal((await get(port, OUTPUT, { authorization: "Bearer wrong-token-wrong-token" })).status, 401);
      assert.equal((await get(port, OUTPUT, { host: "evil.example", authorization: `Bearer ${TOKEN}` })).status, 421);
      assert.equal((await get(port, "/metrics")).status, 401);
      assert.equal((await get(port, "/healthz", { host: "evil.example" })).status, 200, "probes answer anyone");
      const ok = await get(port, OUTPUT, { host: "cairn.internal", authorization: `Bearer ${TOKEN}` });
      assert.equal(ok.status, 200, "CAIRN_ALLOW_HOST adds a name");
      assert.match(ok.body, new RegExp(SECRET));
      assert.equal((await get(port, "/metrics", { authorization: `Bearer ${TOKEN}` })).status, 200);
    } finally {
      ui.child.kill("SIGTERM");
      assert.equal((await ui.exit).code, 0, ui.err());
    }
  });

  it("refuses bad access flags before anything listens", async () => {
    const short = spawnCairn(["ui", ...storageFlags, "--listen", "0.0.0.0:0"], children, { CAIRN_UI_TOKEN: "short" });
    const r1 = await short.exit;
    assert.equal(r1.code, 2);
    assert.match(short.err(), /at least 16 characters/);
    const both = spawnCairn(["serve", ...storageFlags, "--model", `scripted:${script}`, "--listen", "0.0.0.0:0", "--no-auth"], children, { CAIRN_UI_TOKEN: TOKEN });
    const r2 = await both.exit;
    assert.equal(r2.code, 2);
    assert.match(both.err(), /--no-auth contradicts/);
  });
});
