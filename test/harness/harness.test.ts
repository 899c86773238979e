import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, note, scripted, tempDir } from "./support.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20 };

describe("Harness on the memory adapter", () => {
  it("runs a scripted session to success: cells run once, in order, and validators gate the conclusion", async () => {
    const t = tempDir();
    try {
      const effect = join(t.dir, "effect.txt");
      const model = scripted([
        adds(0, 1, [note("plan"), cmd("sh", "-c", `echo one >> ${effect}`), cmd("sh", "-c", `echo two >> ${effect}`)]),
        adds(1, 4, [note("both ran")]),
        adds(2, 5, [conclude("success")]),
        adds(3, 6, [conclude("success", "again")]),
      ]);
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "write two lines", cwd: t.dir, validators: [["test", "-f", effect]] });
        const out = await h.wait(s);
        assert.equal(out.result, "success", out.reason);
        assert.equal(readFileSync(effect, "utf8"), "one\ntwo\n");
        const i = h.inspect();
        const sess = i.sessions[0]!;
        assert.equal(sess.status, "success");
        assert.deepEqual(sess.executions.map((e) => [e.cell_id, e.result]), [[2, "success"], [3, "success"]]);
        assert.equal(sess.unresolved_unknown.length, 0);
      });
    } finally {
      t.cleanup();
    }
  });

  it("refuses a success conclusion while a validator fails, and tells the model why", async () => {
    const t = tempDir();
    try {
      const model = scripted([adds(0, 1, [conclude("success")]), adds(1, 2, [conclude("failure", "cannot pass")])]);
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir, validators: [["false"]] });
        const out = await h.wait(s);
        assert.equal(out.result, "failure");
        const sp = h.session(s)!;
        assert.equal(sp.controls.get(1)?.outcome, "refused");
        assert.match(sp.controls.get(1)!.detail, /validator `false` failed/);
        const obs = sp.observations.get("control:1");
        assert.ok(obs, "the refusal reached the model as an observation");
      });
    } finally {
      t.cleanup();
    }
  });

  it("pauses the queue after an error until the model has seen it", async () => {
    const t = tempDir();
    try {
      const effect = join(t.dir, "after.txt");
      const model = scripted([
        adds(0, 1, [cmd("false"), cmd("touch", effect)]),
        // Round 2 sees the error; only now may cell 2 run.
        adds(1, 3, [note("saw the error")]),
        adds(2, 4, [conclude("success")]),
      ]);
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        const out = await h.wait(s);
        assert.equal(out.result, "success", out.reason);
        const sp = h.session(s)!;
        const errFinished = sp.executions.get(1)!.finished_seq!;
        const secondStarted = sp.executions.get(2)!.started!.seq;
        const accepted = sp.turns.get(`${s}:t2`)!.accepted!.seq;
        assert.ok(errFinished < accepted && accepted < secondStarted, `cell 2 started (seq ${secondStarted}) only after the round that saw the error (seq ${accepted})`);
      });
    } finally {
      t.cleanup();
    }
  });

  it("records invalid_idle and ends an idling run as a failure, without polling the model", async () => {
    const t = tempDir();
    try {
      const model = scripted([adds(0, 1, [note("a")]), adds(1, 2, [note("b")]), adds(2, 3, [note("c")]), adds(3, 4, [note("d")])]);
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: { ...fast, maxIdle: 3 } }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        const out = await h.wait(s);
        assert.equal(out.result, "failure");
        assert.match(out.reason, /3 idle decisions/);
        const sp = h.session(s)!;
        assert.equal(sp.turn_count, 3);
        assert.ok(sp.observations.has("idle:1") && sp.observations.has("idle:3"));
      });
    } finally {
      t.cleanup();
    }
  });

  it("shows a rejected patch's reason to the next attempt and counts attempts", async () => {
    const t = tempDir();
    try {
      let calls = 0;
      const seen: string[] = [];
      const model = {
        name: "flaky",
        async step(req: { state: { revision: number }; rejection?: { reason: string } }) {
          calls++;
          if (req.rejection) seen.push(req.rejection.reason);
          if (calls === 1) return { patch: [{ op: "test", path: "/revision", value: 7 }], usage: { input_tokens: 10, output_tokens: 1 } };
          return { patch: adds(req.state.revision, 1, [conclude("failure", "stop")]), usage: { input_tokens: 10, output_tokens: 2 } };
        },
      };
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await h.wait(s);
        assert.equal(calls, 2);
        assert.equal(seen.length, 1);
        assert.match(seen[0]!, /revision/);
        const u = h.session(s)!.state.runtime.usage;
        assert.equal(u.attempts, 2);
        assert.equal(u.input_tokens, 20);
        assert.equal(u.unknown_usage_attempts, 0);
      });
    } finally {
      t.cleanup();
    }
  });

  it("delivers outside observations once, refuses forged and conflicting ids, and wakes the model", async () => {
    const t = tempDir();
    try {
      const model = scripted([adds(0, 1, [cmd("sleep", "0.3")]), adds(1, 2, [note("got it")]), adds(2, 3, [conclude("failure", "end")])]);
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        assert.deepEqual(await h.post(s, { id: "ci-1", kind: "ci", payload: { ok: true } }), { duplicate: false });
        assert.deepEqual(await h.post(s, { id: "ci-1", kind: "ci", payload: { ok: true } }), { duplicate: true });
        await assert.rejects(h.post(s, { id: "ci-1", kind: "ci", payload: { ok: false } }), (e: Error & { reason?: string }) => e.reason === "conflict");
        await assert.rejects(h.post(s, { id: "execution:1", kind: "x", payload: null }), /reserved/);
        await h.wait(s);
        assert.ok(h.session(s)!.consumed.has("ci-1"));
      });
    } finally {
      t.cleanup();
    }
  });

  it("fires a timer registered by a running cell through `cairn timer`, exactly once", async () => {
    const t = tempDir();
    try {
      const cli = join(process.cwd(), "src", "cli", "entry.ts");
      writeFileSync(join(t.dir, "noop"), "");
      const model = scripted([
        adds(0, 1, [cmd(process.execPath, "--import", "tsx", cli, "timer", "--id", "wake", "--in", "1s", "--note", "check later")]),
        adds(1, 2, [note("timer registered")]),
        adds(2, 3, [conclude("failure", "woke up")]),
      ]);
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: process.cwd() });
        const out = await h.wait(s);
        assert.match(out.reason, /woke up/);
        const sp = h.session(s)!;
        assert.equal(sp.executions.get(1)?.result, "success", sp.executions.get(1)?.output_tail);
        assert.equal(sp.timers.get("wake")?.fired, true);
        assert.ok(sp.consumed.has("timer:wake"));
      });
    } finally {
      t.cleanup();
    }
  });
});

describe("harness edges", () => {
  it("records a burst of output in small events, truncation marked, and the run goes on", async () => {
    const { splitText } = await import("../../src/harness/session.js");
    assert.deepEqual(splitText("abcdef", 4), ["abcd", "ef"]);
    assert.deepEqual(splitText("ab\u{1F600}cd", 3), ["ab", "\u{1F600}c", "d"], "never cuts a surrogate pair");
    assert.deepEqual(splitText("", 4), []);
    const t = tempDir();
    try {
      const model = scripted([adds(0, 1, [cmd("python3", "-c", "import sys; sys.stdout.write('y' * 300000)")]), adds(1, 2, [conclude("failure", "end")])]);
      const h = await Harness.open({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: { ...fast, executionOutputLimitBytes: 200_000 } });
      const sizes: number[] = [];
      h.follow((events) => {
        const outs = events.filter((e) => e.kind === "execution_output");
        if (outs.length > 0) assert.ok(outs.length <= 8, "at most 8 output events per commit");
        for (const e of outs) sizes.push((e.body as { data: string }).data.length);
      });
      try {
        const s = await h.wait(await h.start({ goal: "g", cwd: t.dir }));
        assert.equal(s.result, "failure");
        assert.ok(sizes.length >= 13, `200 KB in events of at most 16 KiB: ${sizes.length}`);
        assert.ok(sizes.every((n) => n <= 16_384));
        const ex = h.session("s1")!.executions.get(1)!;
        assert.equal(ex.dropped_bytes, 100_000);
        assert.match(ex.output_tail, /output truncated after 200000 bytes; 100000 bytes dropped/);
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("a model that throws a plain error or returns nothing is retried within the attempt budget, each attempt recorded", async () => {
    const t = tempDir();
    try {
      let calls = 0;
      const model = {
        name: "buggy",
        async step(req: { state: { revision: number } }) {
          calls++;
          if (calls === 1) throw new TypeError("provider bug");
          if (calls === 2) return undefined as never;
          return { patch: adds(req.state.revision, 1, [conclude("failure", "third time")]), usage: null };
        },
      };
      await withHarness({ storage: createMemoryStorage(), name: "h1", model, workDir: t.dir, limits: fast }, async (h) => {
        const out = await h.wait(await h.start({ goal: "g", cwd: t.dir }));
        assert.match(out.reason, /third time/);
        const u = h.session("s1")!.state.runtime.usage;
        assert.equal(u.attempts, 3);
        assert.equal(u.unknown_usage_attempts, 3, "no usage was reported for any attempt");
      });
    } finally {
      t.cleanup();
    }
  });
});
