/**
 * Harness.close() / ReplicatedDatabase.close() during and right after a quorum loss, on a real
 * 3-member etcd cluster: close returns while a commit waits
 * for the lost quorum (members killed or frozen, close called twice beside Storage.close(), a printing
 * cell running), nothing acknowledged is lost, no cell runs twice, the next owner resumes the run, no
 * promise rejection goes unhandled, and the closing process exits by itself. Also: etcd revoking the
 * owner's lease under it (a bug of etcd before 3.5.13 does it to every lease when a paused leader
 * resumes): the owner kills its cell, stops and says why. And a process whose only work is a commit
 * waiting for the lost quorum stays alive until its receipt, then closes and leaves nothing running.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, existsSync } from "node:fs";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { describe, it } from "node:test";
import type { Storage } from "../../src/storage/contract.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import { Harness } from "../../src/harness/harness.js";
import { LoopModel } from "../../chaos/support/loop-model.js";
import { bounded, clusterSuite, eventually, untilQuorum } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

const rejections: unknown[] = [];
process.on("unhandledRejection", (e) => rejections.push(e));

/** How long `p` took to settle, failing after `ms` instead of hanging (see `bounded`). */
async function timed<T>(p: Promise<T>, what: string, ms = 60_000): Promise<number> {
  const t0 = performance.now();
  await bounded(p, what, ms);
  return performance.now() - t0;
}

/**
 * Round 1: a cmd cell that marks each run in `marker` and prints forever. Later rounds conclude;
 * when that cell's execution is uncertain (its worker stopped before recording its result), they
 * resolve it first, with the marker as evidence, as an agent would.
 */
class StreamModel implements Model {
  readonly name = "stream";
  constructor(private readonly marker: string) {}
  async step(req: ModelRequest): Promise<ModelReply> {
    const s = req.state;
    const ops: unknown[] = [{ op: "test", path: "/revision", value: s.revision }];
    const id = s.runtime.next_cell_id;
    if (s.runtime.usage.rounds <= 1) {
      ops.push({ op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv: ["sh", "-c", `echo run >> ${this.marker}; while :; do echo out; sleep 0.02; done`] } });
    } else {
      if (JSON.stringify(s).includes("UnknownExecution")) {
        ops.push({ op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", role: "resolution", target_cell_id: 1, evidence_refs: ["cell:1"], text: "cell 1 was stopped with its worker; it only printed" } });
      }
      ops.push({ op: "add", path: "/cells/-", value: { id: id + ops.length - 1, previous_id: null, kind: "note", text: "done", role: "conclusion", result: "success" } });
    }
    return { patch: ops, usage: { input_tokens: 1, output_tokens: 1 } };
  }
}

/**
 * A hang guard, not a speed assertion: close waits at most one lease length (3 s) for writes in
 * flight, plus a bounded watch cancel and lease revoke; before the fix it waited forever. Generous,
 * so that a loaded CI machine never fails it.
 */
const LIMIT_MS = 30_000;

describe("close during and after a quorum loss", () => {
  const suite = clusterSuite("close");
  const { dirs, make, cluster } = suite;

  /** Every acknowledged (followed) identity is in a fresh opener's log; no execution started twice; a resumed run succeeds. */
  async function checkAfter(name: string, acked: Set<string>, work: string, model: Model, tag: string): Promise<string[]> {
    const next = await Harness.open({ storage: make(`${dirs.dir}/${tag}-next`), name, model, workDir: work, snapshots: false });
    try {
      await next.resume();
      for (const id of next.sessions()) {
        const outcome = await bounded(next.wait(id), "the resumed run", 90_000);
        assert.equal(outcome.result, "success", outcome.reason);
      }
    } finally {
      await next.close();
    }
    const check = await make(`${dirs.dir}/${tag}-check`).open(name);
    const log = await check.read();
    await check.close();
    const ids = new Set(log.map((e) => e.identity));
    const missing = [...acked].filter((id) => !ids.has(id));
    assert.deepEqual(missing, [], "acknowledged commits missing from the log");
    const started = log.filter((e) => e.kind === "execution_started").map((e) => e.identity);
    assert.equal(new Set(started).size, started.length, "an execution started twice");
    return log.map((e) => e.kind);
  }

  /** A LoopModel run on database `name` that has committed a few rounds, with every identity its followers saw. */
  async function startLoop(name: string, tag: string): Promise<{ h: Harness; storage: Storage; acked: Set<string>; work: string }> {
    const work = `${dirs.dir}/w-${tag}`;
    const storage = make(`${dirs.dir}/a-${tag}`);
    const h = await Harness.open({ storage, name, model: new LoopModel(60), workDir: work, snapshots: false });
    const acked = new Set<string>();
    h.follow((logged) => logged.forEach((e) => acked.add(e.identity)));
    const session = await h.start({ goal: "loop", cwd: dirs.dir, budgets: { max_rounds: 70 } });
    void h.wait(session).catch(() => undefined);
    await eventually(() => acked.size >= 20, "a few rounds");
    return { h, storage, acked, work };
  }

  /**
   * A StreamModel run on database `name` whose printing cell has started and printed: the harness,
   * its storage, every identity its followers saw, and the cell's process group.
   */
  async function startStream(name: string, tag: string): Promise<{ h: Harness; storage: Storage; acked: Set<string>; work: string; marker: string; pgid: number; session: string }> {
    const work = `${dirs.dir}/w-${tag}`;
    const marker = `${dirs.dir}/marker-${tag}`;
    const storage = make(`${dirs.dir}/a-${tag}`);
    const h = await Harness.open({ storage, name, model: new StreamModel(marker), workDir: work, snapshots: false });
    const acked = new Set<string>();
    const kinds: string[] = [];
    let pgid = 0;
    h.follow((logged) =>
      logged.forEach((e) => {
        acked.add(e.identity);
        kinds.push(e.kind + (e.kind === "run_ended" || e.kind === "execution_finished" ? JSON.stringify(e.body).slice(0, 300) : ""));
        if (e.kind === "execution_started") pgid = (e.body as { pgid: number }).pgid;
      }),
    );
    const session = await h.start({ goal: "stream", cwd: dirs.dir, budgets: { max_rounds: 5 } });
    try {
      await eventually(() => pgid > 0 && acked.size >= 10, "the cell runs and prints", 20_000);
    } catch (err) {
      await h.close();
      throw new Error(`${(err as Error).message}: ${kinds.join(" ")}`);
    }
    return { h, storage, acked, work, marker, pgid, session };
  }

  /** Whether any process of group `pgid` is alive. */
  const groupAlive = (pgid: number): boolean => {
    try {
      process.kill(-pgid, 0);
      return true;
    } catch {
      return false;
    }
  };

  it("members killed: close returns while a commit waits for the lost quorum (at most a lease length), and the next owner resumes the run", async () => {
    const { h, storage, acked, work } = await startLoop("closing", "k0");
    await cluster().kill(1);
    await cluster().kill(2);
    try {
      // The scenario under test: a commit of the harness is in flight, waiting for the quorum.
      await eventually(() => (h.storageState().stats.backlogCommits ?? 0) >= 1, "a commit waits for the lost quorum");
      // Before the fix this waited for the quorum forever.
      await timed(h.close(), "Harness.close() while the quorum is lost");
      await timed(storage.close(), "Storage.close() while the quorum is lost");
      assert.equal(h.status, "closed");
    } finally {
      await cluster().restart(1);
      await cluster().restart(2);
      await untilQuorum(cluster());
    }
    const kinds = await checkAfter("closing", acked, work, new LoopModel(60), "k0");
    assert.equal(kinds.filter((k) => k === "execution_started").length, kinds.filter((k) => k === "execution_finished").length, "every started cell has a result (a finished one, or UnknownExecution)");
    assert.deepEqual(rejections, []);
  });

  it("quorum lost by SIGSTOP: close twice and storage.close() at once return within a lease length; nothing acknowledged lost", async () => {
    const { h, storage, acked, work } = await startLoop("stop1", "s1");
    cluster().signal(1, "SIGSTOP");
    cluster().signal(2, "SIGSTOP");
    await eventually(() => (h.storageState().stats.backlogCommits ?? 0) >= 1, "a commit waits for the frozen quorum");
    const ms = await timed(Promise.all([h.close(), h.close(), storage.close()]), "close x2 + storage.close while frozen");
    const ackedAtClose = acked.size;
    cluster().signal(1, "SIGCONT");
    cluster().signal(2, "SIGCONT");
    await untilQuorum(cluster());
    assert.ok(ms < LIMIT_MS, `close took ${Math.round(ms)} ms`);
    assert.equal(h.status, "closed");
    await checkAfter("stop1", acked, work, new LoopModel(60), "s1");
    assert.equal(acked.size, ackedAtClose, "a commit was acknowledged to the closed harness's followers after close returned");
    assert.deepEqual(rejections, []);
  });

  it("close while a printing cell runs and the quorum is lost (killed): bounded, the cell is killed, it never runs twice", async () => {
    const { h, storage, acked, work, marker, pgid } = await startStream("cell2", "2");
    await cluster().kill(1);
    await cluster().kill(2);
    let ms: number, ms2: number;
    let alive = true;
    try {
      await eventually(() => (h.storageState().stats.backlogCommits ?? 0) >= 1, "an output commit waits");
      ms = await timed(h.close(), "Harness.close() with a running cell that prints, quorum lost", 30_000);
      ms2 = await timed(storage.close(), "storage.close");
      alive = groupAlive(pgid);
    } finally {
      await cluster().restart(1);
      await cluster().restart(2);
      await untilQuorum(cluster());
    }
    assert.ok(ms < LIMIT_MS, `Harness.close took ${Math.round(ms)} ms`);
    assert.ok(ms2 < LIMIT_MS, `storage.close took ${Math.round(ms2)} ms`);
    assert.equal(alive, false, "the cell's process group outlived close");
    await checkAfter("cell2", acked, work, new StreamModel(marker), "s2");
    const runs = existsSync(marker) ? readFileSync(marker, "utf8").trim().split("\n").length : 0;
    assert.equal(runs, 1, "the cell ran more than once");
    assert.deepEqual(rejections, []);
  });

  it("close right after the quorum returns: bounded, every acknowledged commit in the log, the run resumes", async () => {
    const { h, storage, acked, work } = await startLoop("back3", "s3");
    await cluster().kill(1);
    await cluster().kill(2);
    await eventually(() => (h.storageState().stats.backlogCommits ?? 0) >= 1, "a commit waits");
    await new Promise((r) => setTimeout(r, 1000));
    await cluster().restart(1);
    await cluster().restart(2);
    const ms = await timed(Promise.all([h.close(), storage.close()]), "close after the quorum returned");
    assert.ok(ms < LIMIT_MS, `close took ${Math.round(ms)} ms`);
    await checkAfter("back3", acked, work, new LoopModel(60), "s3");
    assert.deepEqual(rejections, []);
  });

  it("etcd revokes every lease under a running cell (as etcd before 3.5.13 does when a paused leader resumes, etcd#15247): the owner kills the cell and stops saying so; the next owner resumes; the cell never runs twice", async () => {
    const { h, storage, acked, work, marker, pgid, session } = await startStream("revoked", "5");
    const ended = h.wait(session).then(
      (o) => `ended ${o.result}: ${o.reason}`,
      (err: unknown) => String(err),
    );
    const { Etcd3 } = await import("etcd3");
    const admin = new Etcd3({ hosts: [...cluster().endpoints] });
    try {
      const { leases } = await admin.leaseClient.leaseLeases();
      assert.ok(leases.length >= 1, "the owner holds an etcd lease");
      for (const l of leases) await admin.leaseClient.leaseRevoke({ ID: l.ID });
    } finally {
      admin.close();
    }
    // The owner learns it from its next renewal (every 500 ms), kills its cells and stops acting.
    assert.match(await bounded(ended, "the owner to stop", LIMIT_MS), /lost the ownership lease.*etcd reports the ownership lease expired/);
    await eventually(() => !groupAlive(pgid), "the cell's process group to be killed", LIMIT_MS);
    await timed(h.close(), "Harness.close() after the lease was revoked");
    await timed(storage.close(), "Storage.close() after the lease was revoked");
    await checkAfter("revoked", acked, work, new StreamModel(marker), "s5");
    const runs = readFileSync(marker, "utf8").trim().split("\n").length;
    assert.equal(runs, 1, "the cell ran more than once");
    assert.deepEqual(rejections, []);
  });

  it("a process that closed its harness and storage while members are frozen exits by itself", async () => {
    const HARNESS = pathToFileURL(new URL("../../src/harness/harness.ts", import.meta.url).pathname).href;
    const REPL = pathToFileURL(new URL("../../storage-adapters/replicated/index.ts", import.meta.url).pathname).href;
    const LOOP = pathToFileURL(new URL("../../chaos/support/loop-model.ts", import.meta.url).pathname).href;
    const script = `
import { Harness } from ${JSON.stringify(HARNESS)};
import { createReplicatedStorage } from ${JSON.stringify(REPL)};
import { LoopModel } from ${JSON.stringify(LOOP)};
import { createInterface } from "node:readline";
const [endpoints, dataDir, work, cwd] = process.argv.slice(1);
const storage = createReplicatedStorage({ endpoints: endpoints.split(","), dataDir, commitTimeoutMs: 1500, healthIntervalMs: 250 });
const h = await Harness.open({ storage, name: "exit4", model: new LoopModel(500), workDir: work, snapshots: false });
let n = 0;
h.follow((l) => (n += l.length));
const s = await h.start({ goal: "loop", cwd, budgets: { max_rounds: 600 } });
h.wait(s).catch(() => undefined);
const t = setInterval(() => console.log("events " + n + " " + (h.storageState().stats.backlogCommits ?? 0)), 50);
const rl = createInterface({ input: process.stdin });
rl.on("line", async () => {
  clearInterval(t);
  rl.close();
  process.stdin.destroy();
  const t0 = performance.now();
  await h.close();
  await storage.close();
  console.log("closed " + Math.round(performance.now() - t0));
});
process.on("unhandledRejection", (e) => { console.log("unhandled " + String(e)); });
`;
    const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, cluster().endpoints.join(","), `${dirs.dir}/a4`, `${dirs.dir}/w4`, dirs.dir], { stdio: ["pipe", "pipe", "inherit"] });
    const lines: string[] = [];
    createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
    let exited: number | null = null;
    const exit = new Promise<void>((r) => child.on("exit", () => { exited = performance.now(); r(); }));
    try {
      await eventually(() => lines.some((l) => l.startsWith("events ") && Number(l.split(" ")[1]) >= 20), "the child runs rounds", 90_000);
      cluster().signal(1, "SIGSTOP");
      cluster().signal(2, "SIGSTOP");
      await eventually(() => lines.some((l) => l.startsWith("events ") && Number(l.split(" ")[2]) >= 1), "a commit waits in the child");
      child.stdin!.write("close\n");
      await eventually(() => lines.some((l) => l.startsWith("closed ")), "the child's close", 30_000);
      const closedAt = performance.now();
      await Promise.race([exit, new Promise((r) => setTimeout(r, 20_000))]);
      const closeMs = Number(lines.find((l) => l.startsWith("closed "))!.split(" ")[1]);
      assert.ok(closeMs < LIMIT_MS, `the child's close took ${closeMs} ms`);
      assert.deepEqual(lines.filter((l) => l.startsWith("unhandled")), []);
      assert.notEqual(exited, null, "the child did not exit within 20 s of closing everything (leaked handles keep it alive)");
      assert.ok(exited! - closedAt >= 0);
    } finally {
      child.kill("SIGKILL");
      cluster().signal(1, "SIGCONT");
      cluster().signal(2, "SIGCONT");
      await untilQuorum(cluster());
    }
  });

  it("a process whose only work is a commit waiting for the lost quorum stays alive until its receipt; after close() it exits by itself, no socket or timer left", async () => {
    const REPL = pathToFileURL(new URL("../../storage-adapters/replicated/index.ts", import.meta.url).pathname).href;
    const script = `
import { createInterface } from "node:readline";
const { createReplicatedStorage } = await import(${JSON.stringify(REPL)});
const [endpoints, dataDir] = process.argv.slice(1);
process.on("unhandledRejection", (e) => console.log("unhandled " + String(e)));
const s = createReplicatedStorage({ endpoints: endpoints.split(","), dataDir, attemptTimeoutMs: 500, commitTimeoutMs: 1500 });
const db = await s.open("lifetime");
console.log("opened");
const rl = createInterface({ input: process.stdin });
rl.once("line", async () => {
  rl.close();
  process.stdin.destroy();
  const AT = "2025-01-02T03:04:05.678Z";
  const r = await db.commit([{ identity: "life-1", kind: "timer_fired", session: "s1", at: AT, body: { timer_id: "t", due_at: AT, late_ms: 0 } }]);
  console.log("receipt " + JSON.stringify(r));
  await s.close();
  console.log("closed");
  setTimeout(() => console.log("left " + JSON.stringify(process.getActiveResourcesInfo().filter((r) => r !== "Timeout"))), 2000).unref();
});
`;
    const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, cluster().endpoints.join(","), `${dirs.dir}/life`], {
      cwd: new URL("../..", import.meta.url).pathname,
      stdio: ["pipe", "pipe", "inherit"],
    });
    const lines: string[] = [];
    createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
    let ended: string | null = null;
    const exit = new Promise<void>((r) => child.on("exit", (code, sig) => ((ended = `exit ${code ?? sig}`), r())));
    try {
      await eventually(() => lines.includes("opened"), "the child opened", 60_000);
      await cluster().freeze(1);
      await cluster().freeze(2);
      child.stdin!.write("go\n");
      await new Promise((r) => setTimeout(r, 3000));
      assert.equal(ended, null, `the child must not exit (or acknowledge) while its commit waits for the quorum: ${lines.join(" | ")}`);
      assert.ok(!lines.some((l) => l.startsWith("receipt")), "no receipt without a quorum");
      cluster().signal(1, "SIGCONT");
      cluster().signal(2, "SIGCONT");
      await eventually(() => lines.includes("closed"), `the child's receipt and close (${lines.join(" | ")})`, 60_000);
      // A hang guard: the child exits in moments once nothing of ours is left running.
      await Promise.race([exit, new Promise((r) => setTimeout(r, 20_000))]);
      assert.equal(ended, "exit 0", `the child was still running 20 s after close(): ${lines.join(" | ")}`);
      assert.ok(lines.includes('receipt {"firstSeq":1,"lastSeq":1}'), lines.join(" | "));
      assert.deepEqual(lines.filter((l) => l.startsWith("unhandled") || (l.startsWith("left ") && l !== "left []")), []);
    } finally {
      child.kill("SIGKILL");
      cluster().signal(1, "SIGCONT");
      cluster().signal(2, "SIGCONT");
      await untilQuorum(cluster());
    }
  });
});

exitAfterTests("test/replicated/close.test.ts");
