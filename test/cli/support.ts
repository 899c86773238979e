/**
 * Runs the `cairn` CLI from source in a child process and captures its output and exit code.
 */
import { spawn } from "node:child_process";
import { join } from "node:path";

export const ROOT = process.cwd();
export const ENTRY = join(ROOT, "src", "cli", "entry.ts");

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs `cairn ARGS` to completion (bounded by `timeoutMs`, then SIGKILL). */
export function cairn(args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", ENTRY, ...args], {
      cwd: opts.cwd ?? ROOT,
      env: { ...process.env, ...opts.env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 240_000);
    child.on("error", reject);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** True when the text holds a JavaScript stack trace. */
export function hasStack(text: string): boolean {
  return /\n\s+at .+\(.+:\d+:\d+\)/.test(text) || /^\s+at .+:\d+:\d+$/m.test(text);
}
