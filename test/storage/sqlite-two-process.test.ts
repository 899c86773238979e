/**
 * Last opener wins across two real OS processes (sqlite adapter): the child commits, the parent opens
 * the same file and finds every receipt the child was given; the child's next commit is fenced and
 * writes nothing; a watching child notices the parent's open without committing.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import type { CommitReceipt } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { inbox } from "../conformance/fixtures.js";

const DRIVER = join(dirname(fileURLToPath(import.meta.url)), "sqlite-driver.ts");
const BOUND_MS = 30_000;

type Line = Record<string, unknown>;

/** A running driver process and the JSON lines it printed. */
class Child {
  readonly lines: Line[] = [];
  private waiters: (() => void)[] = [];
  exited = false;

  constructor(readonly proc: ChildProcessWithoutNullStreams) {
    createInterface({ input: proc.stdout }).on("line", (text) => {
      this.lines.push(JSON.parse(text) as Line);
      this.wake();
    });
    proc.stderr.on("data", (chunk: Buffer) => process.stderr.write(`[driver] ${chunk.toString()}`));
    proc.on("exit", () => {
      this.exited = true;
      this.wake();
    });
  }

  static start(dataDir: string, name: string, batches: number, pollMs: number): Child {
    const proc = spawn(process.execPath, ["--import", "tsx", DRIVER, dataDir, name, String(batches), String(pollMs)], { stdio: "pipe" });
    return new Child(proc);
  }

  send(command: string): void {
    this.proc.stdin.write(`${command}\n`);
  }

  /** The first line (at or after `from`) matching `match`; fails if the child exits or the bound passes. */
  async next(match: (line: Line) => boolean, what: string, from = 0): Promise<Line> {
    const deadline = Date.now() + BOUND_MS;
    for (;;) {
      const found = this.lines.slice(from).find(match);
      if (found !== undefined) return found;
      if (this.exited) assert.fail(`the driver exited before: ${what}; it printed ${JSON.stringify(this.lines)}`);
      if (Date.now() > deadline) assert.fail(`no ${what} within ${BOUND_MS} ms; the driver printed ${JSON.stringify(this.lines)}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 200);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise((resolve) => this.proc.once("exit", resolve));
    this.send("exit");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }
}

describe("sqlite: last opener wins across two OS processes", () => {
  let dataDir = "";
  const children: Child[] = [];
  before(() => {
    dataDir = mkdtempSync(join(tmpdir(), "cairn-two-process-"));
  });
  after(async () => {
    for (const c of children) await c.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it("the parent sees every receipt the child got; the child's next commit is fenced and writes nothing", async () => {
    const child = Child.start(dataDir, "x", 6, 100);
    children.push(child);
    const ready = await child.next((l) => l.ready === true, "ready line");
    assert.ok(ready);
    const childEpoch = (await child.next((l) => typeof l.opened === "number", "opened line")).opened as number;
    const receipts = child.lines.filter((l) => l.receipt !== undefined) as { receipt: CommitReceipt; identities: string[] }[];
    assert.equal(receipts.length, 6);

    const storage = createSqliteStorage({ dataDir });
    try {
      const db = await storage.open("x");
      assert.ok(db.epoch > childEpoch, `parent epoch ${db.epoch} > child epoch ${childEpoch}`);
      const log = await db.read();
      for (const { receipt, identities } of receipts) {
        const got = log.filter((e) => e.seq >= receipt.firstSeq && e.seq <= receipt.lastSeq).map((e) => e.identity);
        assert.deepEqual(got, identities, `receipt ${JSON.stringify(receipt)} is in the parent's log`);
      }
      const head = await db.head();
      assert.equal(head, receipts.at(-1)!.receipt.lastSeq);

      const mark = child.lines.length;
      child.send("commit");
      const answer = await child.next((l) => l.error !== undefined || l.receipt !== undefined, "answer to commit", mark);
      assert.deepEqual(
        { code: (answer.error as Line | undefined)?.code, action: (answer.error as Line | undefined)?.action, reason: (answer.error as Line | undefined)?.reason },
        { code: "reset", action: "stop", reason: "fenced" },
        `the child's commit after the parent's open: ${JSON.stringify(answer)}`,
      );
      assert.equal(await db.head(), head, "the fenced child wrote nothing");
      assert.ok(!(await db.read()).some((e) => e.identity.includes("late-")), "no late event in the log");
      assert.deepEqual(await db.commit([inbox("parent", "p1")]), { firstSeq: head + 1, lastSeq: head + 1 }, "the new owner appends");
      await db.close();
    } finally {
      await storage.close();
      await child.stop();
    }
  });

  it("a watching child notices the parent's open without committing", async () => {
    const child = Child.start(dataDir, "y", 1, 100);
    children.push(child);
    await child.next((l) => l.ready === true, "ready line");
    child.send("watch");
    await child.next((l) => l.watching === true, "watching line");
    const storage = createSqliteStorage({ dataDir });
    try {
      const db = await storage.open("y");
      const signal = await child.next((l) => (l.signal as Line | undefined)?.type === "fenced", "fenced signal from the child's watch");
      assert.deepEqual(signal.signal, { type: "fenced", epoch: db.epoch });
      assert.equal(child.lines.filter((l) => (l.signal as Line | undefined)?.type === "fenced").length, 1);
      await db.close();
    } finally {
      await storage.close();
      await child.stop();
    }
  });
});
