/**
 * Issue 9: two supervisor loops that restart `cairn serve --db X` on EVERY exit (a Kubernetes
 * Deployment, a Nomad job, `Restart=always`), on different data directories, on one real 3-member
 * etcd cluster, beside a submitted run with cells. Ownership changes only when the test kills the
 * owner: the epoch (each open advances it once) is counted, not timed. Killing the standby, again and
 * again, changes nothing; killing the owner moves ownership once, and the other worker finishes the
 * run; a second run's owner is killed too and ownership moves back. The restarted owner always queues
 * behind the standby that waited longer (the lease's waiters' queue), so it is the other worker that
 * finishes each run. The loops run 60 s in all. No worker is ever fenced (no exit 3): nobody took a
 * database from a live owner.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { Etcd3 } from "etcd3";
import { devCluster } from "../test/replicated/helpers.js";
import { REPO, runCairn, describe as said } from "./support/cli.js";
import { cmdPatch, concludePatch, writeScript } from "./support/patches.js";
import { createReplicatedStorage } from "../storage-adapters/replicated/index.js";
import { parseLogEvent, type LogEvent } from "../src/state/events.js";
import { untilQuiet as until } from "../test/support/wait.js";
import { exitAfterTests } from "../test/support/exit.js";

const root = mkdtempSync(join(tmpdir(), "cairn-chaos-loops-"));
const cleanups: (() => Promise<void> | void)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
  rmSync(root, { recursive: true, force: true });
});

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

/** A restart-always supervisor: runs `cairn serve ARGS` and starts it again on any exit. */
class Loop {
  child: ChildProcess | null = null;
  readonly exits: (number | null)[] = [];
  starts = 0;
  log = "";
  private stopping = false;
  private closed: Promise<void> = Promise.resolve();

  constructor(
    readonly name: string,
    readonly port: number,
    private readonly args: string[],
  ) {}

  start(): void {
    if (this.stopping) return;
    this.starts++;
    const child = spawn(process.execPath, ["--import", "tsx", "src/cli/entry.ts", ...this.args], { cwd: REPO, stdio: ["ignore", "ignore", "pipe"] });
    this.child = child;
    child.stderr!.setEncoding("utf8").on("data", (d: string) => (this.log += d));
    this.closed = new Promise((resolve) =>
      child.once("close", (code) => {
        this.exits.push(code);
        this.log += `\n[${this.name}] exited ${code}\n`;
        resolve();
        if (!this.stopping) setTimeout(() => this.start(), 100);
      }),
    );
  }

  async readyz(): Promise<number | undefined> {
    try {
      return (await fetch(`http://127.0.0.1:${this.port}/readyz`)).status;
    } catch {
      return undefined;
    }
  }

  /** Kills the current process (the loop restarts it) and waits until it has exited. */
  async kill(signal: NodeJS.Signals): Promise<void> {
    const done = this.closed;
    this.child?.kill(signal);
    await done;
  }

  async stop(): Promise<void> {
    this.stopping = true;
    const done = this.closed;
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGTERM");
      const guard = setTimeout(() => this.child?.kill("SIGKILL"), 30_000);
      await done;
      clearTimeout(guard);
    }
  }
}


describe("restart-always supervisors on one database", () => {
  test("ownership changes only when the owner dies; the other worker finishes the run; nobody is fenced", async () => {
    const etcd = await devCluster();
    cleanups.push(() => etcd.stop());
    const endpoints = etcd.cluster.endpoints.join(",");
    const client = new Etcd3({ hosts: etcd.cluster.endpoints });
    cleanups.push(() => client.close());
    const epoch = async () => Number(await client.get("cairn/db/w1/epoch").string());

    const dir = join(root, "case");
    const work = join(dir, "work");
    mkdirSync(work, { recursive: true });
    const model = join(dir, "model.json");
    const cells = 6;
    writeScript(model, [...Array.from({ length: cells }, (_, i) => cmdPatch(i, i + 1, ["sh", "-c", `sleep 1; echo cell ${i + 1}`])), concludePatch(cells, cells + 1, "failure", "all cells ran")]);
    const storageArgs = ["--db", "w1", "--storage", "replicated", "--etcd", endpoints];
    // The job's database and its run: created by submit (never by serve).
    const sub = await runCairn(["submit", "run six cells", ...storageArgs, "--data-dir", join(dir, "submit"), "--session", "job"]);
    assert.equal(sub.code, 0, said(sub));

    const loops: Loop[] = [];
    for (const name of ["a", "b"]) {
      const port = await freePort();
      const args = ["serve", ...storageArgs, "--data-dir", join(dir, `data-${name}`), "--model", `scripted:${model}`, "--cwd", work, "--listen", `127.0.0.1:${port}`, "--lease", "5s", "--fenced-linger", "1s"];
      loops.push(new Loop(name, port, args));
    }
    cleanups.push(async () => {
      for (const l of loops) await l.stop();
    });
    for (const l of loops) l.start();
    const started = Date.now();
    const roles = async () => {
      const s = await Promise.all(loops.map((l) => l.readyz()));
      const owner = loops.findIndex((_, i) => s[i] === 200);
      const other = owner === 0 ? 1 : 0;
      return owner >= 0 && s[other] === 503 ? { owner: loops[owner]!, standby: loops[other]! } : undefined;
    };
    const first = await until("one owner and one standby", roles);
    const e0 = await epoch();

    // Restart-always on the standby: killed three times, it comes back as a standby each time.
    for (let i = 0; i < 3; i++) {
      await first.standby.kill(i % 2 === 0 ? "SIGKILL" : "SIGTERM");
      await until("the standby back in standby", async () => ((await first.standby.readyz()) === 503 ? true : undefined));
    }
    assert.equal(await epoch(), e0, "killing the standby never moved ownership");
    assert.equal(await first.owner.readyz(), 200);

    // The run progresses on the owner; kill the owner while it runs cells.
    const storage = createReplicatedStorage({ endpoints: etcd.cluster.endpoints, dataDir: join(dir, "reader") });
    cleanups.push(() => storage.close());
    const readLog = async (): Promise<LogEvent[]> => {
      const reader = await storage.reader("w1");
      try {
        return (await reader.read(0)).map((e) => parseLogEvent(e));
      } finally {
        await reader.close();
      }
    };
    const finishedOf = (l: LogEvent[], session: string) => l.filter((e) => e.kind === "execution_finished" && e.session === session) as LogEvent<"execution_finished">[];
    /** Kills the owner while `session` runs its cells; the standby (never the restarted owner) takes over and ends the run. */
    const killOwnerDuring = async (session: string, roles0: { owner: Loop; standby: Loop }, epochBefore: number) => {
      await until(`two cells of ${session} to finish`, async () => (finishedOf(await readLog(), session).length >= 2 ? true : undefined));
      const startsBefore = roles0.owner.starts;
      await roles0.owner.kill("SIGKILL");
      const next = await until("the other worker to own the database", roles);
      assert.equal(next.owner, roles0.standby, "the standby that waited took over, not the owner's restarted process");
      assert.equal(await epoch(), epochBefore + 1, "one change of owner for one death");
      const log = await until(`${session} to end`, async () => {
        const l = await readLog();
        return l.some((e) => e.kind === "run_ended" && e.session === session) ? l : undefined;
      });
      assert.equal(await epoch(), epochBefore + 1, "no further change of owner");
      const finished = finishedOf(log, session);
      const unknown = finished.filter((e) => e.body.result === "UnknownExecution");
      assert.ok(unknown.length <= 1, `only the cell running when the owner was killed can be UnknownExecution: ${unknown.length}`);
      assert.ok(finished.length >= cells, `every cell of ${session} was driven to an end`);
      assert.ok(roles0.owner.starts > startsBefore, "the killed owner was restarted by its loop");
      await until("the restarted worker in standby", async () => ((await roles0.owner.readyz()) === 503 ? true : undefined));
      return next;
    };
    const second = await killOwnerDuring("job", first, e0);

    // A second run, submitted to the new owner; its owner is killed too: ownership moves back.
    const sub2 = await runCairn(["submit", "run six cells again", ...storageArgs, "--data-dir", join(dir, "submit"), "--session", "job2"]);
    assert.equal(sub2.code, 0, said(sub2));
    const third = await killOwnerDuring("job2", second, e0 + 1);
    assert.equal(third.owner, first.owner, "ownership went back to the first loop's worker");

    // The loops keep running (60 s in all): nothing moves ownership while nobody is killed.
    const calm = e0 + 2;
    while (Date.now() - started < 60_000) {
      assert.equal(await epoch(), calm, "ownership never moved while nobody was killed");
      await new Promise((r) => setTimeout(r, 1000));
    }
    const log = await readLog();
    assert.equal(log.filter((e) => e.kind === "session_created").length, 2, "two runs, one per submit");
    assert.equal(await epoch(), calm);
    for (const l of loops) assert.ok(!l.exits.includes(3), `worker ${l.name} was never fenced:\n${l.log.slice(-3000)}`);
    assert.equal(await third.owner.readyz(), 200);
    assert.equal(await third.standby.readyz(), 503);
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("chaos/restart-loops.test.ts");
