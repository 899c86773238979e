/**
 * The suite of chaos/effect-kill-sqlite.test.ts and chaos/effect-kill-replicated.test.ts (one file
 * per adapter, so that each stays within the runner's time per file).
 *
 * Effects under kills: a real `cairn run` whose cell begins, performs (appends its line to
 * effects.txt in its workspace) and ends three effects a, b and c through `cairn effect`, SIGKILLed at
 * every boundary of every effect, then `cairn resume` (a new process) and the model running the cell
 * again, as a new cell. The cell re-run uses the ledger's answers: done is skipped, uncertain is
 * reconciled with the file (the outside system: a line that is there is ended as found, one that is
 * not is retried). Whatever the boundary, every effect must be performed once (the file shows each
 * line once), the ledger must end with all three done, and the UnknownExecution of the killed cell
 * must list exactly the effects it left begun and not ended.
 *
 * Boundaries, per effect:
 *   before-begin      the cell is about to begin it                      (the cell waits; SIGKILL from outside)
 *   begun-committed   its begin is committed, the cell not yet answered  (CAIRN_CHAOS_KILL_AT effect:begun-committed@N)
 *   after-begin       the cell was answered proceed, has not acted        (the cell waits)
 *   after-effect      the line is written, the end not asked for          (the cell waits)
 *   ended-committed   its end is committed, the cell not yet answered     (CAIRN_CHAOS_KILL_AT effect:ended-committed@N)
 *   after-end         the cell was answered done                          (the cell waits)
 *
 * On sqlite and on replicated (a real three-member etcd cluster). Each case first proves the kill
 * happened where it should (SIGKILL, and the ledger in the log stands exactly at that boundary), so
 * the suite cannot pass by doing nothing.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { LogEvent } from "../../src/state/events.js";
import type { State } from "../../src/state/schema.js";
import { KEEPER_BUNDLE } from "../../src/exec/keeper.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { devCluster } from "../../test/replicated/helpers.js";
import { cleanupProcesses, type CliResult, describe as said, REPO, runCairn, startCairn } from "./cli.js";
import { endedByConclusion, oneFinish, oneStart } from "./checks.js";
import { startFakeOpenAI, type FakeOpenAI } from "./fake-openai.js";
import { brief, ofKind, readAll, readLog } from "./log.js";
import { alive, processesRunning, stat, track, until } from "./procs.js";

const EFFECTS = ["a", "b", "c"] as const;
type Boundary = "before-begin" | "begun-committed" | "after-begin" | "after-effect" | "ended-committed" | "after-end";
const BOUNDARIES: readonly Boundary[] = ["before-begin", "begun-committed", "after-begin", "after-effect", "ended-committed", "after-end"];
const HARNESS_POINTS: Partial<Record<Boundary, string>> = { "begun-committed": "effect:begun-committed", "ended-committed": "effect:ended-committed" };

/** The cell's waits, by a sleep of its own length so this host's pid of it can be found. */
const SLEEP = ["sleep", `900.${process.pid}`];

/** The cell: for each effect, begin; on proceed append its line and end; on done skip; on uncertain reconcile with the file. */
const CELL = `pause() {
  if [ "$(cat kill-at 2>/dev/null)" = "$1" ]; then rm -f kill-at; : > "reached-$1"; ${SLEEP.join(" ")}; fi
}
for n in ${EFFECTS.join(" ")}; do
  pause before-begin-$n
  ans=$(cairn effect begin $n); rc=$?
  echo "begin $n: $rc $ans"
  if [ $rc -eq 0 ]; then
    pause after-begin-$n
    echo $n >> effects.txt
    pause after-effect-$n
    cairn effect end $n --result "\\"line-$n\\"" || exit 1
    pause after-end-$n
  elif [ $rc -eq 10 ]; then
    :
  elif [ $rc -eq 11 ]; then
    if grep -qx $n effects.txt 2>/dev/null; then
      cairn effect end $n --result "\\"found-$n\\"" || exit 1
    else
      cairn effect begin $n --retry || exit 1
      echo $n >> effects.txt
      cairn effect end $n --result "\\"line-$n\\"" || exit 1
    fi
  else
    exit 1
  fi
done`;
const ARGV = ["sh", "-c", CELL];

/**
 * The model, a pure function of the State: run the cell; when its execution is an UnknownExecution,
 * resolve it citing the harness's evidence and run the cell again as a new cell; conclude success
 * once a run of it succeeded (failure if one failed).
 */
function decide(state: State): unknown[] {
  const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }];
  let next = state.runtime.next_cell_id;
  const add = (cell: Record<string, unknown>) => ops.push({ op: "add", path: "/cells/-", value: { id: next++, previous_id: null, ...cell } });
  const cmds = state.cells.filter((c) => c.kind === "cmd").map((c) => c.id);
  const last = cmds.at(-1);
  const rc = last === undefined ? undefined : state.runtime.cells[String(last)];
  if (last === undefined) add({ kind: "cmd", argv: ARGV });
  else if (rc?.result === "UnknownExecution" && rc.resolved_by === undefined && rc.unknown !== undefined) {
    add({ kind: "note", role: "resolution", target_cell_id: last, evidence_refs: rc.unknown.evidence_refs, text: `cell ${last}: its uncertain effects are reconciled by running it again` });
    add({ kind: "cmd", argv: ARGV });
  } else if (rc?.result === "success") add({ kind: "note", role: "conclusion", result: "success", text: "every effect is done once" });
  else if (rc?.phase === "finished") add({ kind: "note", role: "conclusion", result: "failure", text: `cell ${last} ended ${rc.result}` });
  else add({ kind: "note", text: "waiting for the cell" });
  return ops;
}

/**
 * Bundles src/cli/entry.ts (the cells' `cairn` is the same bundle), and the cell keeper's program
 * beside it where the bundle looks for it: a process starts in a fraction of the time tsx takes.
 */
async function bundleCli(): Promise<string> {
  const esbuild = await import("esbuild");
  // Three levels below the repository, where the bundle finds build/cairn-launcher.
  const dir = join(REPO, "node_modules", ".cache", `cairn-effect-kill-${process.pid}`);
  const common = { bundle: true, platform: "node", format: "esm", target: "node20", packages: "external", logLevel: "error" } as const;
  const out = join(dir, "cairn.mjs");
  await esbuild.build({ ...common, entryPoints: [join(REPO, "src/cli/entry.ts")], outfile: out });
  await esbuild.build({ ...common, entryPoints: [join(REPO, "src/exec/keeper-main.ts")], outfile: join(dir, KEEPER_BUNDLE) });
  return out;
}

interface Ledger {
  readonly begun: number;
  readonly ended: LogEvent<"effect_ended"> | undefined;
}

function ledgerOf(log: readonly LogEvent[], name: string): Ledger {
  return { begun: ofKind(log, "effect_begun").filter((e) => e.body.name === name).length, ended: ofKind(log, "effect_ended").find((e) => e.body.name === name) };
}

function lines(file: string): string[] {
  return existsSync(file) ? readFileSync(file, "utf8").split("\n").filter((l) => l !== "") : [];
}

/**
 * The owner's liveness lease of every process here, in seconds: long enough that a loaded machine's
 * late renewal does not end a life before its kill (the harness would rightly stop: exit 4), short
 * enough that resuming after a kill waits little for the killed owner's lease.
 */
const LIVENESS = "6";

/**
 * `cairn resume` until it ends the run: a resume that lost its lease on a loaded machine (exit 4,
 * having stopped its cells) is started again, as a scheduler's restart policy would.
 */
async function resumeToEnd(args: readonly string[], cli: string): Promise<CliResult> {
  let r = await runCairn(["resume", ...args], {}, 180_000, cli);
  for (let again = 0; again < 2 && r.code === 4; again++) r = await runCairn(["resume", ...args], {}, 180_000, cli);
  return r;
}

/** The suite on `adapter` (sqlite, or replicated on a dev etcd cluster of its own). */
export function effectKillSuite(adapter: "sqlite" | "replicated"): void {
  const root = mkdtempSync(join(tmpdir(), `cairn-chaos-effects-${adapter}-`));
  describe(`effects under kills at every boundary (${adapter})`, { timeout: 1_800_000 }, () => {
    let server: FakeOpenAI;
    let cli: string;
    let storageFlags: (data: string) => string[] = () => [];
    let readReplicated: ((db: string) => Promise<LogEvent[]>) | null = null;
    let stopCluster: (() => Promise<void>) | null = null;
    before(async () => {
      cli = await bundleCli();
      server = await startFakeOpenAI((r) => decide(r.state as State));
      if (adapter === "replicated") {
        const etcd = await devCluster();
        stopCluster = etcd.stop;
        const endpoints = etcd.cluster.endpoints;
        storageFlags = () => ["--storage", "replicated", "--etcd", endpoints.join(",")];
        readReplicated = async (db) => {
          const dir = mkdtempSync(join(root, "reader-"));
          return readAll(createReplicatedStorage({ endpoints, dataDir: dir }), db);
        };
      }
    });
    after(async () => {
      cleanupProcesses();
      await server?.close();
      await stopCluster?.();
      rmSync(join(REPO, "node_modules", ".cache", `cairn-effect-kill-${process.pid}`), { recursive: true, force: true });
      rmSync(root, { recursive: true, force: true });
    });

    for (const [k, effect] of EFFECTS.entries()) {
      for (const boundary of BOUNDARIES) {
        test(`${boundary} of effect ${effect}: every effect performed once, the ledger done, the UnknownExecution lists what was left open`, async () => {
          const db = `fx-${adapter === "sqlite" ? "s" : "r"}-${boundary}-${effect}`;
          const dir = join(root, db);
          const data = join(dir, "data");
          const work = join(dir, "work");
          mkdirSync(work, { recursive: true });
          const file = join(work, "effects.txt");
          const common = ["--db", db, "--data-dir", data, ...storageFlags(data), "--liveness", LIVENESS, "--model", "openai/fake", "--base-url", server.baseUrl];
          const readDb = () => (readReplicated !== null ? readReplicated(db) : readLog(data, db));
          const point = HARNESS_POINTS[boundary];

          // ---- the first life, killed at the boundary
          let killed;
          if (point !== undefined) {
            killed = await runCairn(["run", "make three effects once each", ...common, "--cwd", work], { CAIRN_CHAOS_KILL_AT: `${point}@${k + 1}` }, 120_000, cli);
          } else {
            writeFileSync(join(work, "kill-at"), `${boundary}-${effect}`);
            const proc = startCairn(["run", "make three effects once each", ...common, "--cwd", work], {}, 120_000, cli);
            await until(`the cell to reach ${boundary}-${effect}`, () => existsSync(join(work, `reached-${boundary}-${effect}`)) || proc.child.exitCode !== null, 120_000, 50);
            for (const pid of processesRunning(SLEEP)) track(pid);
            proc.child.kill("SIGKILL");
            killed = await proc.result;
          }
          assert.equal(killed.signal, "SIGKILL", said(killed));
          let log = await readDb();
          const at = `killed at ${boundary} of ${effect}; the log:\n${brief(log)}`;
          const start = oneStart(log, 1);
          assert.equal(ofKind(log, "execution_finished").length, 0, `killed before any result; ${at}`);
          // The ledger and the file stand exactly at the boundary.
          for (const [i, name] of EFFECTS.entries()) {
            const l = ledgerOf(log, name);
            const inFile = lines(file).includes(name);
            if (i < k) {
              assert.ok(l.begun === 1 && l.ended !== undefined && inFile, `${name} is done before the kill; ${at}`);
            } else if (i > k) {
              assert.ok(l.begun === 0 && l.ended === undefined && !inFile, `${name} is untouched before the kill; ${at}`);
            } else {
              const begun = boundary !== "before-begin";
              const ended = boundary === "ended-committed" || boundary === "after-end";
              const written = boundary === "after-effect" || ended;
              assert.equal(l.begun, begun ? 1 : 0, `${name} begun: ${at}`);
              assert.equal(l.ended !== undefined, ended, `${name} ended: ${at}`);
              assert.equal(inFile, written, `${name} written: ${at}`);
            }
          }
          if (point !== undefined) {
            const lastEffect = log.filter((e) => e.kind === "effect_begun" || e.kind === "effect_ended").at(-1)!;
            assert.equal(lastEffect.kind, boundary === "begun-committed" ? "effect_begun" : "effect_ended", at);
            assert.equal((lastEffect.body as { name: string }).name, effect, at);
          }
          const survivors = processesRunning(SLEEP).filter((pid) => stat(pid) !== null);

          // ---- resume: recovery, then the model runs the cell again
          const resumed = await resumeToEnd(common, cli);
          assert.equal(resumed.code, 0, `${said(resumed)}\n${at}`);
          log = await readDb();
          const done = `after resume (${boundary} of ${effect}); the log:\n${brief(log)}`;
          endedByConclusion(log, "success");
          assert.deepEqual(lines(file), [...EFFECTS], `every effect performed exactly once; ${done}`);
          for (const [i, name] of EFFECTS.entries()) {
            const l = ledgerOf(log, name);
            assert.ok(l.ended !== undefined, `${name} ends done; ${done}`);
            // A begin that reached the log but not the file is retried once (a new attempt); anything else begins once.
            const retried = i === k && (boundary === "begun-committed" || boundary === "after-begin");
            assert.equal(l.begun, retried ? 2 : 1, `${name} begun ${l.begun} times; ${done}`);
            if (i === k && boundary === "after-effect") assert.equal(l.ended!.body.result, `found-${name}`, `the line was found and ended as such; ${done}`);
          }
          // The killed cell: UnknownExecution, listing exactly the effects it left begun and not ended.
          assert.equal(startsOnce(log), true, `no cell launched twice; ${done}`);
          const fin = oneFinish(log, 1);
          assert.equal(fin.body.result, "UnknownExecution", done);
          assert.deepEqual(fin.body.unknown?.evidence_refs, [`event:${start.seq}`]);
          const open = boundary === "begun-committed" || boundary === "after-begin" || boundary === "after-effect" ? [effect] : [];
          const closed = [...EFFECTS.slice(0, k), ...(boundary === "ended-committed" || boundary === "after-end" ? [effect] : [])];
          if (k === 0 && boundary === "before-begin") assert.equal(fin.body.unknown?.uncertain_effects, undefined, "a cell that began nothing says nothing about effects");
          else {
            assert.deepEqual(fin.body.unknown?.uncertain_effects, open, `uncertain effects; ${done}`);
            assert.deepEqual(fin.body.unknown?.done_effects, closed, `done effects; ${done}`);
          }
          // The re-run cell succeeded, and its output shows what the ledger answered.
          const rerun = oneFinish(log, 3);
          assert.equal(rerun.body.result, "success", `${rerun.body.detail}; ${done}`);
          const out = ofKind(log, "execution_output").filter((e) => e.body.cell_id === 3).map((e) => e.body.data).join("");
          for (const name of EFFECTS.slice(0, k)) assert.match(out, new RegExp(`begin ${name}: 10 done "line-${name}"`), out);
          // The surviving cell of the killed worker was stopped by recovery, not left to act.
          for (const pid of survivors) assert.ok(!alive(pid), `the killed worker's waiting cell (pid ${pid}) was stopped`);
        });
      }
    }
  });
}

/** No cell has two `execution_started` events. */
function startsOnce(log: readonly LogEvent[]): boolean {
  const cells = ofKind(log, "execution_started").map((e) => `${e.session}/${e.body.cell_id}`);
  return cells.length === new Set(cells).size;
}
