/**
 * `cairn log` and the page's HTTP side on the memory adapter, in one process: refused patches and
 * failed attempts rendered with their reasons, --follow from a reader while the harness commits,
 * --json equal to the storage, the page mounted next to /metrics, its stream (a snapshot, then
 * updates as commits land) and its token.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { stripVTControlCharacters } from "node:util";
import { Harness } from "../../src/harness/harness.js";
import { ModelError, type Model, type ModelReply, type ModelRequest } from "../../src/model/contract.js";
import { Metrics } from "../../src/observability/metrics.js";
import { startObservabilityServer } from "../../src/observability/server.js";
import { printLog } from "../../src/cli/log.js";
import { createTimelineHandler } from "../../src/ui/server.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, tempDir } from "../harness/support.js";
import type { LogEvent } from "../../src/state/events.js";
import { withHarness } from "../support/harness.js";

const t = tempDir("cairn-timeline-");
after(() => t.cleanup());

/**
 * Round 1: a refused patch, then a good one. Round 2: a lost response, then the conclusion. While
 * `hold.until` is set, round 2 waits for it: a test that must see the run in progress holds it there.
 */
function trickyModel(hold: { until: Promise<void> | null } = { until: null }): Model {
  return {
    name: "tricky",
    async step(req: ModelRequest): Promise<ModelReply> {
      const usage = { input_tokens: 100, output_tokens: 10 };
      const rev = req.state.revision;
      if (rev === 1 && hold.until !== null) await hold.until;
      if (rev === 0 && req.attempt === 1) return { patch: [{ op: "test", path: "/revision", value: 7 }], usage };
      if (rev === 0) return { patch: adds(0, 1, [cmd("sh", "-c", "echo hello; echo oops >&2")]), usage };
      if (rev === 1 && req.attempt === 1) throw new ModelError("transport", "connection reset by the test", { retryable: true, usage: null });
      return { patch: adds(1, 2, [conclude("success", "said hello")]), usage };
    },
  };
}

async function collect(storage: ReturnType<typeof createMemoryStorage>, name: string): Promise<LogEvent[]> {
  const r = await storage.reader(name);
  try {
    return await r.read(0);
  } finally {
    await r.close();
  }
}

describe("cairn log on the memory adapter", () => {
  it("follows a run from a reader in the same process, with refusals, failed attempts, output and the end", async () => {
    const storage = createMemoryStorage();
    await withHarness({ storage, name: "mem", model: trickyModel(), workDir: t.dir }, async (h) => {
      const s = await h.start({ goal: "say hello", cwd: t.dir });
      const text: string[] = [];
      const json: string[] = [];
      const stop = new AbortController();
      const base = { storage, name: "mem", session: s, follow: true, color: false, pollMs: 20, signal: stop.signal };
      const following = Promise.all([printLog({ ...base, json: false }, (l) => text.push(l)), printLog({ ...base, json: true }, (l) => json.push(l))]);
      const result = await h.wait(s);
      assert.equal(result.result, "success");
      const timer = setTimeout(() => stop.abort(), 60_000); // a hang guard: --follow --session ends by itself
      await following;
      clearTimeout(timer);
      assert.equal(stop.signal.aborted, false, "--follow stopped because the run ended");
      const all = text.join("\n");
      assert.match(all, /round 1 {4}patch refused \(attempt 1, \w+\): .*revision/);
      assert.match(all, /round 1 {4}accepted: revision 1; 2 attempt\(s\), model \d+ ms, tokens 200 in \/ 20 out, 1 refused/);
      assert.match(all, /round 2 {4}attempt 1 failed \(will retry\): .*connection reset by the test/);
      assert.match(all, /cell 1 {5}cmd started on \S+ epoch \d+ \(pid \d+, sandbox (bwrap, network off|none)\): sh -c echo hello; echo oops >&2/);
      assert.match(all, /│ hello/);
      assert.match(all, /│ oops/);
      assert.match(all, /cell 1 {5}success exit 0/);
      assert.match(all, /end {8}run s1 success/);
      assert.deepEqual(json.map((l) => JSON.parse(l)), await collect(storage, "mem"));
    });
  });
});

/** Reads server-sent events from `url` until `done` says stop; returns them. */
async function readStream(url: string, init: RequestInit, done: (events: { event: string; data: unknown }[]) => boolean): Promise<{ event: string; data: unknown }[]> {
  const ac = new AbortController();
  const guard = setTimeout(() => ac.abort(), 60_000);
  const res = await fetch(url, { ...init, signal: ac.signal });
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /text\/event-stream/);
  const events: { event: string; data: unknown }[] = [];
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buf += decoder.decode(chunk, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const event = /^event: (.*)$/m.exec(block)?.[1];
        const data = /^data: (.*)$/m.exec(block)?.[1];
        if (event !== undefined && data !== undefined) events.push({ event, data: JSON.parse(data) });
      }
      if (done(events)) break;
    }
  } finally {
    clearTimeout(guard);
    ac.abort();
  }
  return events;
}

describe("the page next to /metrics", () => {
  it("serves /, the timeline and a live stream on the same port as /metrics, read-only, behind a token", async () => {
    const storage = createMemoryStorage();
    const hold: { until: Promise<void> | null } = { until: null };
    const h = await Harness.open({ storage, name: "web", model: trickyModel(hold), workDir: t.dir });
    const page = createTimelineHandler({ storage, databases: async () => ["web"], pollMs: 20 });
    const server = await startObservabilityServer({
      listen: "127.0.0.1:0",
      metrics: new Metrics({ adapter: "memory" }),
      ready: () => ({ ready: true, reason: "ok" }),
      routes: page,
      access: { allowHosts: [], token: "tok" },
    });
    try {
      const s1 = await h.start({ goal: "first run", cwd: t.dir });
      await h.wait(s1);
      assert.equal((await fetch(`${server.url}/metrics`)).status, 401, "/metrics needs the token in force");
      assert.equal((await fetch(`${server.url}/metrics`, { headers: { authorization: "Bearer tok" } })).status, 200);
      assert.equal((await fetch(`${server.url}/healthz`)).status, 200, "probes need no token");
      assert.equal((await fetch(`${server.url}/`)).status, 401);
      assert.equal((await fetch(`${server.url}/api/databases`, { headers: { cookie: "cairn_token=wrong" } })).status, 401);
      const home = await fetch(`${server.url}/?token=tok`);
      assert.equal(home.status, 200);
      assert.match(home.headers.get("set-cookie") ?? "", /cairn_token=tok; HttpOnly; SameSite=Strict/);
      const html = await home.text();
      assert.match(html, /<script src="\/ui\/app\.js" defer><\/script>/);
      assert.doesNotMatch(html, /https?:\/\//, "nothing from another host");
      const auth = { headers: { cookie: "cairn_token=tok" } };
      for (const asset of ["/ui/app.js", "/ui/app.css"]) assert.equal((await fetch(`${server.url}${asset}`, auth)).status, 200, asset);
      assert.deepEqual(await (await fetch(`${server.url}/api/databases`, auth)).json(), { databases: ["web"] });
      assert.equal((await fetch(`${server.url}/api/timeline?db=other`, auth)).status, 404);
      assert.equal((await fetch(`${server.url}/`, { method: "POST", ...auth })).status, 405);

      const tl = (await (await fetch(`${server.url}/api/timeline?db=web`, auth)).json()) as { head: number; sessions: { id: string; status: string; rounds: { rejected: unknown[] }[]; cells: { id: number; result: string; sandbox: string | null; network: string | null }[]; owners: { epoch: number }[] }[] };
      assert.equal(tl.sessions[0]!.status, "success");
      assert.deepEqual(tl.sessions[0]!.cells.map((c) => [c.sandbox, c.network]), [[h.sandbox.kind, h.sandbox.kind === "bwrap" ? "off" : "host"]], "where each cell ran is on the page");
      assert.equal(tl.sessions[0]!.rounds[0]!.rejected.length, 1);
      assert.deepEqual(tl.sessions[0]!.cells.map((c) => [c.id, c.result]), [[1, "success"]]);
      assert.deepEqual(tl.sessions[0]!.owners.map((o) => o.epoch), [h.epoch]);
      assert.match(await (await fetch(`${server.url}/api/output?db=web&session=s1&cell=1`, auth)).text(), /hello/);
      assert.match(await (await fetch(`${server.url}/api/patch?db=web&session=s1&round=1`, auth)).text(), /"\/cells\/-"/);

      // The stream: the snapshot first, then updates as a second run commits. The second run's round
      // 2 waits until an update showed the run in progress: a run that ended within one poll of the
      // stream would give one update only (seen once in a full run).
      let started = false;
      let inProgressSeen = (): void => undefined;
      hold.until = new Promise<void>((resolve) => (inProgressSeen = resolve));
      const events = await readStream(`${server.url}/api/stream?db=web`, auth, (ev) => {
        if (!started && ev.length >= 1) {
          started = true;
          void h.start({ goal: "second run", cwd: t.dir });
        }
        if (ev.some((e) => e.event === "update" && (e.data as { sessions: { id: string }[] }).sessions.some((s) => s.id === "s2"))) inProgressSeen();
        return ev.some((e) => e.event === "update" && (e.data as { sessions: { id: string; header: { status: string } }[] }).sessions.some((s) => s.id === "s2" && s.header.status === "success"));
      });
      assert.equal(events[0]!.event, "snapshot");
      assert.deepEqual((events[0]!.data as { sessions: { id: string }[] }).sessions.map((s) => s.id), ["s1"]);
      const updates = events.filter((e) => e.event === "update").map((e) => e.data as { head: number; sessions: { id: string; cells: unknown[] }[] });
      assert.ok(updates.length >= 2, "several updates while the run went on");
      const s2Status = (u: { sessions: unknown[] }) => (u.sessions as { id: string; header?: { status?: string } }[]).find((s) => s.id === "s2")?.header?.status;
      assert.ok(
        updates.slice(0, -1).some((u) => s2Status(u) !== undefined && s2Status(u) !== "success"),
        `an update showed the second run in progress before it ended: ${JSON.stringify(updates.map(s2Status))}`,
      );
      const heads = updates.map((u) => u.head);
      assert.deepEqual(heads, [...heads].sort((a, b) => a - b));
      assert.ok(updates.every((u) => u.sessions.every((s) => s.id === "s2")), "only what changed is sent");
    } finally {
      await h.close();
      await page.close();
      await server.close();
    }
  });

  it("the text rendering aligns columns and colours only when asked", async () => {
    const storage = createMemoryStorage();
    await withHarness({ storage, name: "c", model: trickyModel(), workDir: t.dir }, async (h) => {
      await h.wait(await h.start({ goal: "colours", cwd: t.dir }));
      const plain: string[] = [];
      const coloured: string[] = [];
      const base = { storage, name: "c", follow: false, json: false, pollMs: 20, signal: new AbortController().signal };
      await printLog({ ...base, color: false }, (l) => plain.push(l));
      await printLog({ ...base, color: true }, (l) => coloured.push(l));
      assert.ok(coloured.some((l) => l.includes("\u001b[")));
      assert.ok(plain.every((l) => !l.includes("\u001b[")));
      assert.deepEqual(coloured.map((l) => stripVTControlCharacters(l)), plain, "colour changes nothing else");
      // Columns: time (11, right-aligned), two spaces, session (5), subject (10), a space, the text.
      for (const l of plain.filter((x) => /^\s*\+\d/.test(x))) {
        assert.match(l.slice(0, 11), /^ *\+\d+:\d\d\.\d{3}$/, l);
        assert.equal(l.slice(11, 18), "  s1   ", l);
        assert.equal(l[28], " ", l);
        assert.notEqual(l[29], " ", l);
      }
    });
  });
});
