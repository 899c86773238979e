/**
 * A scripted run with a failure, an UnknownExecution and a failover, through the real `cairn`
 * command on sqlite (two real processes take turns owning the database):
 *
 *   round 1: cell 1 `exit 3` (error)
 *   round 2: cell 2 sleeps; while it runs, process B (`cairn resume`) takes the database over:
 *            A is fenced and exits 3, B records cell 2 as UnknownExecution (never re-run)
 *   round 3: a resolution note for cell 2, and cell 4, which waits for a gate file the test opens
 *   round 4: a success conclusion
 *
 * `runScenario` stops at the gate (B running cell 4) and returns `open()` to let it finish.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ENTRY, ROOT } from "../cli/support.js";
import { until } from "../support/wait.js";

export interface Spawned {
  readonly child: ChildProcess;
  out(): string;
  err(): string;
  readonly exit: Promise<{ code: number | null; signal: string | null }>;
}

/** Starts `cairn ARGS` from source; every child is recorded in `children` for cleanup. */
export function spawnCairn(args: string[], children: ChildProcess[], env: NodeJS.ProcessEnv = {}): Spawned {
  const child = spawn(process.execPath, ["--import", "tsx", ENTRY, ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exit = new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on("close", (code, signal) => resolve({ code, signal })));
  return { child, out: () => out, err: () => err, exit };
}

/** Polling with a hang guard, shared by every test (test/support/wait.ts). */
export { until };

/** Kills what is still running (SIGKILL): for t.after / after hooks. */
export function killAll(children: readonly ChildProcess[]): void {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
}

const op = (revision: number) => ({ op: "test", path: "/revision", value: revision });
const add = (value: Record<string, unknown>) => ({ op: "add", path: "/cells/-", value });

export interface Scenario {
  readonly db: string;
  readonly dataDir: string;
  /** Storage flags for every `cairn` call on this database. */
  readonly flags: string[];
  readonly a: Spawned;
  readonly b: Spawned;
  /** Lets cell 4 finish; B then concludes. */
  open(): void;
}

/**
 * Runs the scenario in `dir` up to the gate: A failed cell 1, was taken over by B while running
 * cell 2, and B is running cell 4. Resolves once cell 4 has started.
 */
export async function runScenario(dir: string, children: ChildProcess[], db = "timeline"): Promise<Scenario> {
  const dataDir = join(dir, ".cairn");
  const started2 = join(dir, "cell2.started");
  const started4 = join(dir, "cell4.started");
  const gate = join(dir, "cell4.go");
  const script = join(dir, "script.json");
  writeFileSync(
    script,
    JSON.stringify({
      rounds: [
        { patch: [op(0), add({ id: 1, previous_id: null, kind: "cmd", argv: ["sh", "-c", "echo 'checking the build'; echo 'build broken' >&2; exit 3"] })] },
        { patch: [op(1), add({ id: 2, previous_id: null, kind: "cmd", argv: ["sh", "-c", `echo 'long job'; touch ${started2}; sleep 120`] })] },
        {
          patch: [
            op(2),
            add({ id: 3, previous_id: null, kind: "note", role: "resolution", target_cell_id: 2, evidence_refs: ["cell:2"], text: "cell 2 was interrupted by the failover; its work is idempotent" }),
            add({ id: 4, previous_id: null, kind: "cmd", argv: ["sh", "-c", `echo 'retrying the long job'; touch ${started4}; while [ ! -e ${gate} ]; do sleep 0.05; done; echo 'long job done'`] }),
          ],
        },
        { patch: [op(3), add({ id: 5, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "the long job is done" })] },
      ],
    }),
  );
  const flags = ["--db", db, "--data-dir", dataDir];
  const a = spawnCairn(["run", "Rebuild after a broken build", ...flags, "--cwd", dir, "--model", `scripted:${script}`, "--json"], children);
  await until("A to start cell 2", () => existsSync(started2));
  const b = spawnCairn(["resume", ...flags, "--model", `scripted:${script}`, "--json"], children);
  const aExit = await a.exit;
  if (aExit.code !== 3) throw new Error(`A should exit 3 when fenced, got ${aExit.code}: ${a.err()}`);
  await until("B to start cell 4", () => existsSync(started4) || b.child.exitCode !== null);
  if (b.child.exitCode !== null) throw new Error(`B ended early (${b.child.exitCode}): ${b.err()}`);
  return { db, dataDir, flags, a, b, open: () => writeFileSync(gate, "") };
}
