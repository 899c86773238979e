/**
 * Races in the Harness API (close, start, post, resume, validators) that the happy-path
 * tests do not reach. Each test names the guarantee it checks.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import { defaultWorld } from "../../src/harness/world.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import type { Database, Storage } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, note, scripted, tempDir } from "./support.js";
import { sleep, until } from "../support/wait.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };


function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** A model that decides with a function of the request. */
function modelOf(f: (req: ModelRequest) => unknown[]): Model {
  return { name: "fn", step: async (req) => ({ patch: f(req), usage: null }) };
}

/** Ends every run it sees with a failure conclusion (so runs finish quickly). */
const quitter = modelOf((req) => adds(req.state.revision, req.state.runtime.next_cell_id, [conclude("failure", "quit")]));

/**
 * Wraps a storage so that the commit holding an `execution_started` event resolves only when the test
 * says so, AFTER the inner commit is durable: the harness learns of its own durable commit late.
 */
function holdStartedCommit(inner: Storage): { storage: Storage; reached: Promise<void>; release: () => void } {
  let signalReached!: () => void;
  const reached = new Promise<void>((r) => (signalReached = r));
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const storage: Storage = {
    adapter: inner.adapter,
    reader: (n) => inner.reader(n),
    post: (n, m) => inner.post(n, m),
    list: () => inner.list(),
    close: () => inner.close(),
    async open(name, options) {
      const db = await inner.open(name, options);
      return new Proxy(db, {
        get(target, prop) {
          if (prop === "commit") {
            return async (events: Parameters<Database["commit"]>[0]) => {
              const receipt = await target.commit(events);
              if (events.some((e) => e.kind === "execution_started")) {
                signalReached();
                await gate;
              }
              return receipt;
            };
          }
          const v = Reflect.get(target, prop) as unknown;
          return typeof v === "function" ? (v as (...a: unknown[]) => unknown).bind(target) : v;
        },
      });
    },
  };
  return { storage, reached, release };
}

describe("close and launch", () => {
  it("close() while the execution_started commit is in flight: no cell code runs after close() returns", async () => {
    const t = tempDir();
    const effect = join(t.dir, "effect");
    const { storage, reached, release } = holdStartedCommit(createMemoryStorage());
    const model = scripted([adds(0, 1, [cmd("sh", "-c", `touch ${effect}`)]), adds(1, 2, [conclude("failure")])]);
    const h = await Harness.open({ storage, name: "r", model, workDir: t.dir, limits: fast });
    try {
      await h.start({ goal: "g", cwd: t.dir });
      await reached;
      const closing = h.close();
      release();
      await closing;
      await sleep(500);
      assert.equal(existsSync(effect), false, "the cell was released after close(): its code ran unsupervised, and close() did not stop it");
    } finally {
      release();
      await h.close();
      t.cleanup();
    }
  });

  it("close() is idempotent: a second concurrent close() resolves only once the running cell is stopped", async () => {
    const t = tempDir();
    const pidFile = join(t.dir, "pid");
    // The cell ignores SIGTERM, so stopping it takes the executor's grace period before SIGKILL.
    const model = scripted([adds(0, 1, [cmd("sh", "-c", `trap '' TERM; echo $$ > ${pidFile}; sleep 30`)])]);
    // Without a sandbox, so that the pid the cell writes is this host's.
    const h = await Harness.open({ storage: createMemoryStorage(), name: "r", model, workDir: t.dir, limits: fast, sandbox: { mode: "none" } });
    let first: Promise<void> | null = null;
    try {
      await h.start({ goal: "g", cwd: t.dir });
      await until("the cell to start", () => existsSync(pidFile) && readFileSync(pidFile, "utf8").trim() !== "");
      const pid = Number(readFileSync(pidFile, "utf8").trim());
      first = h.close();
      await h.close();
      assert.equal(alive(pid), false, `the second close() resolved while cell pid ${pid} was still running`);
    } finally {
      await first;
      await h.close();
      t.cleanup();
    }
  });
});

describe("concurrent callers", () => {
  it("two concurrent start() calls create two sessions", async () => {
    const t = tempDir();
    await withHarness({ storage: createMemoryStorage(), name: "r", model: quitter, workDir: t.dir, limits: fast }, async (h) => {
      const r = await Promise.allSettled([h.start({ goal: "a", cwd: t.dir }), h.start({ goal: "b", cwd: t.dir })]);
      const failed = r.filter((x) => x.status === "rejected").map((x) => String((x as PromiseRejectedResult).reason));
      assert.deepEqual(failed, [], "a concurrent start() failed");
      const ids = r.map((x) => (x as PromiseFulfilledResult<string>).value);
      assert.notEqual(ids[0], ids[1]);
    }).finally(() => t.cleanup());
  });

  it("the same outside observation posted twice concurrently is delivered once and both calls succeed", async () => {
    const t = tempDir();
    const model = scripted([adds(0, 1, [cmd("sleep", "5")]), adds(1, 2, [conclude("failure")]), adds(2, 3, [conclude("failure")])]);
    await withHarness({ storage: createMemoryStorage(), name: "r", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      const obs = { id: "ci-1", kind: "ci", payload: { green: true } };
      const r = await Promise.allSettled([h.post(s, obs), h.post(s, obs)]);
      const failed = r.filter((x) => x.status === "rejected").map((x) => String((x as PromiseRejectedResult).reason));
      assert.deepEqual(failed, [], "duplicate delivery must be a no-op, not an error");
    }).finally(() => t.cleanup());
  });

  it("resume() called twice concurrently records one UnknownExecution and neither call fails", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    const marker = join(t.dir, "running");
    const h1 = await Harness.open({ storage, name: "r", model: scripted([adds(0, 1, [cmd("sh", "-c", `touch ${marker}; sleep 30`)])]), workDir: t.dir, limits: fast });
    const s = await h1.start({ goal: "g", cwd: t.dir });
    await until("the cell to run", () => existsSync(marker));
    // A second owner on "another host": recovery records the cell without trying to stop it here.
    const h2 = await Harness.open({ storage, name: "r", model: quitter, workDir: t.dir, limits: fast, world: { ...defaultWorld(), host: "other-host" } });
    try {
      await h1.close();
      const r = await Promise.allSettled([h2.resume(), h2.resume()]);
      const failed = r.filter((x) => x.status === "rejected").map((x) => String((x as PromiseRejectedResult).reason));
      assert.deepEqual(failed, [], "resume() is documented idempotent");
      // Concurrent calls share one recovery: each reports the one UnknownExecution it recorded.
      assert.deepEqual(r.map((x) => (x.status === "fulfilled" ? x.value.recovered : -1)), [1, 1]);
      assert.equal([...h2.session(s)!.executions.values()].filter((e) => e.result === "UnknownExecution").length, 1);
      assert.equal(h2.session(s)!.executions.get(1)!.result, "UnknownExecution");
    } finally {
      await h1.close();
      await h2.close();
      t.cleanup();
    }
  });
});

describe("success conclusion", () => {
  it("an observation that arrives while the validators run is seen by the model before success is accepted", async () => {
    const t = tempDir();
    const marker = join(t.dir, "validating");
    const model = modelOf((req) => adds(req.state.revision, req.state.runtime.next_cell_id, [conclude("success", `round ${req.state.revision}`)]));
    await withHarness({ storage: createMemoryStorage(), name: "r", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir, validators: [["sh", "-c", `touch ${marker}; sleep 1`]] });
      await until("the validator to start", () => existsSync(marker));
      await h.post(s, { id: "ci-red", kind: "ci", payload: { green: false } });
      const out = await h.wait(s);
      const sp = h.session(s)!;
      assert.equal(out.result, "success");
      assert.ok(
        sp.consumed.has("ci-red"),
        `the run ended "${out.reason}" while observation ci-red (acknowledged by post()) was never delivered to the model (pending: ${sp.pending.join(", ")})`,
      );
    }).finally(() => t.cleanup());
  });
});

describe("the timer socket", () => {
  it("a second harness on the same database in the same process keeps a working timer socket after the first is fenced", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    const h1 = await Harness.open({ storage, name: "r", model: quitter, workDir: t.dir, limits: fast });
    const stopped = new Promise<void>((r) => h1.onStop(() => r()));
    const model = scripted([adds(0, 1, [cmd("sh", "-c", 'test -S "$CAIRN_TIMER_SOCKET" || { echo "no socket at $CAIRN_TIMER_SOCKET"; exit 3; }')]), adds(1, 2, [conclude("failure", "end")])]);
    const h2 = await Harness.open({ storage, name: "r", model, workDir: t.dir, limits: fast });
    try {
      await stopped;
      await h1.close();
      const s = await h2.start({ goal: "g", cwd: t.dir });
      await h2.wait(s);
      const ex = h2.session(s)!.executions.get(1)!;
      assert.equal(ex.result, "success", `the cell could not reach the timer socket: ${ex.output_tail}`);
    } finally {
      await h1.close();
      await h2.close();
      t.cleanup();
    }
  });

  it("close() does not hang when a client holds the timer socket open without sending a request", async () => {
    const t = tempDir();
    const model = scripted([adds(0, 1, [cmd("sh", "-c", 'echo "$CAIRN_TIMER_SOCKET"')]), adds(1, 2, [note("saw it")]), adds(2, 3, [conclude("failure", "end")])]);
    // Without a sandbox: the test connects to the socket's host path.
    const h = await Harness.open({ storage: createMemoryStorage(), name: "r", model, workDir: t.dir, limits: fast, sandbox: { mode: "none" } });
    let client: Socket | null = null;
    try {
      const s = await h.start({ goal: "g", cwd: t.dir });
      await until("the cell to finish", () => h.session(s)?.executions.get(1)?.phase === "finished");
      const path = h.session(s)!.executions.get(1)!.output_tail.trim();
      client = connect(path);
      client.on("error", () => undefined);
      await new Promise((r) => client!.once("connect", r));
      const outcome = await Promise.race([h.close().then(() => "closed"), sleep(8000).then(() => "hung")]);
      assert.equal(outcome, "closed", "close() waited for an idle timer-socket client");
    } finally {
      client?.destroy();
      await h.close();
      t.cleanup();
    }
  });
});
