/**
 * The effect ledger's cell-socket requests against a real Harness: real cells (cmd, no sandbox so the
 * test can read the socket path they were given) hold real tokens, and the test speaks the socket
 * with them as `cairn effect` and the Python helper do. What is checked: begin is committed before it
 * answers proceed; done, uncertain and retry; one answer per name at a time; keys per run and per
 * launch; another run's ledger and another cell's token are out of reach; bad input is refused with
 * nothing committed; a fenced owner's begin is refused (never proceed) while its done stays done; the
 * CLI's words and exit codes; the Python module.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { promisify } from "node:util";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import type { LogEvent } from "../../src/state/events.js";
import type { State } from "../../src/state/schema.js";
import type { Storage } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { passThrough, passThroughStorage } from "../../chaos/support/passthrough.js";
import { until } from "../support/wait.js";
import { tempDir } from "./support.js";

const run = promisify(execFile);
const fast = { retryBaseMs: 1, outputFlushMs: 20 };
const UUID8 = /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/**
 * Each round adds one cmd cell that writes what it was given (socket, token, launch key, PYTHONPATH)
 * to `creds-<session>-<cell>` and waits for `release-<session>-<cell>`; after `cells` of them, concludes.
 */
class WaitingCells implements Model {
  readonly name = "effects-test";
  constructor(
    private readonly dir: string,
    private readonly cells: number,
  ) {}
  async step(req: ModelRequest): Promise<ModelReply> {
    const s: State = req.state;
    const id = s.runtime.next_cell_id;
    const done = s.cells.filter((c) => c.kind === "cmd").length >= this.cells;
    const sh = `printf '%s\\n%s\\n%s\\n%s\\n' "$CAIRN_TIMER_SOCKET" "$CAIRN_CELL_TOKEN" "$CAIRN_EFFECT_KEY" "$PYTHONPATH" > '${this.dir}/creds-'$CAIRN_SESSION-$CAIRN_CELL; while [ ! -e '${this.dir}/release-'$CAIRN_SESSION-$CAIRN_CELL ]; do sleep 0.05; done`;
    const cell = done ? { kind: "note", role: "conclusion", result: "success", text: "done" } : { kind: "cmd", argv: ["sh", "-c", sh] };
    return { patch: [{ op: "test", path: "/revision", value: s.revision }, { op: "add", path: "/cells/-", value: { id, previous_id: null, ...cell } }], usage: null };
  }
}

type Reply = { ok: boolean; [k: string]: unknown };

/** One request on the cell socket, as the CLI sends it. */
function ask(socket: string, req: Record<string, unknown>): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const c = connect(socket);
    c.setTimeout(60_000, () => c.destroy(new Error(`no reply to ${JSON.stringify(req)} (hang guard)`)));
    let buf = "";
    c.setEncoding("utf8");
    c.on("connect", () => c.write(JSON.stringify(req) + "\n"));
    c.on("data", (d: string) => (buf += d));
    c.on("end", () => {
      try {
        resolve(JSON.parse(buf) as Reply);
      } catch (err) {
        reject(err as Error);
      }
    });
    c.on("error", reject);
  });
}

interface Cell {
  readonly session: string;
  readonly cell: number;
  readonly socket: string;
  readonly token: string;
  readonly launchKey: string;
  readonly pythonPath: string;
  begin(name: string, retry?: boolean): Promise<Reply>;
  end(name: string, result?: unknown): Promise<Reply>;
  key(name: string): Promise<Reply>;
  release(): void;
}

/** The running cell `cell` of `session`, once it wrote what it was given. */
async function cellOf(dir: string, session: string, cell: number): Promise<Cell> {
  const file = join(dir, `creds-${session}-${cell}`);
  const lines = await until(`cell ${cell} of ${session} to start`, () => {
    if (!existsSync(file)) return undefined;
    const l = readFileSync(file, "utf8").split("\n");
    return l.length >= 5 ? l : undefined;
  }, 60_000, 20);
  const [socket, token, launchKey, pythonPath] = lines as [string, string, string, string];
  return {
    session,
    cell,
    socket,
    token,
    launchKey,
    pythonPath,
    begin: (name, retry) => ask(socket, { token, op: "effect_begin", name, ...(retry === undefined ? {} : { retry }) }),
    end: (name, result) => ask(socket, { token, op: "effect_end", name, ...(result === undefined ? {} : { result }) }),
    key: (name) => ask(socket, { token, op: "effect_key", name }),
    release: () => writeFileSync(join(dir, `release-${session}-${cell}`), ""),
  };
}

async function logOf(storage: Storage, name: string): Promise<LogEvent[]> {
  const r = await storage.reader(name);
  try {
    return await r.read(0);
  } finally {
    await r.close();
  }
}

const begunEvents = (log: readonly LogEvent[], session: string, name: string): LogEvent<"effect_begun">[] =>
  log.filter((e): e is LogEvent<"effect_begun"> => e.kind === "effect_begun" && e.session === session && e.body.name === name);

describe("the effect ledger over the cell socket", { timeout: 300_000 }, () => {
  const t = tempDir("cairn-effects-");
  const harnesses: Harness[] = [];
  after(async () => {
    for (const h of harnesses) await h.close().catch(() => undefined);
    t.cleanup();
  });
  /** A harness on `storage` whose cells leave their files in `<tmp>/<name>` (runs of every database are s1, s2, ...). */
  const open = async (storage: Storage, name: string, cells: number): Promise<Harness> => {
    mkdirSync(join(t.dir, name), { recursive: true });
    const h = await Harness.open({ storage, name, model: new WaitingCells(join(t.dir, name), cells), workDir: join(t.dir, "work"), limits: fast, sandbox: { mode: "none" } });
    harnesses.push(h);
    return h;
  };

  it("begin answers proceed only once committed; again uncertain; end records; then done with the same result, for any cell of the run", async () => {
    const storage = createMemoryStorage();
    const h = await open(storage, "ledger", 2);
    const s = await h.start({ goal: "declare effects", cwd: t.dir });
    const c1 = await cellOf(join(t.dir, "ledger"), s, 1);

    const first = await c1.begin("open-pr");
    assert.equal(first.ok, true, JSON.stringify(first));
    assert.equal(first.answer, "proceed");
    assert.equal(first.attempt, 1);
    // Answered after the commit: the log holds the begin by the time the cell hears proceed.
    const begun = begunEvents(await logOf(storage, "ledger"), s, "open-pr");
    assert.equal(begun.length, 1, "the begin is in the log when proceed is answered");
    assert.deepEqual(begun[0]!.body, { name: "open-pr", cell_id: 1, attempt: 1 });

    const again = await c1.begin("open-pr");
    assert.equal(again.answer, "uncertain", JSON.stringify(again));
    assert.deepEqual((again.known as { attempts: { cell: number; attempt: number; evidence: string }[] }).attempts.map((a) => [a.cell, a.attempt, a.evidence]), [[1, 1, `event:${begun[0]!.seq}`]]);
    assert.equal(begunEvents(await logOf(storage, "ledger"), s, "open-pr").length, 1, "an uncertain answer commits nothing");

    const ended = await c1.end("open-pr", { number: 42 });
    assert.deepEqual(ended, { ok: true, answer: "done", key: first.key, result: { number: 42 } });
    const done = await c1.begin("open-pr");
    assert.deepEqual(done, { ok: true, answer: "done", key: first.key, result: { number: 42 }, ended_by: 1 });
    assert.deepEqual(await c1.end("open-pr", { number: 42 }), { ok: true, answer: "done", key: first.key, result: { number: 42 }, already: true }, "ending again with the same result answers the same");
    const conflict = await c1.end("open-pr", { number: 43 });
    assert.equal(conflict.ok, false);
    assert.equal(conflict.code, "conflict");
    assert.match(String(conflict.error), /already ended by cell 1/);

    // The cell's view lists it while it runs; its outcome once it ends.
    assert.deepEqual(h.session(s)!.state.runtime.cells["1"]!.effects, [{ name: "open-pr", status: "done", result: { number: 42 } }]);
    const half = await c1.begin("half-done");
    assert.equal(half.answer, "proceed");
    assert.deepEqual(h.session(s)!.state.runtime.cells["1"]!.effects!.map((e) => [e.name, e.status]), [["open-pr", "done"], ["half-done", "begun"]]);
    c1.release();

    // The next cell of the same run (a new cell, as a model re-running the work would add) gets the
    // ledger's answers: done with the result, uncertain for the one begun and never ended.
    const c2 = await cellOf(join(t.dir, "ledger"), s, 2);
    const obs = h.session(s)!.observations.get("execution:1")!.payload as { effects: unknown };
    assert.deepEqual(obs.effects, [{ name: "open-pr", status: "done", result: { number: 42 } }, { name: "half-done", status: "uncertain" }]);
    assert.deepEqual(h.session(s)!.state.runtime.cells["1"]!.effects!.map((e) => [e.name, e.status]), [["open-pr", "done"], ["half-done", "uncertain"]]);
    assert.deepEqual(await c2.begin("open-pr"), { ok: true, answer: "done", key: first.key, result: { number: 42 }, ended_by: 1 });
    assert.equal((await c2.begin("half-done")).answer, "uncertain");
    // Checked outside: it did not happen. A retry is a new attempt, committed before proceed.
    const retry = await c2.begin("half-done", true);
    assert.equal(retry.answer, "proceed", JSON.stringify(retry));
    assert.equal(retry.attempt, 2);
    assert.deepEqual(begunEvents(await logOf(storage, "ledger"), s, "half-done").map((e) => [e.body.cell_id, e.body.attempt]), [[1, 1], [2, 2]]);
    assert.equal((await c2.end("half-done", "ok")).ok, true);
    // Ending it turns cell 1's listing done too (the model sees it was reconciled).
    assert.deepEqual(h.session(s)!.state.runtime.cells["1"]!.effects!.map((e) => [e.name, e.status]), [["open-pr", "done"], ["half-done", "done"]]);
    assert.equal((await c2.begin("half-done", true)).answer, "done", "a retry never proceeds past done");
    c2.release();
    await h.wait(s);
    assert.deepEqual(
      h.inspect(s).sessions[0]!.effects.map((e) => [e.name, e.status, e.attempts.map((a) => a.cell_id), e.ended?.cell_id]),
      [["open-pr", "done", [1], 1], ["half-done", "done", [1, 2], 2]],
    );
  });

  it("keys: one per name for the whole run, another in another run; a launch key per cell; another run's ledger is out of reach", async () => {
    const storage = createMemoryStorage();
    const h = await open(storage, "keys", 2);
    const a = await h.start({ goal: "run a", cwd: t.dir });
    const b = await h.start({ goal: "run b", cwd: t.dir });
    const a1 = await cellOf(join(t.dir, "keys"), a, 1);
    const b1 = await cellOf(join(t.dir, "keys"), b, 1);
    const ka = await a1.key("deploy");
    const kb = await b1.key("deploy");
    assert.match(String(ka.key), UUID8);
    assert.notEqual(ka.key, kb.key, "the same name in another run has another key");
    assert.notEqual((await a1.key("other")).key, ka.key);
    assert.match(a1.launchKey, UUID8);
    assert.notEqual(a1.launchKey, b1.launchKey);

    assert.equal((await a1.begin("deploy")).answer, "proceed");
    assert.equal((await a1.end("deploy", "v1")).ok, true);
    // Run b holds nothing for the name, whatever run a did.
    const bb = await b1.begin("deploy");
    assert.equal(bb.answer, "proceed", JSON.stringify(bb));
    assert.equal(bb.key, kb.key);
    const end = await b1.end("nothing-begun", 1);
    assert.equal(end.ok, false);
    assert.match(String(end.error), /never begun in this run/);

    a1.release();
    b1.release();
    const a2 = await cellOf(join(t.dir, "keys"), a, 2);
    assert.equal((await a2.key("deploy")).key, ka.key, "the same key in every cell of the run");
    assert.notEqual(a2.launchKey, a1.launchKey, "each launch has its own key");
    assert.deepEqual(await a2.begin("deploy"), { ok: true, answer: "done", key: ka.key, result: "v1", ended_by: 1 });
    // A revoked token (cell 1 finished) opens nothing, and names nothing it could act for.
    const stale = await a1.begin("late");
    assert.equal(stale.ok, false);
    assert.match(String(stale.error), /no valid cell token/);
    a2.release();
    const b2 = await cellOf(join(t.dir, "keys"), b, 2);
    b2.release();
    await Promise.all([h.wait(a), h.wait(b)]);
    const log = await logOf(storage, "keys");
    assert.equal(log.filter((e) => e.kind === "effect_begun" && e.body.name === "late").length, 0);
  });

  it("refuses what it cannot take, committing nothing: no token, a foreign run named, bad names, bad results, unknown requests", async () => {
    const storage = createMemoryStorage();
    const h = await open(storage, "refusals", 1);
    const s = await h.start({ goal: "bad input", cwd: t.dir });
    const other = await h.start({ goal: "another run", cwd: t.dir });
    const c = await cellOf(join(t.dir, "refusals"), s, 1);
    const o = await cellOf(join(t.dir, "refusals"), other, 1);
    const refused = async (req: Record<string, unknown>, pattern: RegExp): Promise<void> => {
      const r = await ask(c.socket, req);
      assert.equal(r.ok, false, `${JSON.stringify(req)} -> ${JSON.stringify(r)}`);
      assert.match(String(r.error), pattern);
    };
    await refused({ op: "effect_begin", name: "x" }, /no valid cell token/);
    await refused({ token: "0".repeat(32), op: "effect_begin", name: "x" }, /no valid cell token/);
    // Who asks comes from the token: a request that names another run or cell is refused whole.
    await refused({ token: c.token, op: "effect_begin", name: "x", session: other }, /bad effect_begin request/);
    await refused({ token: c.token, op: "effect_begin", name: "x", cell: 1 }, /bad effect_begin request/);
    for (const name of ["", "has space", "a:b", "x".repeat(201), 7]) await refused({ token: c.token, op: "effect_begin", name }, /bad effect_begin request: name/);
    await refused({ token: c.token, op: "effect_begin", name: "x", retry: "yes" }, /retry/);
    await refused({ token: c.token, op: "effect_nope", name: "x" }, /unknown request/);
    assert.equal((await c.begin("big")).answer, "proceed");
    await refused({ token: c.token, op: "effect_end", name: "big", result: "x".repeat(5000) }, /at most 4096/);
    await refused({ token: c.token, op: "effect_key", name: "a b" }, /bad effect_key request/);
    // The other run's cell, asking about a name this run holds, gets its own run's answer.
    assert.equal((await o.begin("big")).answer, "proceed");
    const log = await logOf(storage, "refusals");
    assert.deepEqual(
      log.filter((e) => e.kind === "effect_begun" || e.kind === "effect_ended").map((e) => [e.session, e.kind, (e.body as { name: string }).name]),
      [[s, "effect_begun", "big"], [other, "effect_begun", "big"]],
    );
    c.release();
    o.release();
    await Promise.all([h.wait(s), h.wait(other)]);
  });

  it("answers one name one request at a time: of ten begins at once, one proceeds and nine are told uncertain", async () => {
    const storage = createMemoryStorage();
    const h = await open(storage, "race", 1);
    const s = await h.start({ goal: "race", cwd: t.dir });
    const c = await cellOf(join(t.dir, "race"), s, 1);
    const answers = await Promise.all(Array.from({ length: 10 }, () => c.begin("once")));
    assert.deepEqual(answers.map((a) => a.answer).sort(), ["proceed", ...Array(9).fill("uncertain")]);
    // Different names do not wait for each other and each proceeds once.
    const names = await Promise.all(Array.from({ length: 10 }, (_, i) => c.begin(`n${i}`)));
    assert.ok(names.every((a) => a.answer === "proceed"));
    assert.equal(begunEvents(await logOf(storage, "race"), s, "once").length, 1);
    c.release();
    await h.wait(s);
  });

  it("a fenced owner's begin is refused (code reset), never proceed, and nothing of it reaches the log", async () => {
    // The old owner is not told it was fenced (its watch is muted), as a paused or partitioned
    // process would not be: only its commit can find out.
    const base = createMemoryStorage();
    const muted = passThroughStorage(base, (db) => passThrough(db, { watch: (listener) => db.watch((signal) => (signal.type === "fenced" ? undefined : listener(signal))) }));
    const old = await open(muted, "fence", 1);
    const s = await old.start({ goal: "fenced", cwd: t.dir });
    const c = await cellOf(join(t.dir, "fence"), s, 1);
    assert.equal((await c.begin("done-before")).answer, "proceed");
    assert.equal((await c.end("done-before", { id: 1 })).ok, true);

    const usurper = await base.open("fence");
    try {
      const r = await c.begin("after-fence");
      assert.equal(r.ok, false, `a fenced owner answered ${JSON.stringify(r)}`);
      assert.equal(r.code, "reset");
      assert.notEqual(r.answer, "proceed");
      // Now it knows: it stopped, and refuses (or no longer listens) for anything that needs a commit.
      await until("the old owner to stop", () => old.status === "fenced", 30_000, 20);
      const log = await usurper.read(0);
      assert.equal(begunEvents(log, s, "after-fence").length, 0, "nothing of the fenced begin reached the log");
      assert.equal(begunEvents(log, s, "done-before").length, 1);
    } finally {
      await usurper.close();
    }
  });

  it("a fenced owner that has not found out still answers done for a name it folded as done (the end is final in every log)", async () => {
    const base = createMemoryStorage();
    const muted = passThroughStorage(base, (db) => passThrough(db, { watch: (listener) => db.watch((signal) => (signal.type === "fenced" ? undefined : listener(signal))) }));
    const old = await open(muted, "fence-done", 1);
    const s = await old.start({ goal: "fenced, done", cwd: t.dir });
    const c = await cellOf(join(t.dir, "fence-done"), s, 1);
    assert.equal((await c.begin("sent")).answer, "proceed");
    assert.equal((await c.end("sent", "msg-7")).ok, true);
    const usurper = await base.open("fence-done");
    try {
      assert.deepEqual(await c.begin("sent"), { ok: true, answer: "done", key: (await c.key("sent")).key, result: "msg-7", ended_by: 1 });
      assert.equal((await c.begin("sent", true)).answer, "done");
    } finally {
      await usurper.close();
      c.release();
    }
  });

  it("the CLI: proceed exits 0, done 10, uncertain 11, a refusal 2; outside a cell it says where it runs", async () => {
    const storage = createMemoryStorage();
    const h = await open(storage, "cli", 1);
    const s = await h.start({ goal: "cli", cwd: t.dir });
    const c = await cellOf(join(t.dir, "cli"), s, 1);
    const cli = async (args: string[], inCell = true): Promise<{ code: number; out: string; err: string }> => {
      const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", ...(inCell ? { CAIRN_TIMER_SOCKET: c.socket, CAIRN_CELL_TOKEN: c.token } : {}) };
      try {
        const r = await run(process.execPath, ["--import", "tsx", "src/cli/entry.ts", "effect", ...args], { env, timeout: 120_000 });
        return { code: 0, out: r.stdout.trim(), err: r.stderr.trim() };
      } catch (err) {
        const e = err as { code: number; stdout: string; stderr: string };
        return { code: e.code, out: e.stdout.trim(), err: e.stderr.trim() };
      }
    };
    assert.deepEqual(await cli(["begin", "mail"]), { code: 0, out: "proceed", err: "" });
    const unc = await cli(["begin", "mail"]);
    assert.equal(unc.code, 11);
    assert.match(unc.out, /^uncertain \{"attempts":\[\{"attempt":1,"cell":1,/);
    assert.deepEqual(await cli(["end", "mail", "--result", '{"id":"m-1"}']), { code: 0, out: 'done {"id":"m-1"}', err: "" });
    assert.deepEqual(await cli(["begin", "mail"]), { code: 10, out: 'done {"id":"m-1"}', err: "" });
    const key = await cli(["key", "mail"]);
    assert.equal(key.code, 0);
    assert.equal(key.out, (await c.key("mail")).key);
    const bad = await cli(["end", "never", "--result", "1"]);
    assert.equal(bad.code, 2);
    assert.match(bad.err, /never begun/);
    const notJson = await cli(["end", "mail", "--result", "not json"]);
    assert.equal(notJson.code, 2);
    assert.match(notJson.err, /--result must be JSON/);
    const outside = await cli(["begin", "mail"], false);
    assert.equal(outside.code, 2);
    assert.match(outside.err, /runs inside a cell/);
    c.release();
    await h.wait(s);
  });

  it("the Python module: with effect(...) begins, ends on leaving the block, stays uncertain after an exception; done on the next run of the script", async () => {
    const storage = createMemoryStorage();
    const h = await open(storage, "python", 1);
    const s = await h.start({ goal: "python", cwd: t.dir });
    const c = await cellOf(join(t.dir, "python"), s, 1);
    assert.ok(existsSync(join(c.pythonPath, "cairn_effects.py")), `the module is on the cell's PYTHONPATH (${c.pythonPath})`);
    const script = `
import json, sys
from cairn_effects import effect, effect_key, EffectRefused
out = []
with effect("pr") as e:
    out.append(["pr", e.status, e.key == effect_key("pr")])
    if e.status == "proceed":
        e.result = {"number": 7}
with effect("pr") as e:
    out.append(["pr again", e.status, e.result])
try:
    with effect("crash") as e:
        out.append(["crash", e.status])
        raise ValueError("the API call failed halfway")
except ValueError:
    pass
with effect("crash") as e:
    out.append(["crash again", e.status, [a["cell"] for a in e.known["attempts"]]])
    e.retry()
    out.append(["crash retried", e.status, e.attempt])
    e.done("sent")
try:
    effect("bad name").begin()
except EffectRefused as err:
    out.append(["refused", err.code])
print(json.dumps(out))
`;
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", PYTHONPATH: c.pythonPath, CAIRN_TIMER_SOCKET: c.socket, CAIRN_CELL_TOKEN: c.token };
    const r = await run("python3", ["-c", script], { env, timeout: 60_000 });
    assert.deepEqual(JSON.parse(r.stdout), [
      ["pr", "proceed", true],
      ["pr again", "done", { number: 7 }],
      ["crash", "proceed"],
      ["crash again", "uncertain", [1]],
      ["crash retried", "proceed", 2],
      ["refused", "usage"],
    ]);
    const p = h.session(s)!;
    assert.deepEqual(p.effects.get("pr")!.ended!.result, { number: 7 });
    assert.deepEqual(p.effects.get("crash")!.ended!.result, "sent");
    assert.equal(p.effects.get("crash")!.attempts.length, 2);
    c.release();
    await h.wait(s);
  });
});
