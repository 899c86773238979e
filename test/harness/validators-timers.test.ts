/**
 * Validators that hang, the storage mailbox under a full inbox, and timer registrations that
 * race.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { connect } from "node:net";
import { Harness } from "../../src/harness/harness.js";
import { createExecutor } from "../../src/exec/executor.js";
import { runValidator } from "../../src/harness/validators.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, note, scripted, tempDir } from "./support.js";
import { sleep, until } from "../support/wait.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };


function processesMatching(pattern: string): string[] {
  try {
    return execFileSync("pgrep", ["-f", pattern], { encoding: "utf8" }).trim().split("\n").filter((l) => l !== "");
  } catch {
    return [];
  }
}

describe("validators", () => {
  it("a validator's wall-time limit bounds it even when its child keeps running, and the child is stopped", async () => {
    const t = tempDir();
    const tag = `sleep 19.${process.pid}`;
    try {
      // `sh` is killed at the limit; its child `sleep` keeps stdout open and is not in any group we stop.
      const run = runValidator(createExecutor({ killGraceMs: 200 }), ["sh", "-c", `${tag}; exit 0`], t.dir, 500, t.dir);
      const r = await Promise.race([run, sleep(8000).then(() => null)]);
      assert.ok(r !== null, "8 s after a 0.5 s validator limit the validator had not returned: a success conclusion waits on it");
      assert.equal(r.passed, false);
      await sleep(300);
      assert.deepEqual(processesMatching(tag), [], "the validator's child outlived the validator");
    } finally {
      for (const pid of processesMatching(tag)) {
        try {
          process.kill(Number(pid), "SIGKILL");
        } catch {
          // gone
        }
      }
      t.cleanup();
    }
  });
});

describe("the storage mailbox", () => {
  it("a full inbox in one session does not hold back mailbox messages for another session", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    // s1's model call hangs (so s1's inbox is never read); s2 runs a long cell and waits.
    const model: Model = {
      name: "two",
      step: (req: ModelRequest) =>
        req.state.id === "s1"
          ? new Promise((_r, reject) => req.signal?.addEventListener("abort", () => reject(new Error("aborted"))))
          : Promise.resolve({ patch: req.state.revision === 0 ? adds(0, 1, [cmd("sleep", "20")]) : adds(req.state.revision, req.state.runtime.next_cell_id, [note("ok")]), usage: null }),
    };
    await withHarness({ storage, name: "mb", model, workDir: t.dir, limits: { ...fast, inboxLimit: 1 } }, async (h) => {
      const s1 = await h.start({ goal: "one", cwd: t.dir });
      const s2 = await h.start({ goal: "two", cwd: t.dir });
      await until("both sessions to be busy", () => h.session(s1)!.open_turn !== null && h.session(s2)!.executions.get(1)?.phase === "started");
      await h.post(s1, { id: "fill", kind: "k", payload: 1 }); // s1's inbox is now full (limit 1)
      await storage.post("mb", { id: "for-s1", session: s1, kind: "k", payload: 2, at: new Date().toISOString() });
      await storage.post("mb", { id: "for-s2", session: s2, kind: "k", payload: 3, at: new Date().toISOString() });
      await sleep(1000);
      assert.ok(h.session(s2)!.observations.has("for-s2"), "s2's message waits behind s1's, for as long as s1's inbox stays full");
    }).finally(() => t.cleanup());
  });
});

describe("the storage mailbox after a full inbox drains", () => {
  it("a message left behind for a full inbox is delivered once a turn consumes that inbox", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    // The first model call waits until the test lets it go, so the inbox stays full meanwhile. Every
    // other turn runs a short cell (a turn with nothing to run would count as idle).
    let letGo: () => void = () => undefined;
    const held = new Promise<void>((resolve) => (letGo = resolve));
    let calls = 0;
    const model: Model = {
      name: "held",
      step: async (req: ModelRequest) => {
        calls++;
        if (calls === 1) await held;
        const seen = req.state.runtime.inbox.some((o) => o.id === "behind");
        const rev = req.state.revision;
        return { patch: seen ? adds(rev, req.state.runtime.next_cell_id, [note("got it")]) : adds(rev, req.state.runtime.next_cell_id, [cmd("sleep", "0.2")]), usage: null };
      },
    };
    const h = await Harness.open({ storage, name: "mbf", model, workDir: t.dir, limits: { ...fast, inboxLimit: 1 } });
    try {
      const s = await h.start({ goal: "wait for the message", cwd: t.dir, budgets: { max_rounds: 50 } });
      await until("the first turn to be open", () => h.session(s)!.open_turn !== null);
      await h.post(s, { id: "fill", kind: "k", payload: 1 }); // the inbox is full (limit 1)
      await storage.post("mbf", { id: "behind", session: s, kind: "k", payload: 2, at: new Date().toISOString() });
      await sleep(500);
      assert.equal(h.session(s)!.observations.has("behind"), false, "held in the mailbox while the inbox is full");
      letGo();
      await until("the message left behind to be delivered once the inbox has room", () => h.session(s)!.observations.has("behind"), 60_000);
      await until("a turn to see it", () => [...h.session(s)!.cells.values()].some((c) => c.kind === "note" && c.text === "got it"), 60_000);
    } finally {
      letGo();
      await h.close();
      t.cleanup();
    }
  });
});

describe("timers", () => {
  it("two concurrent registrations of the same timer id both succeed and register it once", async () => {
    const t = tempDir();
    const model = scripted([adds(0, 1, [cmd("sh", "-c", 'echo "$CAIRN_TIMER_SOCKET $CAIRN_CELL_TOKEN"; sleep 5')]), adds(1, 2, [conclude("failure", "end")])]);
    // Without a sandbox: this test speaks for the cell from outside, so it needs the socket's host path.
    await withHarness({ storage: createMemoryStorage(), name: "tm", model, workDir: t.dir, limits: fast, sandbox: { mode: "none" } }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      await until("the socket path", () => (h.session(s)?.executions.get(1)?.output_tail ?? "").includes("\n"));
      const [path, token] = h.session(s)!.executions.get(1)!.output_tail.trim().split(" ") as [string, string];
      const ask = () =>
        new Promise<{ ok: boolean; error?: string }>((resolve, reject) => {
          const c = connect(path);
          let buf = "";
          c.setEncoding("utf8");
          c.on("connect", () => c.write(JSON.stringify({ token, timer_id: "wake:1", delay_seconds: 3600 }) + "\n"));
          c.on("data", (d: string) => (buf += d));
          c.on("end", () => resolve(JSON.parse(buf) as { ok: boolean; error?: string }));
          c.on("error", reject);
        });
      const replies = await Promise.all([ask(), ask()]);
      assert.deepEqual(
        replies.map((r) => r.ok),
        [true, true],
        `a retried registration (same id) must be idempotent: ${replies.map((r) => r.error ?? "ok").join(" | ")}`,
      );
      assert.equal(h.session(s)!.timers.size, 1);
    }).finally(() => t.cleanup());
  });

  it("a timer id with odd characters and a 10-year delay is registered, shown, and does not fire early", async () => {
    const t = tempDir();
    const model = scripted([adds(0, 1, [cmd("sh", "-c", 'echo "$CAIRN_TIMER_SOCKET $CAIRN_CELL_TOKEN"; sleep 3')]), adds(1, 2, [note("waiting")]), adds(2, 3, [conclude("failure", "end")])]);
    // Without a sandbox: this test speaks for the cell from outside, so it needs the socket's host path.
    await withHarness({ storage: createMemoryStorage(), name: "tm", model, workDir: t.dir, limits: fast, sandbox: { mode: "none" } }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      await until("the socket path", () => (h.session(s)?.executions.get(1)?.output_tail ?? "").includes("\n"));
      const [path, token] = h.session(s)!.executions.get(1)!.output_tail.trim().split(" ") as [string, string];
      const reply = await new Promise<{ ok: boolean; due_at?: string }>((resolve, reject) => {
        const c = connect(path);
        let buf = "";
        c.setEncoding("utf8");
        c.on("connect", () => c.write(JSON.stringify({ token, timer_id: "a.b_c:d-e", delay_seconds: 10 * 365 * 86400 }) + "\n"));
        c.on("data", (d: string) => (buf += d));
        c.on("end", () => resolve(JSON.parse(buf) as { ok: boolean }));
        c.on("error", reject);
      });
      assert.equal(reply.ok, true);
      await sleep(1500);
      const timer = h.session(s)!.timers.get("a.b_c:d-e");
      assert.ok(timer);
      assert.equal(timer.fired, false);
      assert.equal(h.inspect().sessions[0]!.timers.length, 1);
    }).finally(() => t.cleanup());
  });
});
