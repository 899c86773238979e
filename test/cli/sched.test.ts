/**
 * Issue 9, in-process (main(argv, io)): serve validates flags and binds its port before it touches
 * the database, never creates one by a typo, and exits 2 with one sentence leaving the epoch as it
 * was; `cairn submit` and `--session` are idempotent and refuse conflicts and reserved ids; `cairn
 * status` shows the owner, whether it is gone, and pending start requests; a post to a run still
 * waiting in the mailbox is accepted.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import BetterSqlite3 from "better-sqlite3";
import { main, type Io } from "../../src/cli/main.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { tempDir } from "../harness/support.js";
import { hasStack } from "./support.js";

const t = tempDir("cairn-sched-");
after(() => t.cleanup());

function io(env: NodeJS.ProcessEnv = {}): Io & { outText: () => string; errText: () => string } {
  const out: string[] = [];
  const err: string[] = [];
  return { out: (l) => out.push(l), err: (l) => err.push(l), env, outText: () => out.join("\n"), errText: () => err.join("\n") };
}

function epochOf(dataDir: string, db: string): number {
  const conn = new BetterSqlite3(join(dataDir, `${db}.db`), { readonly: true });
  try {
    return (conn.prepare("SELECT epoch FROM owner WHERE id = 1").get() as { epoch: number }).epoch;
  } finally {
    conn.close();
  }
}

const script = join(t.dir, "rounds.json");
writeFileSync(script, JSON.stringify({ rounds: [{ patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "done" } }] }] }));

describe("cairn serve start-up order", () => {
  const data = join(t.dir, "order");
  const common = ["--db", "w1", "--data-dir", data, "--model", `scripted:${script}`];

  it("a missing database is exit 2 with one sentence, and nothing is created (--create is explicit)", async () => {
    const r = io();
    const code = await main(["serve", "--db", "tpyo", "--data-dir", data, "--model", `scripted:${script}`, "--listen", "127.0.0.1:0"], r);
    assert.equal(code, 2, r.errText());
    assert.match(r.errText(), /database "tpyo" does not exist.*--create/);
    assert.equal(r.errText().split("\n").length, 1);
    assert.equal(existsSync(join(data, "tpyo.db")), false);
  });

  it("--listen nonsense and a busy port are exit 2 with one sentence, and the epoch is unchanged", async () => {
    const sub = io();
    assert.equal(await main(["submit", "a goal", "--db", "w1", "--data-dir", data], sub), 0, sub.errText());
    const before = epochOf(data, "w1");
    for (const listen of ["nonsense", "127.0.0.1:99999", "host:port"]) {
      const r = io();
      assert.equal(await main(["serve", ...common, "--listen", listen], r), 2, r.errText());
      assert.match(r.errText(), /--listen expects HOST:PORT/);
      assert.ok(!hasStack(r.errText()));
    }
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", resolve));
    try {
      const port = (busy.address() as { port: number }).port;
      const r = io();
      assert.equal(await main(["serve", ...common, "--listen", `127.0.0.1:${port}`], r), 2, r.errText());
      assert.match(r.errText(), /cannot listen on 127\.0\.0\.1:\d+: the port is already in use/);
      assert.equal(r.errText().split("\n").length, 1);
    } finally {
      busy.close();
    }
    // A bad flag from the environment is refused the same way.
    const e = io({ CAIRN_LISTEN: "nowhere", CAIRN_TAKEOVER: "maybe" });
    assert.equal(await main(["serve", ...common], e), 2);
    // The model flags serve shares with run, on the command line and from the environment.
    for (const [args, env, says] of [
      [["--model-timeout", "soon"], {}, /--model-timeout expects a duration/],
      [["--model-retry-budget", "forever"], {}, /--model-retry-budget expects a duration/],
      [[], { CAIRN_MAX_OUTPUT_TOKENS: "-3" }, /--max-output-tokens expects a positive whole number/],
    ] as const) {
      const m = io(env);
      assert.equal(await main(["serve", ...common, "--listen", "127.0.0.1:0", ...args], m), 2, m.errText());
      assert.match(m.errText(), says);
      assert.equal(m.errText().split("\n").length, 1);
    }
    assert.equal(epochOf(data, "w1"), before, "no failed serve claimed the database");
  });
});

describe("cairn submit and --session", () => {
  const data = join(t.dir, "submit");
  const base = ["--db", "jobs", "--data-dir", data];

  it("submitting the same --session twice is one request; another goal under it is refused; reserved ids are refused", async () => {
    const a = io();
    assert.equal(await main(["submit", "build the thing", ...base, "--session", "job-1", "--validator", "true"], a), 0, a.errText());
    assert.equal(a.outText(), "job-1");
    const b = io();
    assert.equal(await main(["submit", "build the thing", ...base, "--session", "job-1", "--validator", "true"], b), 0, b.errText());
    assert.equal(b.outText(), "job-1");
    assert.match(b.errText(), /already submitted/);
    const c = io();
    assert.equal(await main(["submit", "another goal", ...base, "--session", "job-1"], c), 2);
    assert.match(c.errText(), /another goal or settings/);
    for (const bad of ["s3", "s-12345678", "9lives", "a b", "x".repeat(65)]) {
      const r = io();
      assert.equal(await main(["submit", "g", ...base, "--session", bad], r), 2, bad);
      assert.equal(r.errText().split("\n").length, 1);
    }
    // Without --session, Cairn assigns an id of its reserved form.
    const d = io();
    assert.equal(await main(["submit", "anything", ...base], d), 0);
    assert.match(d.outText(), /^s-[0-9a-f]{8}$/);

    const storage = createSqliteStorage({ dataDir: data });
    try {
      const reader = await storage.reader("jobs");
      const pending = (await reader.pending!()).filter((m) => m.kind === "cairn.start");
      await reader.close();
      assert.deepEqual(pending.map((m) => m.session), ["job-1", d.outText()]);
    } finally {
      await storage.close();
    }
  });

  it("status shows pending start requests and no owner; a post to a run waiting in the mailbox is accepted and delivered after the start", async () => {
    const p = io();
    assert.equal(await main(["post", ...base, "--session", "job-1", "--id", "note-1", "--kind", "ci", "--payload", '{"green":true}'], p), 0, p.errText());
    assert.match(p.outText(), /after the start/);
    const missing = io();
    assert.equal(await main(["post", ...base, "--session", "job-9", "--id", "n", "--kind", "ci", "--payload", "1"], missing), 2);
    const st = io();
    assert.equal(await main(["status", ...base, "--json"], st), 0, st.errText());
    const doc = JSON.parse(st.outText()) as { owner: unknown; pending_starts: { session: string }[] };
    assert.equal(doc.owner, null);
    assert.deepEqual(doc.pending_starts.map((x) => x.session).slice(0, 1), ["job-1"]);
    const text = io();
    await main(["status", ...base], text);
    assert.match(text.outText(), /owner: none/);
    assert.match(text.outText(), /pending start: job-1/);

    // Any owner starts waiting requests: a `cairn resume` drives job-1 (and the other) to the end.
    const rounds = join(t.dir, "job.json");
    writeFileSync(
      rounds,
      JSON.stringify({
        rounds: [
          { patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "note", text: "plan" } }] },
          { patch: [{ op: "test", path: "/revision", value: 1 }, { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "ok" } }] },
        ],
      }),
    );
    const r = io();
    const code = await main(["run", "build the thing", ...base, "--session", "job-1", "--validator", "true", "--model", `scripted:${rounds}`], r);
    assert.equal(code, 0, r.errText() + r.outText());
    const after = io();
    await main(["status", ...base, "--json", "--session", "job-1"], after);
    const s = (JSON.parse(after.outText()) as { sessions: { id: string; status: string }[] }).sessions[0]!;
    assert.equal(s.status, "success");
    const storage = createSqliteStorage({ dataDir: data });
    try {
      const reader = await storage.reader("jobs");
      const log = await reader.read(0);
      await reader.close();
      const created = log.find((e) => e.kind === "session_created" && e.session === "job-1");
      const delivered = log.find((e) => e.kind === "inbox_received" && e.session === "job-1" && JSON.stringify(e.body).includes("note-1"));
      assert.ok(created && delivered && delivered.seq > created.seq, "the post sent while the run waited in the mailbox reached it after its start");
    } finally {
      await storage.close();
    }
    // The same command again: reports that run, starts nothing.
    const again = io();
    assert.equal(await main(["run", "build the thing", ...base, "--session", "job-1", "--validator", "true", "--model", `scripted:${rounds}`], again), 0);
    assert.match(again.outText(), /already ended: success/);
    const all = io();
    await main(["status", ...base, "--json"], all);
    const ids = (JSON.parse(all.outText()) as { sessions: { id: string }[] }).sessions.map((x) => x.id);
    assert.equal(ids.filter((x) => x === "job-1").length, 1);
    assert.equal(ids.length, 2, `one run per submitted id: ${ids.join(", ")}`);
  });
});
