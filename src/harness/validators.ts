/**
 * Validators: commands the harness runs before it accepts a `success` conclusion. Each is an argv run
 * in the session's working directory, never through a shell; exit 0 passes. They run through the
 * executor, in their own process group, so the wall-time limit stops the whole group (a validator's
 * grandchildren included) and output is bounded.
 */
import type { CellBoundary } from "../exec/executor.js";
import type { LaunchSpec, Prepared } from "./world.js";

export interface ValidatorRun {
  readonly exit_code: number | null;
  readonly passed: boolean;
  /** The tail of stdout and stderr, interleaved, bounded. */
  readonly output: string;
}

const OUTPUT_LIMIT = 8000;

/** Runs one validator to completion or its wall-time limit. Never throws for the command's failure. */
export async function runValidator(
  executor: { prepare(spec: LaunchSpec): Promise<Prepared> },
  argv: readonly string[],
  cwd: string,
  wallTimeMs: number,
  scriptDir: string,
  boundary?: CellBoundary,
): Promise<ValidatorRun> {
  let output = "";
  const prepared = await executor.prepare({
    cellId: 0,
    cell: { kind: "cmd", argv: [...argv] },
    cwd,
    scriptDir,
    ...(boundary !== undefined ? { boundary } : {}),
    wallTimeMs,
    outputLimitBytes: 256 * 1024,
    onOutput: async (chunks) => {
      for (const c of chunks) output = (output + c.data).slice(-OUTPUT_LIMIT);
    },
  });
  if (prepared.kind === "unlaunchable") {
    return { exit_code: null, passed: false, output: prepared.outcome.detail ?? "the validator could not be started" };
  }
  prepared.release();
  const outcome = await prepared.done;
  if (outcome.detail) output = `${output}\n[cairn: ${outcome.detail}]`.trim().slice(-OUTPUT_LIMIT);
  return { exit_code: outcome.exit_code, passed: outcome.result === "success", output };
}
