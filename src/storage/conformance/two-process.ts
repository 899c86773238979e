/**
 * The two-process ownership cases, for adapters whose data outlives the process: a real second OS
 * process (child.ts) opens, commits, watches, posts and reads the same backing data, and is killed
 * with SIGKILL mid-commit. Last opener wins across processes exactly as it does inside one.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { extname } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { CommitReceipt } from "../contract.js";
import { inbox, message } from "./fixtures.js";
import type { CaseContext, ConformanceCase } from "./types.js";

type Line = Record<string, unknown>;

/** The driver next to this module, in the same form (child.ts under a TypeScript loader, child.js once built). */
const DRIVER = fileURLToPath(new URL(`./child${extname(fileURLToPath(import.meta.url))}`, import.meta.url));

/** The loader flags of this process (`--import tsx` and the like), which the other process needs too. */
export function defaultExecArgv(): string[] {
  const keep = new Set(["--import", "--loader", "--experimental-loader", "--require", "-r", "--conditions", "-C"]);
  const out: string[] = [];
  const argv = process.execArgv;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const flag = arg.includes("=") ? arg.slice(0, arg.indexOf("=")) : arg;
    if (!keep.has(flag)) continue;
    out.push(arg);
    if (!arg.includes("=") && i + 1 < argv.length) out.push(argv[++i]!);
  }
  return out;
}

/** A running driver process and the JSON lines it printed. */
class Child {
  readonly lines: Line[] = [];
  private waiters: (() => void)[] = [];
  private stderr = "";
  exited = false;

  private constructor(
    readonly proc: ChildProcessWithoutNullStreams,
    private readonly boundMs: number,
  ) {
    createInterface({ input: proc.stdout }).on("line", (text) => {
      try {
        this.lines.push(JSON.parse(text) as Line);
      } catch {
        this.lines.push({ unparsed: text });
      }
      this.wake();
    });
    proc.stderr.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-4000);
    });
    proc.on("exit", () => {
      this.exited = true;
      this.wake();
    });
  }

  static start(ctx: CaseContext, role: "owner" | "visitor", batches = 0): Child {
    const other = ctx.target.otherProcess;
    if (other === undefined) {
      assert.fail("this adapter says it persists (persists: true) but its AdapterUnderTest has no otherProcess: say how another process creates the Storage (module, exportName, config).");
    }
    const args = JSON.stringify({ module: other.module, exportName: other.exportName, config: other.config, name: ctx.name, role, batches });
    return new Child(spawn(process.execPath, [...ctx.options.execArgv, DRIVER, args], { stdio: "pipe" }), ctx.waitBoundMs);
  }

  /** The "ready" line: the process started (node, the loader, the adapter) and did its opening work; twice the bound. */
  ready(): Promise<Line> {
    return this.next((l) => l.ready === true, "ready line", 0, 2 * this.boundMs);
  }

  send(command: string): void {
    this.proc.stdin.write(`${command}\n`);
  }

  /** The first line (at or after `from`) matching `match`; fails if the child exits or the bound passes. */
  async next(match: (line: Line) => boolean, what: string, from = 0, boundMs = this.boundMs): Promise<Line> {
    const deadline = Date.now() + boundMs;
    for (;;) {
      const found = this.lines.slice(from).find(match);
      if (found !== undefined) return found;
      if (this.exited || Date.now() > deadline) {
        assert.fail(`${this.exited ? "the other process exited before" : `no answer within ${boundMs} ms:`} ${what}; it printed ${JSON.stringify(this.lines).slice(-2000)}; stderr: ${this.stderr}`);
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 200);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Asks the child to exit; kills it when it does not within the bound. */
  async stop(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise((resolve) => this.proc.once("exit", resolve));
    this.send("exit");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), this.boundMs);
    await exited;
    clearTimeout(timer);
  }

  /** SIGKILL, then waits for the exit. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise((resolve) => this.proc.once("exit", resolve));
    this.proc.kill("SIGKILL");
    await exited;
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }
}

/** Runs `body` with children that are stopped (or killed) even when it fails. */
async function withChildren(body: (start: (role: "owner" | "visitor", batches?: number) => Child) => Promise<void>, ctx: CaseContext): Promise<void> {
  const children: Child[] = [];
  try {
    await body((role, batches) => {
      const child = Child.start(ctx, role, batches);
      children.push(child);
      return child;
    });
  } finally {
    for (const c of children) await c.stop().catch(() => c.kill());
  }
}

type Receipted = { receipt: CommitReceipt; identities: string[] };
const receiptsOf = (lines: Line[]) => lines.filter((l) => l.receipt !== undefined && Array.isArray(l.identities)) as Receipted[];
const errorOf = (line: Line) => {
  const e = line.error as Line | undefined;
  return { code: e?.code, action: e?.action, reason: e?.reason };
};

export const twoProcessCases: ConformanceCase[] = [
  {
    id: "processes.last-opener-wins",
    name: "two processes: opening here fences the owner in another process; every receipt it got is here; its next commit is refused and writes nothing",
    once: true,
    persistsOnly: true,
    async run(ctx) {
      await withChildren(async (start) => {
        const child = start("owner", 6);
        await child.ready();
        const childEpoch = (await child.next((l) => typeof l.opened === "number", "opened line")).opened as number;
        const receipts = receiptsOf(child.lines);
        assert.equal(receipts.length, 6);

        const storage = await ctx.target.reopenStorage();
        const db = await storage.open(ctx.name);
        assert.ok(db.epoch > childEpoch, `this epoch ${db.epoch} > the other process's ${childEpoch}`);
        const log = await db.read();
        for (const { receipt, identities } of receipts) {
          const got = log.filter((e) => e.seq >= receipt.firstSeq && e.seq <= receipt.lastSeq).map((e) => e.identity);
          assert.deepEqual(got, identities, `receipt ${JSON.stringify(receipt)} is in this process's log`);
        }
        const head = await db.head();
        assert.equal(head, receipts.at(-1)!.receipt.lastSeq);

        const mark = child.lines.length;
        child.send("commit");
        const answer = await child.next((l) => l.error !== undefined || l.receipt !== undefined, "answer to commit", mark);
        assert.deepEqual(errorOf(answer), { code: "reset", action: "stop", reason: "fenced" }, `the other process's commit after this open: ${JSON.stringify(answer)}`);
        assert.equal(await db.head(), head, "the fenced process wrote nothing");
        assert.ok(!(await db.read()).some((e) => e.identity.includes("late-")), "no late event in the log");
        assert.deepEqual(await db.commit([inbox("parent", "p1")]), { firstSeq: head + 1, lastSeq: head + 1 }, "the new owner appends");
        await db.close();
      }, ctx);
    },
  },
  {
    id: "processes.watch-fenced",
    name: "two processes: the owner in another process, only watching, learns of this open without committing, once",
    once: true,
    persistsOnly: true,
    async run(ctx) {
      await withChildren(async (start) => {
        const child = start("owner", 1);
        await child.ready();
        child.send("watch");
        await child.next((l) => l.watching === true, "watching line");
        const storage = await ctx.target.reopenStorage();
        const db = await storage.open(ctx.name);
        const signal = await child.next((l) => (l.signal as Line | undefined)?.type === "fenced", "fenced signal from the other process's watch");
        assert.deepEqual(signal.signal, { type: "fenced", epoch: db.epoch });
        await db.commit([inbox("parent", "after-fence")]);
        const mark = child.lines.length;
        child.send("commit");
        assert.deepEqual(errorOf(await child.next((l) => l.error !== undefined || l.receipt !== undefined, "answer to commit", mark)).reason, "fenced");
        assert.equal(child.lines.filter((l) => (l.signal as Line | undefined)?.type === "fenced").length, 1, "fenced is reported once");
        await db.close();
      }, ctx);
    },
  },
  {
    id: "processes.visitor-never-fences",
    name: "two processes: a poster and a reader in another process never fence the owner here",
    once: true,
    persistsOnly: true,
    async run(ctx) {
      await withChildren(async (start) => {
        const db = await ctx.target.storage.open(ctx.name);
        await db.commit([inbox("parent", "p1"), inbox("parent", "p2")]);
        const child = start("visitor");
        await child.ready();
        child.send("post from-child");
        const posted = await child.next((l) => l.posted !== undefined || l.error !== undefined, "answer to post");
        assert.equal(posted.posted, "from-child", JSON.stringify(posted));
        child.send("read");
        const read = await child.next((l) => l.head !== undefined || l.error !== undefined, "answer to read");
        assert.deepEqual(read, { head: 2, identities: [inbox("parent", "p1").identity, inbox("parent", "p2").identity] });
        assert.deepEqual(await db.commit([inbox("parent", "p3")]), { firstSeq: 3, lastSeq: 3 }, "the owner still commits");
        const drained = await db.drain();
        assert.deepEqual(drained.map(({ mseq: _mseq, ...m }) => m), [message("from-child")]);
        await db.ack(drained[0]!.mseq);
        assert.equal(db.stats().fenced, false);
        await db.close();
      }, ctx);
    },
  },
  {
    id: "processes.killed-owner",
    name: "two processes: an owner killed with SIGKILL while committing loses no receipted batch and leaves no partial one",
    once: true,
    persistsOnly: true,
    async run(ctx) {
      await withChildren(async (start) => {
        const child = start("owner", 1);
        await child.ready();
        const mark = child.lines.length;
        child.send("loop");
        await child.next((l) => l.receipt !== undefined && receiptsOf(child.lines.slice(mark)).length >= 5, "five receipts from the commit loop", mark);
        await child.kill();
        const receipts = receiptsOf(child.lines);
        const storage = await ctx.target.reopenStorage();
        const db = await storage.open(ctx.name);
        const log = await db.read();
        assert.deepEqual(log.map((e) => e.seq), Array.from({ length: log.length }, (_, i) => i + 1), "the log has no gap");
        for (const { receipt, identities } of receipts) {
          const got = log.filter((e) => e.seq >= receipt.firstSeq && e.seq <= receipt.lastSeq).map((e) => e.identity);
          assert.deepEqual(got, identities, `receipted batch ${JSON.stringify(receipt)} survived the kill`);
        }
        const loop = log.filter((e) => e.identity.includes(":loop-"));
        assert.equal(loop.length % 2, 0, "every batch is whole (two events each): none was half written");
        for (let i = 0; i < loop.length; i += 2) {
          assert.deepEqual([loop[i]!.identity, loop[i + 1]!.identity], [inbox("child", `loop-${i / 2}-a`).identity, inbox("child", `loop-${i / 2}-b`).identity]);
        }
        assert.ok(loop.length / 2 >= receipts.length - 1, "at least every receipted loop batch is there");
        assert.deepEqual(await db.commit([inbox("parent", "after-kill")]), { firstSeq: log.length + 1, lastSeq: log.length + 1 });
        await db.close();
      }, ctx);
    },
  },
];
