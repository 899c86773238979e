/**
 * The two-opener race on the Durable Streams adapter, many times: two openers claim one database at
 * the same moment while its previous owner is still open. Whatever the interleaving at the server,
 * every open that completes holds its own epoch; the highest one commits; every other owner (the
 * previous one, the loser) is fenced on its next commit and writes nothing; an open that lost after
 * its claim fails as fenced. Both in this process (separate Storage objects, separate connections)
 * and as two separate OS processes started together.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { hasCode } from "../../src/errors.js";
import type { Database } from "../../src/storage/contract.js";
import { inbox, sessionCreated } from "../../src/storage/conformance/fixtures.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { assertWellFormed, devServer } from "./helpers.js";

const isFenced = (err: unknown) => hasCode(err, "reset") && (err as { reason?: string }).reason === "fenced";

async function logOf(url: string, name: string) {
  const s = createDurableStreamsStorage({ url });
  try {
    return await (await s.reader(name)).read(0);
  } finally {
    await s.close();
  }
}

describe("durable-streams: two openers racing", { timeout: 600_000 }, () => {
  it("in one process, 60 times: distinct epochs, the highest commits, every other owner is fenced and writes nothing", async () => {
    const server = await devServer("race");
    const storages = Array.from({ length: 3 }, () => createDurableStreamsStorage({ url: server.url }));
    let lostOpens = 0;
    try {
      for (let i = 0; i < 60; i++) {
        const name = `race-${i}`;
        const previous = await storages[0]!.open(name);
        await previous.commit([sessionCreated("s1")]);
        const settled = await Promise.allSettled([storages[1]!.open(name), storages[2]!.open(name)]);
        const opened: Database[] = [];
        for (const r of settled) {
          if (r.status === "fulfilled") opened.push(r.value);
          else {
            assert.ok(isFenced(r.reason), `an open that lost the race fails as fenced, got ${String(r.reason)}`);
            lostOpens++;
          }
        }
        assert.ok(opened.length >= 1, "at least one opener wins");
        const epochs = opened.map((d) => d.epoch);
        assert.equal(new Set(epochs).size, epochs.length, `distinct epochs: ${epochs.join(", ")}`);
        for (const e of epochs) assert.ok(e > previous.epoch, "above the previous owner's");
        const winner = opened.reduce((w, d) => (d.epoch > w.epoch ? d : w));
        for (const d of [previous, ...opened]) {
          if (d === winner) continue;
          await assert.rejects(d.commit([inbox("s1", `loser-${d.epoch}`)]), isFenced, `epoch ${d.epoch} (winner ${winner.epoch}) is fenced`);
        }
        assert.deepEqual(await winner.commit([inbox("s1", "winner")]), { firstSeq: 2, lastSeq: 2 });
        const log = await logOf(server.url, name);
        assertWellFormed(log, name);
        assert.deepEqual(log.map((e) => e.identity), [sessionCreated("s1").identity, inbox("s1", "winner").identity], "only the winner wrote after the race");
        for (const d of [previous, ...opened]) await d.close();
      }
      console.log(`# 60 races: ${lostOpens} opens lost after claiming (fenced), the rest completed with distinct epochs`);
    } finally {
      for (const s of storages) await s.close();
    }
  });

  it("as two OS processes started together, 10 times: one log, distinct epochs, only the highest epoch's commits after both claims", async () => {
    const server = await devServer("race-procs");
    const script = join(server.root, "racer.mts");
    const adapter = fileURLToPath(new URL("../../storage-adapters/durable-streams/index.ts", import.meta.url));
    const fixtures = fileURLToPath(new URL("../../src/storage/conformance/fixtures.ts", import.meta.url));
    writeFileSync(
      script,
      `import { createDurableStreamsStorage } from ${JSON.stringify(adapter)};
import { inbox } from ${JSON.stringify(fixtures)};
const [url, name, tag] = process.argv.slice(2);
const storage = createDurableStreamsStorage({ url });
const out = (o) => process.stdout.write(JSON.stringify(o) + "\\n");
try {
  const db = await storage.open(name);
  out({ opened: db.epoch });
  // Wait for the start line so both opens are done before either commits.
  await new Promise((r) => process.stdin.once("data", r));
  try { out({ committed: await db.commit([inbox("s1", tag)]), epoch: db.epoch }); }
  catch (err) { out({ refused: err.reason ?? err.message, epoch: db.epoch }); }
} catch (err) {
  out({ openFailed: err.reason ?? err.message });
  await new Promise((r) => process.stdin.once("data", r));
}
await storage.close();
process.exit(0);
`,
    );
    const setup = createDurableStreamsStorage({ url: server.url });
    try {
      for (let i = 0; i < 10; i++) {
        const name = `procs-${i}`;
        const first = await setup.open(name);
        await first.commit([sessionCreated("s1")]);
        await first.close();
        const kids = ["a", "b"].map((tag) => {
          const child = spawn(process.execPath, ["--import", "tsx", script, server.url, name, tag], { stdio: ["pipe", "pipe", "inherit"] });
          // A child that died early must fail the assertions below, not the test run through an EPIPE.
          child.stdin.on("error", () => undefined);
          const lines: Record<string, unknown>[] = [];
          let buf = "";
          child.stdout.setEncoding("utf8").on("data", (d: string) => {
            buf += d;
            for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
              lines.push(JSON.parse(buf.slice(0, nl)) as Record<string, unknown>);
              buf = buf.slice(nl + 1);
            }
          });
          const exited = new Promise<void>((r) => child.once("exit", () => r()));
          return { child, lines, exited, tag };
        });
        const settledLine = (k: (typeof kids)[number]) => k.lines.find((l) => "opened" in l || "openFailed" in l);
        const deadline = Date.now() + 60_000;
        while (kids.some((k) => settledLine(k) === undefined)) {
          assert.ok(Date.now() < deadline, "both processes finished opening");
          await new Promise((r) => setTimeout(r, 20));
        }
        for (const k of kids) k.child.stdin.end("go\n");
        await Promise.all(kids.map((k) => k.exited));
        const opened = kids.filter((k) => typeof settledLine(k)!.opened === "number");
        for (const k of kids) if (!opened.includes(k)) assert.equal(settledLine(k)!.openFailed, "fenced", JSON.stringify(k.lines));
        const epochs = opened.map((k) => settledLine(k)!.opened as number);
        assert.equal(new Set(epochs).size, epochs.length, `distinct epochs ${epochs.join(", ")}`);
        const top = Math.max(...epochs);
        for (const k of opened) {
          const answer = k.lines.find((l) => "committed" in l || "refused" in l)!;
          if (settledLine(k)!.opened === top) assert.ok("committed" in answer, `the highest epoch commits: ${JSON.stringify(answer)}`);
          else assert.equal(answer.refused, "fenced", `a lower epoch is fenced: ${JSON.stringify(answer)}`);
        }
        const log = await logOf(server.url, name);
        assertWellFormed(log, name);
        assert.equal(log.length, 2, "the setup's event and the winner's commit only");
      }
    } finally {
      await setup.close();
    }
  });
});
