/**
 * The kill chain: one run, many lives. A real `cairn run`, then `cairn resume` again and again, each
 * life SIGKILLed at a boundary drawn by a seeded generator (printed; replay with CAIRN_CHAOS_SEED),
 * then one last life without a kill. Each boundary is drawn among those the rest of the run must still
 * cross, so every drawn kill must happen. The model is an OpenAI-compatible fake that decides from the
 * State it is shown: run three cells one after another (each appends its own line to an effect file),
 * resolve every UnknownExecution with the evidence the harness recorded, then conclude success.
 *
 * Whatever the kills, the run must end in success and: no cell runs twice (its line appears at most
 * once, and exactly once when its result is success), every launch gets exactly one result, no cell
 * is launched twice, the provider is never called for an attempt the log did not record first nor for
 * the same attempt twice, and a committed response is never dropped for a new call.
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { LogEvent } from "../src/state/events.js";
import type { State } from "../src/state/schema.js";
import { cleanupProcesses, describe as said, runCairn } from "./support/cli.js";
import { endedByConclusion } from "./support/checks.js";
import { startFakeOpenAI, type FakeOpenAI } from "./support/fake-openai.js";
import { brief, finishesOf, ofKind, readLog, startsOf } from "./support/log.js";
import { rng } from "./nemesis/rng.js";

const DB = "chaos";
const CELLS = 3;
const MAX_KILLS = 5;
const root = mkdtempSync(join(tmpdir(), "cairn-chaos-chain-"));


/** The model's policy: a pure function of the State (see the module comment). */
function decide(state: State): unknown[] {
  const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }];
  let next = state.runtime.next_cell_id;
  const add = (cell: Record<string, unknown>) => ops.push({ op: "add", path: "/cells/-", value: { id: next++, previous_id: null, ...cell } });
  const runtime = Object.entries(state.runtime.cells);
  for (const [id, rc] of runtime) {
    if (rc.result === "UnknownExecution" && rc.resolved_by === undefined && rc.unknown !== undefined) {
      add({ kind: "note", role: "resolution", target_cell_id: Number(id), evidence_refs: rc.unknown.evidence_refs, text: `cell ${id}: accepted as uncertain` });
    }
  }
  const cmds = state.cells.filter((c) => c.kind === "cmd").length;
  if (runtime.some(([, rc]) => rc.phase !== "finished")) add({ kind: "note", text: "waiting for the running cell" });
  else if (cmds < CELLS) add({ kind: "cmd", argv: ["sh", "-c", `echo c${cmds + 1} >> effect.txt`] });
  else add({ kind: "note", role: "conclusion", result: "success", text: "all cells were handled" });
  return ops;
}

/** True when `patch` (as the model sent it) adds a conclusion note. */
function concludes(patch: unknown): boolean {
  return Array.isArray(patch) && patch.some((op) => (op as { value?: { role?: string } }).value?.role === "conclusion");
}

/**
 * The boundaries the rest of the run is certain to cross, from what the log holds so far, each with
 * how many times at least: a cell not launched yet crosses started-committed and exited once each; a
 * run whose conclusion was not answered yet has at least one more response and one more accepted patch;
 * a conclusion answered but not admitted has one more accepted patch; after that, nothing.
 */
function reachable(log: readonly LogEvent[]): [string, number][] {
  const accepted = new Set(ofKind(log, "patch_accepted").map((e) => e.body.turn));
  const answered = ofKind(log, "model_response").filter((e) => concludes(e.body.patch));
  if (answered.some((e) => accepted.has(e.body.turn))) return [];
  if (answered.length > 0) return [["patch:committed", 1]];
  const out: [string, number][] = [
    ["patch:committed", 1],
    ["model:response-committed", 1],
  ];
  const cellsLeft = CELLS - ofKind(log, "execution_started").length;
  if (cellsLeft > 0) out.push(["execution:started-committed", Math.min(2, cellsLeft)], ["execution:exited", Math.min(2, cellsLeft)]);
  return out;
}

describe("kill chain: one run SIGKILLed again and again at seeded boundaries", () => {
  let server: FakeOpenAI;
  before(async () => {
    server = await startFakeOpenAI((r) => decide(r.state as State));
  });
  after(async () => {
    cleanupProcesses();
    await server?.close();
    rmSync(root, { recursive: true, force: true });
  });

  test("every life is killed somewhere; the run still ends in success with nothing run twice", async (t) => {
    const seed = Number(process.env.CAIRN_CHAOS_SEED ?? Math.floor(Math.random() * 2 ** 31));
    t.diagnostic(`seed ${seed} (replay with CAIRN_CHAOS_SEED=${seed})`);
    console.log(`kill-chain seed ${seed} (replay with CAIRN_CHAOS_SEED=${seed})`);
    const random = rng(seed);
    const data = join(root, "data");
    const work = join(root, "work");
    mkdirSync(work, { recursive: true });
    const common = ["--db", DB, "--data-dir", data, "--model", "openai/fake", "--base-url", server.baseUrl];

    const lives: string[] = [];
    let kills = 0;
    for (let life = 0; life < MAX_KILLS; life++) {
      const candidates = reachable(life === 0 ? [] : await readLog(data, DB));
      if (candidates.length === 0) break;
      const [point, most] = candidates[Math.floor(random() * candidates.length)]!;
      const kill = `${point}@${1 + Math.floor(random() * most)}`;
      const args = life === 0 ? ["run", "append three lines, one per cell", ...common, "--cwd", work] : ["resume", ...common];
      const r = await runCairn(args, { CAIRN_CHAOS_KILL_AT: kill });
      if (r.signal === "SIGKILL") {
        kills++;
        lives.push(`${kill}: killed`);
      } else {
        // Every boundary chosen is one the rest of the run must cross: reaching the end without
        // crossing it means the harness skipped a commit it owes.
        assert.fail(`life ${life}: boundary ${kill} was never reached (seed ${seed}, lives ${lives.join("; ")}): ${said(r)}`);
      }
    }
    const last = await runCairn(["resume", ...common]);
    assert.equal(last.code, 0, `the last resume must end the run in success (seed ${seed}, lives ${lives.join("; ")}): ${said(last)}`);
    lives.push("no kill: ended the run");
    t.diagnostic(`lives: ${lives.join("; ")}`);
    assert.ok(kills >= 2, `at least two lives must really be killed (seed ${seed}): ${lives.join("; ")}`);

    const log = await readLog(data, DB);
    const ctx = `seed ${seed}, lives ${lives.join("; ")}\n${brief(log)}`;
    endedByConclusion(log, "success");
    const effect = existsSync(join(work, "effect.txt")) ? readFileSync(join(work, "effect.txt"), "utf8").split("\n").filter((l) => l !== "") : [];
    const queued = ofKind(log, "execution_queued").map((e) => e.body.cell_id);
    assert.equal(queued.length, CELLS, ctx);
    for (const [i, cell] of queued.entries()) {
      const line = `c${i + 1}`;
      const times = effect.filter((l) => l === line).length;
      assert.ok(startsOf(log, cell).length <= 1, `cell ${cell} launched twice; ${ctx}`);
      const fins = finishesOf(log, cell);
      assert.equal(fins.length, 1, `cell ${cell} must have exactly one result; ${ctx}`);
      const result = fins[0]!.body.result;
      if (startsOf(log, cell).length === 0) assert.equal(times, 0, `cell ${cell} never launched yet its line is there; ${ctx}`);
      if (result === "success") assert.equal(times, 1, `cell ${cell} succeeded: its line must be there once; ${ctx}`);
      else assert.ok(times <= 1, `cell ${cell} (${result}) ran twice; ${ctx}`);
    }
    assert.equal(effect.length, new Set(effect).size, `no line twice: ${effect.join(",")}; ${ctx}`);
    const attempts = new Set(ofKind(log, "model_attempt").map((e) => `${e.body.turn}#${e.body.attempt}`));
    const calls = server.seen.map((r) => `${r.turn}#${r.attempt}`);
    assert.equal(calls.length, new Set(calls).size, `an attempt was called twice: ${calls.join(", ")}; ${ctx}`);
    for (const c of calls) assert.ok(attempts.has(c), `the provider was called for ${c} with no model_attempt recorded first; ${ctx}`);
    // A committed response is admitted or rejected, never dropped for a new call: per round, one
    // response per rejection plus the accepted one.
    for (const turn of new Set(ofKind(log, "turn_prepared").map((e) => e.body.turn))) {
      const responses = ofKind(log, "model_response").filter((e) => e.body.turn === turn).length;
      const rejected = ofKind(log, "patch_rejected").filter((e) => e.body.turn === turn).length;
      const accepted = ofKind(log, "patch_accepted").filter((e) => e.body.turn === turn).length;
      assert.equal(accepted, 1, `round ${turn} must be accepted once; ${ctx}`);
      assert.equal(responses, rejected + accepted, `round ${turn}: a committed response was dropped and the provider asked again; ${ctx}`);
    }
  });
});
