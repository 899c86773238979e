/**
 * The timeline page in a real browser: Playwright (playwright-core) driving Debian's chromium against
 * `cairn ui` (a reader) on a real run with a failure, an UnknownExecution and a failover between two
 * processes. Checks the page's elements and their order, a cell's output and a round's patch on
 * click, a live update arriving while the run goes on, the token, and that nothing is fetched from
 * anywhere but the server. Keeps a screenshot in artifacts/ui/timeline.png.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { ROOT } from "../cli/support.js";
import { event, identity, type NewEvent } from "../../src/state/events.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { createTimelineHandler } from "../../src/ui/server.js";
import { startPageServer } from "../../src/ui/http.js";
import { tempDir } from "../harness/support.js";
import { killAll, runScenario, spawnCairn, until, type Scenario, type Spawned } from "./scenario.js";

const TOKEN = "s3cret-token-of-the-page";
const ARTIFACTS = join(ROOT, "artifacts", "ui");
const t = tempDir("cairn-ui-");
const children: ChildProcess[] = [];
let sc: Scenario;
let ui: Spawned;
let base = "";
let browser: BrowserContext | undefined;
let profile = "";
let page: Page;
const requests: string[] = [];
const problems: string[] = [];

/** Launches Debian's chromium with a fresh profile: no network beyond what the page asks for. */
async function launchChromium(dir: string): Promise<BrowserContext> {
  return chromium.launchPersistentContext(dir, {
    executablePath: process.env.CAIRN_CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 640 },
    timeout: 120_000,
  });
}

before(async () => {
  sc = await runScenario(t.dir, children);
  ui = spawnCairn(["ui", ...sc.flags, "--listen", "127.0.0.1:0"], children, { CAIRN_UI_TOKEN: TOKEN });
  await until("cairn ui to listen", () => /http:\/\/127\.0\.0\.1:\d+/.test(ui.err()) || ui.child.exitCode !== null);
  assert.equal(ui.child.exitCode, null, ui.err());
  base = /(http:\/\/127\.0\.0\.1:\d+)/.exec(ui.err())![1]!;
  profile = mkdtempSync(join(tmpdir(), "cairn-chromium-"));
  browser = await launchChromium(profile);
  page = await browser.newPage();
  page.setDefaultTimeout(60_000);
  page.on("request", (r) => requests.push(r.url()));
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
});
after(async () => {
  await browser?.close().catch(() => undefined);
  killAll(children);
  if (profile) rmSync(profile, { recursive: true, force: true });
  t.cleanup();
});

/**
 * A synthetic run of `rounds` rounds with two cells each (every third one an error), starting at
 * `t0`, one event every 10 ms: as the storage holds it, without running anything.
 */
function syntheticRounds(from: number, rounds: number, t0: number): NewEvent[] {
  const out: NewEvent[] = [];
  let tick = 0;
  const at = (): string => new Date(t0 + 10 * tick++).toISOString();
  for (let n = from; n < from + rounds; n++) {
    const turn = `s1:t${n}`;
    const ids = [2 * n - 1, 2 * n];
    const patch = [{ op: "test", path: "/revision", value: n - 1 }, ...ids.map((id) => ({ op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv: ["echo", `cell ${id}`] } }))];
    out.push(event("turn_prepared", "s1", identity.turn(turn), at(), { turn, n, revision: n - 1, delivered: [] }));
    out.push(event("model_attempt", "s1", identity.attempt(turn, 1), at(), { turn, attempt: 1 }));
    out.push(event("model_response", "s1", identity.response(turn, 1), at(), { turn, attempt: 1, patch, usage: { input_tokens: 1000, output_tokens: 50 } }));
    out.push(event("patch_accepted", "s1", identity.patch(turn), at(), { turn, attempt: 1, patch, revision: n, new_cell_ids: ids, removed_ids: [], consumed: [] }));
    for (const id of ids) out.push(event("execution_queued", "s1", identity.queued("s1", id), at(), { cell_id: id, kind: "cmd" }));
    for (const id of ids) {
      out.push(event("execution_started", "s1", identity.execution("s1", id), at(), { cell_id: id, host: "load-host", boot_id: "b", pid: 1000 + id, pgid: 1000 + id, start_time: "1" }));
      out.push(event("execution_output", "s1", identity.output("s1", id, 0), at(), { cell_id: id, n: 0, stream: "stdout", data: `cell ${id}\n` }));
      const error = id % 3 === 0;
      out.push(event("execution_finished", "s1", identity.finished("s1", id), at(), { cell_id: id, result: error ? "error" : "success", exit_code: error ? 1 : 0, signal: null, duration_ms: 10, output_bytes: 8, dropped_bytes: 0, detail: null, unknown: null }));
    }
  }
  return out;
}

async function commitAll(db: { commit(e: readonly NewEvent[]): Promise<unknown> }, events: readonly NewEvent[]): Promise<void> {
  for (let i = 0; i < events.length; i += 100) await db.commit(events.slice(i, i + 100));
}

/** What the page's functions use of the browser (the DOM library is not in this project's types). */
interface Browser {
  document: { querySelector(sel: string): { textContent: string | null; getAttribute(name: string): string | null } | null };
}

/** What the geometry check uses of the browser. */
interface Geometry {
  document: { querySelector(sel: string): { getBoundingClientRect(): { left: number } } | null };
}

/** The rows of session s1 as the page shows them: [kind, label, outcome]. */
async function rows(): Promise<[string, string, string][]> {
  return page.$$eval("section.session[data-session=s1] .row[data-kind]", (els) =>
    els.map((e) => [e.getAttribute("data-kind")!, e.querySelector(".label")!.textContent!, e.querySelector(".bar")!.getAttribute("data-outcome")!] as [string, string, string]),
  );
}

describe("the timeline page in chromium", () => {
  it("needs the token when one is set", async () => {
    const denied = await fetch(`${base}/`);
    assert.equal(denied.status, 401);
    assert.match(await denied.text(), /token/);
    assert.equal((await fetch(`${base}/api/timeline?db=${sc.db}`)).status, 401);
    assert.equal((await fetch(`${base}/api/timeline?db=${sc.db}`, { headers: { authorization: `Bearer ${TOKEN}` } })).status, 200);
    assert.equal((await fetch(`${base}/api/timeline?db=${sc.db}`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` } })).status, 405, "read-only");
  });

  it("shows the run: rounds and cells in order, coloured by outcome, the UnknownExecution marked, both owners as lines with the host", async () => {
    await page.goto(`${base}/?token=${TOKEN}`);
    await page.waitForSelector("section.session[data-session=s1] .row[data-kind=cell][data-id='4']");
    await page.evaluate(() => ((globalThis as unknown as { marker: number }).marker = 42));
    assert.equal(await page.textContent("nav#databases a.current"), sc.db);
    assert.equal(await page.getAttribute("section.session[data-session=s1]", "data-status"), "running");
    const r = await rows();
    assert.deepEqual(
      r.map(([kind, label]) => `${kind}:${label.split(":")[0]}`),
      ["round:round 1", "cell:cell 1 cmd", "round:round 2", "cell:cell 2 cmd", "round:round 3", "cell:cell 4 cmd"],
      "rows in time order: each round, then the cells it added",
    );
    assert.deepEqual(r.map(([, , outcome]) => outcome), ["accepted", "error", "accepted", "unknown", "accepted", "running"]);
    assert.match(r[1]![1], /cell 1 cmd: sh -c echo 'checking the build'/);
    // The UnknownExecution: marked on its row, resolved by note 3.
    assert.equal(await page.textContent(".row[data-kind=cell][data-id='2'] .unknown-mark"), "?✓");
    assert.match((await page.getAttribute(".row[data-kind=cell][data-id='2']", "title"))!, /UnknownExecution: .*resolved by note 3/);
    assert.equal(await page.$$eval(".unknown-mark", (els) => els.length), 1);
    // Where each cell ran: its row says whether it was sandboxed, and an unsandboxed one is marked.
    const sandbox = await page.getAttribute(".row[data-kind=cell][data-id='1']", "data-sandbox");
    assert.ok(sandbox === "bwrap" || sandbox === "none", `data-sandbox ${sandbox}`);
    assert.match((await page.getAttribute(".row[data-kind=cell][data-id='1']", "title"))!, sandbox === "bwrap" ? /, sandboxed \(network off\)/ : /, NOT sandboxed/);
    assert.equal(await page.$$eval(".row.unsandboxed", (els) => els.length), sandbox === "none" ? 3 : 0);
    // Ownership: epoch 1 (A) from the start, epoch 2 (B) where it took over, with the host.
    const owners = await page.$$eval("section.session[data-session=s1] .owner-line", (els) => els.map((e) => [e.getAttribute("data-epoch"), e.getAttribute("data-host"), e.textContent]));
    assert.deepEqual(owners.map((o) => o[0]), ["1", "2"]);
    for (const o of owners) {
      assert.equal(o[1], hostname());
      assert.match(o[2]!, new RegExp(`epoch \\d · ${hostname()}`));
    }
    // The takeover line sits after cell 2 began and before cell 4 began.
    // (No named functions inside page callbacks: the test's transpiler would wrap them in a helper the page lacks.)
    // All three in one evaluation: the run is live, so the axis's span grows with the clock and every
    // position moves left between two separate reads.
    const [cell2, owner2, cell4] = await page.evaluate(
      (sels) => sels.map((sel) => (globalThis as unknown as Geometry).document.querySelector(sel)?.getBoundingClientRect().left ?? Number.NaN),
      [".row[data-id='2'][data-kind=cell] .bar", ".owner-line[data-epoch='2']", ".row[data-id='4'][data-kind=cell] .bar"],
    );
    const pos = { cell2: cell2!, owner2: owner2!, cell4: cell4! };
    assert.ok(pos.cell2 < pos.owner2 && pos.owner2 <= pos.cell4, JSON.stringify(pos));
    // Header, axis, legend.
    assert.match((await page.textContent("section.session[data-session=s1] h2"))!, /s1\s*running\s*Rebuild after a broken build/);
    assert.ok((await page.$$eval("section.session .axis .tick", (els) => els.length)) >= 2);
    assert.equal(await page.textContent("#live"), "live");
  });

  it("a click shows a cell's output, and a round's patch", async () => {
    await page.click(".row[data-kind=cell][data-id='1']");
    await page.waitForSelector("#detail:not([hidden])");
    assert.equal(await page.textContent("#detail-title"), "s1 cell 1: output");
    const out = (await page.textContent("#detail-body"))!;
    assert.match(out, /error exit 3/);
    assert.match(out, /checking the build\n(.|\n)*build broken|build broken(.|\n)*checking the build/);
    await page.click(".row[data-kind=round][data-id='2']");
    await page.waitForFunction(() => (globalThis as unknown as Browser).document.querySelector("#detail-title")!.textContent === "s1 round 2: patch");
    const patch = (await page.textContent("#detail-body"))!;
    assert.match(patch, /"op": "test"/);
    assert.match(patch, /long job/);
    await page.click("#detail-close");
    assert.equal(await page.isHidden("#detail"), true);
  });

  it("updates live while the run goes on: cell 4 finishes, round 4 and the end arrive without a reload", async () => {
    assert.equal(await page.$(".row[data-kind=round][data-id='4']"), null, "round 4 does not exist yet");
    sc.open();
    await page.waitForSelector(".row[data-kind=round][data-id='4']");
    await page.waitForFunction(() => (globalThis as unknown as Browser).document.querySelector("section.session[data-session=s1]")!.getAttribute("data-status") === "success");
    assert.equal(await page.evaluate(() => (globalThis as unknown as { marker?: number }).marker), 42, "the same page: no reload");
    const r = await rows();
    assert.deepEqual(r.map(([, , o]) => o), ["accepted", "error", "accepted", "unknown", "accepted", "success", "accepted"]);
    assert.equal((await sc.b.exit).code, 0, sc.b.err());
    // The end mark is in the marks row.
    assert.equal(await page.$$eval(".row.marks .mark.end", (els) => els.length), 1);
    mkdirSync(ARTIFACTS, { recursive: true });
    const shot = join(ARTIFACTS, "timeline.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`# screenshot: ${shot}`);
  });

  it("renders a run of 1,000 cells, and keeps answering while events stream in (times reported, not asserted)", async () => {
    const storage = createSqliteStorage({ dataDir: join(t.dir, "load") });
    const db = await storage.open("load");
    const t0 = Date.parse("2026-01-01T00:00:00Z");
    const server = await startPageServer("127.0.0.1:0", createTimelineHandler({ storage, databases: async () => ["load"], pollMs: 100 }));
    try {
      await db.commit([
        event("session_created", "s1", identity.session("s1"), new Date(t0).toISOString(), { goal: "a long run", cwd: "/work", validators: [], budgets: {} }),
        event("owner_claimed", "s1", identity.owner("s1", db.epoch), new Date(t0).toISOString(), { epoch: db.epoch, host: "load-host", boot_id: "b", pid: 1 }),
      ]);
      await commitAll(db, syntheticRounds(1, 500, t0 + 10));
      const p = await browser!.newPage();
      try {
        const start = Date.now();
        await p.goto(`${server.url}/`);
        await p.waitForFunction(() => (globalThis as unknown as { document: { querySelectorAll(s: string): { length: number } } }).document.querySelectorAll(".row[data-kind=cell]").length === 1000, undefined, { timeout: 120_000 });
        const loadMs = Date.now() - start;
        assert.equal(await p.$$eval(".row[data-kind=round]", (els) => els.length), 500);
        assert.equal(await p.$$eval(".row .bar.error", (els) => els.length), 333);
        // Stream 200 more cells in small commits; meanwhile the page must keep answering.
        const streaming = (async () => {
          const more = syntheticRounds(501, 100, t0 + 10 + 500 * 130 * 10);
          for (let i = 0; i < more.length; i += 13) await db.commit(more.slice(i, i + 13));
        })();
        const answers: number[] = [];
        let streamed = false;
        void streaming.finally(() => (streamed = true));
        while (!streamed) {
          const a = Date.now();
          await p.evaluate(() => 1);
          answers.push(Date.now() - a);
        }
        await streaming;
        await p.waitForFunction(() => (globalThis as unknown as { document: { querySelectorAll(s: string): { length: number } } }).document.querySelectorAll(".row[data-kind=cell]").length === 1200, undefined, { timeout: 120_000 });
        assert.ok(answers.length > 0);
        console.log(`# 1,000 cells: page loaded and drawn in ${loadMs} ms; while 1,300 events streamed in, the page answered ${answers.length} times, slowest ${Math.max(...answers)} ms (this machine, under its current load)`);
      } finally {
        await p.close();
      }
    } finally {
      await server.close();
      await db.close();
      await storage.close();
    }
  });

  it("fetched nothing but the server's own files, and logged no errors", () => {
    assert.ok(requests.length >= 4, requests.join("\n"));
    for (const u of requests) assert.ok(u.startsWith(`${base}/`), `no CDN, no other host: ${u}`);
    assert.deepEqual(problems, []);
  });
});
