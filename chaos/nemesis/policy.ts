/**
 * The nemesis workload's model: a stateless policy of the State it is shown (as the Model contract
 * requires, so a restarted worker continues where the log is). The goal names the plan:
 * `chaos REQ cells=N long=L timer=0|1`. Cells append one unique line to the database's effect file:
 * `<session> <cell> <owner epoch> <ms>` (the epoch from CHAOS_EPOCH, which the worker sets after it
 * opened). Cell 1 registers a timer first when the plan asks for one; the next L cells run for a
 * while before they write (long-running), and while they run they append a `tick <session> <cell>
 * <owner epoch> <ms>` line every 200 ms, so that a cell still running after a newer owner launched
 * shows in the effect file even when it is killed before its last line; the rest write at once. Every UnknownExecution is resolved citing the
 * evidence the harness recorded, then the run concludes success (in a later round when observations
 * that arrived meanwhile block it).
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

/** What a cell runs: a shell line appending its effect line (after a timer or a sleep, maybe). */
export function cellArgv(effectFile: string, timerCli: string | null, kind: "plain" | "long" | "timer", longMs: number): string[] {
  const line = `echo "$CAIRN_SESSION $CAIRN_CELL $CHAOS_EPOCH $(date +%s%3N)" >> '${effectFile}'`;
  const tick = `echo "tick $CAIRN_SESSION $CAIRN_CELL $CHAOS_EPOCH $(date +%s%3N)" >> '${effectFile}'`;
  const ticking = `end=$(($(date +%s%3N) + ${Math.round(longMs)})); while [ "$(date +%s%3N)" -lt "$end" ]; do ${tick}; sleep 0.2; done; `;
  const before = kind === "long" ? ticking : kind === "timer" && timerCli !== null ? `${timerCli} timer --id t$CAIRN_CELL --in 1s --note chaos && ` : "";
  return ["sh", "-c", `echo cell $CAIRN_CELL; ${before}${line}`];
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
  const cmds = state.cells.filter((c) => c.kind === "cmd").length;
  if (runtime.some(([, rc]) => rc.phase !== "finished")) add({ kind: "note", text: "waiting for the running cell" });
  else if (cmds < plan.cells) {
    const kind = plan.timer && cmds === 0 ? "timer" : cmds - (plan.timer ? 1 : 0) < plan.long ? "long" : "plain";
    add({ kind: "cmd", argv: cellArgv(effectFile, timerCli, kind, longMs) });
  } else if (concludeLater) add({ kind: "note", text: "every planned cell was handled; concluding once the observations that just arrived are read" });
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
