/**
 * Runs the real `cairn` command from source (`node --import tsx src/cli/entry.ts ...`) as a child
 * process, the way an operator would, and collects how it ended: exit code or signal, stdout, stderr.
 * Every child is tracked so that `after` hooks can SIGKILL whatever is left, even on failure.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { killTracked, track } from "./procs.js";

/** The repository root (the CLI runs from here, so `tsx` and `src/` resolve). */
export const REPO = fileURLToPath(new URL("../../", import.meta.url));

/** How a cairn process ended. */
export interface CliResult {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** A running cairn process. */
export interface CliProcess {
  readonly pid: number;
  readonly child: ChildProcess;
  /** Resolves when the process has exited and its pipes closed. */
  readonly result: Promise<CliResult>;
}

const children = new Set<ChildProcess>();
const cairnPids = new Set<number>();

/**
 * Starts `cairn ARGS`. `env` is added to this process's environment, with any inherited
 * CAIRN_CHAOS_KILL_AT and OPENAI_* variables removed first (a test sets exactly what it means).
 * `limitMs` kills a process that hangs (a guard: the result then says SIGKILL and the test fails on
 * its assertions, with the output in the message). `entry`: a bundle of src/cli/entry.ts to run with
 * plain node instead of the sources under tsx (a faster start, for tests that start many).
 */
export function startCairn(args: readonly string[], env: Record<string, string> = {}, limitMs = 60_000, entry?: string): CliProcess {
  const base: NodeJS.ProcessEnv = { ...process.env };
  for (const k of Object.keys(base)) if (k === "CAIRN_CHAOS_KILL_AT" || k.startsWith("OPENAI_") || k.startsWith("ANTHROPIC_")) delete base[k];
  const child = spawn(process.execPath, entry === undefined ? ["--import", "tsx", "src/cli/entry.ts", ...args] : [entry, ...args], {
    cwd: REPO,
    env: { ...base, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  if (child.pid === undefined) throw new Error(`could not start cairn ${args.join(" ")}`);
  children.add(child);
  cairnPids.add(child.pid);
  track(child.pid);
  let stdout = "";
  let stderr = "";
  child.stdout?.setEncoding("utf8").on("data", (d: string) => (stdout += d));
  child.stderr?.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const guard = setTimeout(() => child.kill("SIGKILL"), limitMs);
  const result = new Promise<CliResult>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code, signal) => {
      clearTimeout(guard);
      children.delete(child);
      resolve({ code, signal, stdout, stderr });
    });
  });
  return { pid: child.pid, child, result };
}

/** Runs `cairn ARGS` to its end. */
export function runCairn(args: readonly string[], env: Record<string, string> = {}, limitMs = 60_000, entry?: string): Promise<CliResult> {
  return startCairn(args, env, limitMs, entry).result;
}

/** One line for assertion messages: how the process ended and what it printed. */
export function describe(r: CliResult): string {
  return `exit ${r.code} signal ${r.signal}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;
}

/**
 * Cleanup for `after`: SIGKILLs every cairn child still running and every tracked process (cells'
 * survivors the test registered), and removes the timer sockets that SIGKILLed cairn processes left
 * in the OS temp dir (only those of our own pids).
 */
export function cleanupProcesses(): void {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  killTracked();
  let names: string[] = [];
  try {
    names = readdirSync(tmpdir());
  } catch {
    return;
  }
  for (const name of names) {
    const m = /^cairn-timer-(\d+)-[0-9a-f]+\.sock$/.exec(name);
    if (m !== null && cairnPids.has(Number(m[1]))) rmSync(join(tmpdir(), name), { force: true });
  }
}
