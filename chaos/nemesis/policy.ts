/**
 * The nemesis workload's model: a stateless policy of the State it is shown (as the Model contract
 * requires, so a restarted worker continues where the log is). The goal names the plan:
 * `chaos REQ cells=N long=L timer=0|1`: N effects, e1..eN, made one after another, each by a cell
 * that declares it in the run's effect ledger (`cairn effect begin/end`). A cell records what begin
 * answered on a `ledger <session> <cell> <owner epoch> <ms> <effect> <answer>` line of the
 * database's effect file, and on proceed appends the effect's line `<session> <cell> <owner epoch>
 * <ms> <effect>` (the epoch from CHAOS_EPOCH, which the worker sets after it opened) before ending
 * it; on done it does nothing; on uncertain it looks for the effect's line in the file (the outside
 * system) and ends the effect as found, or retries it when the line is not there. The cell of e1
 * registers a timer first when the plan asks for one; the next L effects' cells run for a while
 * before they begin (long-running), and while they run they append a `tick <session> <cell> <owner
 * epoch> <ms>` line every 200 ms, so that a cell still running after a newer owner launched shows in
 * the effect file even when it is killed before its last line. Every UnknownExecution is resolved
 * citing the evidence the harness recorded, and its effect is made again by a new cell (at most
 * MAX_TRIES cells per effect), as a model reconciling it would; then the run concludes success (in a
 * later round when observations that arrived meanwhile block it).
 */
import { ModelError, type Model, type ModelReply, type ModelRequest } from "../../src/model/contract.js";
import type { State } from "../../src/state/schema.js";

/** The plan a goal encodes. */
export interface Plan {
  readonly req: string;
  readonly cells: number;
  readonly long: number;
  readonly timer: boolean;
}

export function planGoal(p: Plan): string {
  return `chaos ${p.req} cells=${p.cells} long=${p.long} timer=${p.timer ? 1 : 0}`;
}

export function parseGoal(goal: string): Plan | null {
  const m = /^chaos (\S+) cells=(\d+) long=(\d+) timer=([01])$/.exec(goal);
  if (m === null) return null;
  return { req: m[1]!, cells: Number(m[2]), long: Number(m[3]), timer: m[4] === "1" };
}

/** Cells made for one effect at most (the first and those re-running it after an UnknownExecution or an error). */
export const MAX_TRIES = 3;

/**
 * What the cell of effect `effect` (e1, e2, ...) runs: a shell script that asks the ledger, records
 * the answer, and makes the effect (appends its line) only on proceed (after a timer or a sleep,
 * maybe). `cli` is the command line of `cairn` (the nemesis's bundle), or null for the one on the
 * cell's PATH.
 */
export function cellArgv(effectFile: string, cli: string | null, kind: "plain" | "long" | "timer", longMs: number, effect: string): string[] {
  const cairn = cli ?? "cairn";
  const stamp = "$CAIRN_SESSION $CAIRN_CELL $CHAOS_EPOCH $(date +%s%3N)";
  const line = `echo "${stamp} ${effect}" >> '${effectFile}'`;
  const tick = `echo "tick ${stamp}" >> '${effectFile}'`;
  const ticking = `end=$(($(date +%s%3N) + ${Math.round(longMs)})); while [ "$(date +%s%3N)" -lt "$end" ]; do ${tick}; sleep 0.2; done; `;
  const before = kind === "long" ? ticking : kind === "timer" ? `${cairn} timer --id t$CAIRN_CELL --in 1s --note chaos && ` : "";
  const led = `led() { echo "ledger ${stamp} ${effect} $1" >> '${effectFile}'; }`;
  const make = `${line}; ${cairn} effect end ${effect} --result '"ok"' || exit 1`;
  const retry = `${cairn} effect begin ${effect} --retry >/dev/null; rc=$?; if [ $rc -eq 0 ]; then led proceed; ${make}; elif [ $rc -eq 10 ]; then led done; else led refused-$rc; exit 1; fi`;
  const reconcile = `led uncertain; if grep -q "^$CAIRN_SESSION [0-9]* [0-9]* [0-9]* ${effect}$" '${effectFile}'; then ${cairn} effect end ${effect} --result '"found"' || exit 1; led found; else ${retry}; fi`;
  const script = [
    `echo cell $CAIRN_CELL ${effect}`,
    led,
    `${before}${cairn} effect begin ${effect} >/dev/null; rc=$?`,
    `if [ $rc -eq 0 ]; then led proceed; ${make}; elif [ $rc -eq 10 ]; then led done; elif [ $rc -eq 11 ]; then ${reconcile}; else led refused-$rc; exit 1; fi`,
  ].join("\n");
  return ["sh", "-c", script];
}

/** The effect a cell of this policy makes (from its script), or null. */
export function effectOf(argv: readonly string[]): string | null {
  const m = /effect begin (e\d+) /.exec(argv.at(-1) ?? "");
  return m === null ? null : m[1]!;
}

/**
 * The patch for `state`. `concludeLater`: the previous attempt's conclusion was refused in this
 * round (observations arrived after it was prepared: they are delivered next round), so this one
 * adds a note instead and the run concludes in a later round, as the refusal says to. Sending the
 * same conclusion again would be refused every attempt and end the run in failure.
 */
export function decide(state: State, effectFile: string, timerCli: string | null, longMs: number, concludeLater = false): unknown[] {
  const plan = parseGoal(state.goal);
  if (plan === null) throw new ModelError("config", `the chaos policy cannot read the goal "${state.goal}"`, { retryable: false });
  const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }];
  let next = state.runtime.next_cell_id;
  const add = (cell: Record<string, unknown>) => ops.push({ op: "add", path: "/cells/-", value: { id: next++, previous_id: null, ...cell } });
  const runtime = Object.entries(state.runtime.cells);
  for (const [id, rc] of runtime) {
    if (rc.result === "UnknownExecution" && rc.resolved_by === undefined && rc.unknown !== undefined) {
      add({ kind: "note", role: "resolution", target_cell_id: Number(id), evidence_refs: rc.unknown.evidence_refs, text: `cell ${id}: accepted as uncertain` });
    }
  }
  // The cells kept in context (the policy never removes any), by the effect each makes.
  const cmds = state.cells.flatMap((c) => (c.kind === "cmd" ? [{ id: c.id, effect: effectOf(c.argv) }] : []));
  const last = cmds.at(-1);
  const lastRc = last === undefined ? undefined : state.runtime.cells[String(last.id)];
  const k = last?.effect === null || last === undefined ? 0 : Number(last.effect.slice(1));
  // The next effect: the first, or the one after the last cell's when that cell succeeded (or its
  // effect was tried MAX_TRIES times); else the same one again, by a new cell.
  const tries = cmds.filter((c) => c.effect === last?.effect).length;
  const todo = last === undefined ? 1 : lastRc?.result === "success" || tries >= MAX_TRIES ? k + 1 : k;
  const cellFor = (n: number) => {
    const kind = plan.timer && n === 1 ? "timer" : n - 1 - (plan.timer ? 1 : 0) < plan.long ? "long" : "plain";
    add({ kind: "cmd", argv: cellArgv(effectFile, timerCli, kind, longMs, `e${n}`) });
  };
  if (runtime.some(([, rc]) => rc.phase !== "finished")) add({ kind: "note", text: "waiting for the running cell" });
  else if (todo <= plan.cells) cellFor(todo);
  else if (concludeLater) add({ kind: "note", text: "every planned cell was handled; concluding once the observations that just arrived are read" });
  else add({ kind: "note", role: "conclusion", result: "success", text: "every planned cell was handled" });
  return ops;
}

/** The policy as a Model. */
export class PolicyModel implements Model {
  readonly name = "chaos-nemesis-policy";
  constructor(
    private readonly effectFile: string,
    private readonly timerCli: string | null,
    private readonly longMs: number,
  ) {}

  async step(req: ModelRequest): Promise<ModelReply> {
    return { patch: decide(req.state, this.effectFile, this.timerCli, this.longMs, req.rejection?.code === "conclusion_blocked"), usage: null };
  }
}
