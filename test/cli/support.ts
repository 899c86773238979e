/**
 * Runs the `cairn` CLI and captures its output and exit code: in this process through `main(argv, io)`
 * (`cairnIn`: fast, for everything that needs no process of its own), or from source in a child
 * process (`cairn`: the end-to-end runs, and what needs a real process: signals, a SIGKILL, a cwd).
 */
import { spawn } from "node:child_process";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { main } from "../../src/cli/main.js";

export const ROOT = process.cwd();
export const ENTRY = join(ROOT, "src", "cli", "entry.ts");
const TSX = pathToFileURL(join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs `cairn ARGS` to completion (bounded by `timeoutMs`, then SIGKILL). */
export function cairn(args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    // tsx by path: `--import tsx` resolves from the child's cwd, which may be outside the repository.
    const child = spawn(process.execPath, ["--import", TSX, ENTRY, ...args], {
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

/**
 * Runs `cairn ARGS` in this process (`main(argv, io)`), with `env` over this process's environment
 * and output captured as the CLI writes it, a line at a time. Not for commands that signal or kill
 * their own process (CAIRN_CHAOS_KILL_AT) or need another working directory: use `cairn` for those.
 */
export async function cairnIn(args: string[], opts: { env?: NodeJS.ProcessEnv; isTTY?: boolean } = {}): Promise<CliResult> {
  let stdout = "";
  let stderr = "";
  const code = await main(args, { out: (l) => (stdout += `${l}\n`), err: (l) => (stderr += `${l}\n`), env: { ...process.env, ...opts.env }, isTTY: opts.isTTY ?? false });
  return { code, signal: null, stdout, stderr };
}

/** True when the text holds a JavaScript stack trace. */
export function hasStack(text: string): boolean {
  return /\n\s+at .+\(.+:\d+:\d+\)/.test(text) || /^\s+at .+:\d+:\d+$/m.test(text);
}
