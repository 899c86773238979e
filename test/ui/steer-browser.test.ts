/**
 * The timeline page in a real browser (playwright-core driving Debian's chromium) while an operator
 * steers a run: the page is opened once, then the run's cell waits for approval, the run is paused,
 * the cell approved, the run unpaused and it ends. Each change must appear on the open page without
 * a reload. The owner is a harness on sqlite in this process; the page server reads the same
 * database as `cairn ui` does.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { Harness } from "../../src/harness/harness.js";
import { createTimelineHandler } from "../../src/ui/server.js";
import { startPageServer } from "../../src/ui/http.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { adds, cmd, conclude, scripted, tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";

type Doc = { document: { querySelector(s: string): { getAttribute(n: string): string | null; textContent: string | null; className: string } | null } };

const t = tempDir("cairn-steer-ui-");
const storage = createSqliteStorage({ dataDir: join(t.dir, "data") });
const target = join(t.dir, "gated");
let h: Harness;
let server: Awaited<ReturnType<typeof startPageServer>>;
let browser: BrowserContext | undefined;
let profile = "";
let page: Page;
let session = "";
const problems: string[] = [];

before(async () => {
  h = await Harness.open({
    storage,
    name: "steer-ui",
    model: scripted([adds(0, 1, [cmd("touch", target)]), adds(1, 2, [conclude("success", "touched it")])]),
    workDir: t.dir,
    limits: { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 },
  });
  server = await startPageServer("127.0.0.1:0", createTimelineHandler({ storage, databases: async () => ["steer-ui"], pollMs: 100 }));
  profile = mkdtempSync(join(tmpdir(), "cairn-chromium-"));
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CAIRN_CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 640 },
    timeout: 120_000,
  });
  page = await browser.newPage();
  page.setDefaultTimeout(60_000);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
});
after(async () => {
  await browser?.close().catch(() => undefined);
  await server?.close().catch(() => undefined);
  await h?.close().catch(() => undefined);
  await storage.close().catch(() => undefined);
  if (profile) rmSync(profile, { recursive: true, force: true });
  t.cleanup();
});

/** Waits until the open page's run section shows `status` and its meta line matches `meta`. */
async function shows(status: string, meta: RegExp): Promise<void> {
  await page.waitForFunction(
    ([st, src]) => {
      const d = (globalThis as unknown as Doc).document;
      const sec = d.querySelector("section.session[data-session=s1]");
      const m = d.querySelector("section.session[data-session=s1] .meta");
      return sec?.getAttribute("data-status") === st && new RegExp(src!).test(m?.textContent ?? "");
    },
    [status, meta.source],
  );
}

const cellBar = (): Promise<string> => page.$eval(".row[data-kind=cell][data-id='1'] .bar", (e) => e.className);

describe("the open page follows a run paused, approved and unpaused", () => {
  it("shows the cell waiting for approval", async () => {
    session = await h.start({ goal: "touch a gated file", cwd: t.dir, approval: [{ kind: "all" }] });
    await page.goto(`${server.url}/`);
    await page.evaluate(() => ((globalThis as unknown as { marker?: number }).marker = 7));
    await shows("running", /waits for approval: cell 1/);
    assert.match(await cellBar(), /\bawaiting\b/);
    assert.match((await page.getAttribute(".row[data-kind=cell][data-id='1']", "title"))!, /approval \(rule all\): waiting/);
  });

  it("shows the pause live", async () => {
    await h.steer(session, "p1", { action: "pause", reason: "reviewing the command", now: false });
    await shows("paused", /PAUSED since .*: reviewing the command · waits for approval: cell 1/);
    assert.match((await page.textContent("section.session[data-session=s1] h2"))!, /s1\s*paused/);
  });

  it("shows the approval live; paused, the cell still does not run", async () => {
    await h.steer(session, "a1", { action: "approve", cell_id: 1, reason: "ok" });
    await shows("paused", /PAUSED since/);
    await page.waitForFunction(() => !/waits for approval/.test((globalThis as unknown as Doc).document.querySelector("section.session[data-session=s1] .meta")?.textContent ?? "x"));
    assert.match(await cellBar(), /\bqueued\b/);
    await h.settled();
    assert.equal(existsSync(target), false);
  });

  it("shows the unpause and the run's end live, on the same page", async () => {
    await h.steer(session, "u1", { action: "unpause", reason: "" });
    await until("the run to end", () => h.session(session)?.terminal !== null);
    await shows("success", /touched it/);
    assert.match(await cellBar(), /\bsuccess\b/);
    assert.equal(existsSync(target), true);
    assert.equal(await page.evaluate(() => (globalThis as unknown as { marker?: number }).marker), 7, "no reload");
    const marks = await page.$$eval("section.session[data-session=s1] .row.marks .mark", (els) => els.map((e) => e.getAttribute("title")));
    for (const text of [/waits for approval \(rule all\)/, /paused by an operator: reviewing the command/, /cell 1 approved: ok/, /unpaused by an operator/]) {
      assert.ok(marks.some((m) => text.test(m ?? "")), `a mark matches ${text}: ${JSON.stringify(marks)}`);
    }
    assert.deepEqual(problems, []);
  });
});
