/**
 * Validators: commands the harness runs before it accepts a `success` conclusion. Each is an argv run
 * in the session's working directory, never through a shell; exit 0 passes.
 */
import { execa } from "execa";

export interface ValidatorRun {
  readonly exit_code: number | null;
  readonly passed: boolean;
  /** The tail of stdout and stderr, interleaved, bounded. */
  readonly output: string;
}

const OUTPUT_LIMIT = 8000;

/** Runs one validator to completion (or its wall-time limit). Never throws for the command's failure. */
export async function runValidator(argv: readonly string[], cwd: string, wallTimeMs: number): Promise<ValidatorRun> {
  const [file, ...args] = argv;
  if (file === undefined) return { exit_code: null, passed: false, output: "empty validator command" };
  const r = await execa(file, args, { cwd, all: true, reject: false, timeout: wallTimeMs, stdin: "ignore", maxBuffer: 4 * 1024 * 1024 });
  let output = typeof r.all === "string" ? r.all : "";
  if (r.failed && r.exitCode === undefined) output = `${output}\n${r.shortMessage}`.trim();
  if (r.timedOut) output = `${output}\n[cairn: validator stopped after ${Math.round(wallTimeMs / 1000)} s]`.trim();
  return { exit_code: r.exitCode ?? null, passed: r.exitCode === 0 && !r.timedOut, output: output.slice(-OUTPUT_LIMIT) };
}
