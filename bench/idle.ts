/**
 * Idle-CPU benchmark: how much CPU does an idle `cairn serve` burn? An idle session must cost
 * nothing (ARCHITECTURE.md section 7), so the physical limit is 0% and the budget is "well under 1% of
 * one core".
 *
 * Method: spawn the worker, wait until it is ready, read utime+stime of its PID from /proc/PID/stat,
 * sleep N seconds, read again; CPU seconds = delta ticks / CLK_TCK (`getconf CLK_TCK`). Only the
 * worker's own PID is measured (children it has not reaped are not counted). Then SIGTERM it and
 * report its exit. Linux only (/proc).
 *
 * Run: node --import tsx bench/idle.ts [--seconds 30] [--settle 2] [--ready readyz|started] [-- COMMAND ARGS...]
 * ("{dataDir}" in the command is replaced by a fresh temporary directory.)
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { startDevCluster } from "../src/cli/devcluster/index.js";
import { parseProcStat } from "./stats.js";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** The worker measured by default; `{dataDir}` becomes a temporary directory. */
export const DEFAULT_IDLE_COMMAND: readonly string[] = [process.execPath, "bin/cairn.js", "serve", "--db", "idle-bench", "--data-dir", "{dataDir}", "--listen", "127.0.0.1:0", "--model", "scripted:examples/fix-calc.json", "--create"];

/** Options of {@link measureIdle} and {@link runIdleBench}. */
export interface IdleBenchOptions {
  /** Measurement window, default 30. */
  seconds?: number;
  /** The process to measure, argv form (no shell); default {@link DEFAULT_IDLE_COMMAND}, run from the repository root. */
  command?: readonly string[];
  /**
   * How to know the process is ready: "readyz" (default) waits for an `http://HOST:PORT` in its
   * output (e.g. the "observability endpoint listening" log line) and then for GET /readyz = 200;
   * "started" measures right after spawn (for processes without an endpoint, like `sleep`).
   */
  ready?: "readyz" | "started";
  /** Seconds to wait after readiness before measuring, so startup work (module loading, JIT, resume) is not counted; default 2. */
  settleSeconds?: number;
  /** Give up waiting for readiness after this many seconds; default 60. */
  readyTimeoutSeconds?: number;
  /** Working directory of the command; default the repository root. */
  cwd?: string;
  /** Where result lines go; default console.log. */
  print?: (line: string) => void;
}

/** What one measurement found. */
export interface IdleBenchResult {
  pid: number;
  cpuSeconds: number;
  wallSeconds: number;
  /** cpuSeconds / wallSeconds * 100. */
  percentOfCore: number;
  clockTicks: number;
  /** Exit after SIGTERM: code, or the signal that ended it (null/null if it had to be SIGKILLed and still did not report). */
  exitCode: number | null;
  exitSignal: string | null;
  /** True when SIGTERM was ignored for 10 s and SIGKILL was sent. */
  killed: boolean;
}

/** Clock ticks per second of /proc/PID/stat times, from `getconf CLK_TCK` (100 on Linux in practice). */
export async function clockTicksPerSecond(): Promise<number> {
  const out = await new Promise<string>((res, rej) => execFile("getconf", ["CLK_TCK"], (err, stdout) => (err ? rej(err) : res(stdout))));
  const ticks = Number(out.trim());
  if (!Number.isInteger(ticks) || ticks <= 0) throw new Error(`getconf CLK_TCK printed ${JSON.stringify(out)}, expected a positive integer`);
  return ticks;
}

/**
 * utime + stime of `pid` in clock ticks, from /proc/PID/stat. Throws when the process does not exist
 * (ENOENT) or the line cannot be parsed.
 */
export async function readCpuTicks(pid: number): Promise<number> {
  return parseProcStat(await readFile(`/proc/${pid}/stat`, "utf8")).own;
}

function sleep(ms: number): Promise<void> {
  return new Promise((res) => setTimeout(res, ms));
}

interface Running {
  child: ChildProcess;
  output: () => string;
  exited: Promise<{ code: number | null; signal: string | null }>;
  hasExited: () => boolean;
}

function start(command: readonly string[], cwd: string): Running {
  const [file, ...args] = command;
  if (file === undefined) throw new Error("idle bench: empty command");
  const child = spawn(file, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const keep = (chunk: Buffer): void => {
    out = (out + chunk.toString()).slice(-64 * 1024);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  let done = false;
  const exited = new Promise<{ code: number | null; signal: string | null }>((res, rej) => {
    child.once("error", (err) => {
      done = true;
      rej(err);
    });
    child.once("exit", (code, signal) => {
      done = true;
      res({ code, signal });
    });
  });
  exited.catch(() => undefined); // observed by the callers that await it
  return { child, output: () => out, exited, hasExited: () => done };
}

async function waitReady(run: Running, timeoutSeconds: number): Promise<void> {
  const deadline = Date.now() + timeoutSeconds * 1000;
  let url: string | undefined;
  let last = "no /readyz answer yet";
  while (Date.now() < deadline) {
    if (run.hasExited()) {
      const { code, signal } = await run.exited;
      throw new Error(`the measured process exited before it was ready (code ${code}, signal ${signal}); its output:\n${run.output().slice(-4000)}`);
    }
    url ??= /https?:\/\/[A-Za-z0-9.\-[\]:]+:\d+/.exec(run.output())?.[0];
    if (url !== undefined) {
      try {
        const res = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) });
        last = `${res.status} ${(await res.text()).trim()}`;
        if (res.status === 200) return;
      } catch (err) {
        last = err instanceof Error ? err.message : String(err);
      }
    }
    await sleep(200);
  }
  throw new Error(`the measured process was not ready after ${timeoutSeconds}s (${url === undefined ? "it printed no http://HOST:PORT" : `${url}/readyz: ${last}`}); its output:\n${run.output().slice(-4000)}`);
}

async function stop(run: Running): Promise<{ code: number | null; signal: string | null; killed: boolean }> {
  if (!run.hasExited()) run.child.kill("SIGTERM");
  const timer = new Promise<"timeout">((res) => setTimeout(() => res("timeout"), 10_000).unref());
  const first = await Promise.race([run.exited, timer]);
  if (first !== "timeout") return { ...first, killed: false };
  run.child.kill("SIGKILL");
  return { ...(await run.exited), killed: true };
}

/**
 * Spawns the command, waits until it is ready, measures its CPU over `seconds`, SIGTERMs it and
 * returns the numbers. The process is always stopped (SIGKILL after 10 s of ignoring SIGTERM) and the
 * temporary data directory removed, even when readiness or measurement fails.
 */
export async function measureIdle(opts: IdleBenchOptions = {}): Promise<IdleBenchResult> {
  const seconds = opts.seconds ?? 30;
  if (!(seconds > 0)) throw new Error(`--seconds expects a positive number, got ${seconds}`);
  const settle = opts.settleSeconds ?? 2;
  if (!(settle >= 0)) throw new Error(`--settle expects a number of seconds >= 0, got ${settle}`);
  const clockTicks = await clockTicksPerSecond();
  const dataDir = await mkdtemp(join(tmpdir(), "cairn-idle-"));
  const command = (opts.command ?? DEFAULT_IDLE_COMMAND).map((a) => a.replaceAll("{dataDir}", dataDir));
  const run = start(command, opts.cwd ?? ROOT);
  try {
    await new Promise<void>((res, rej) => {
      run.child.once("spawn", () => res());
      run.exited.catch(rej);
    });
    const pid = run.child.pid!;
    if ((opts.ready ?? "readyz") === "readyz") await waitReady(run, opts.readyTimeoutSeconds ?? 60);
    await sleep(settle * 1000);
    const before = await readCpuTicks(pid);
    const t0 = process.hrtime.bigint();
    await sleep(seconds * 1000);
    if (run.hasExited()) {
      const { code, signal } = await run.exited;
      throw new Error(`the measured process exited during the measurement (code ${code}, signal ${signal}); its output:\n${run.output().slice(-4000)}`);
    }
    const after = await readCpuTicks(pid);
    const wallSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
    const cpuSeconds = (after - before) / clockTicks;
    const exit = await stop(run);
    return { pid, cpuSeconds, wallSeconds, percentOfCore: (cpuSeconds / wallSeconds) * 100, clockTicks, exitCode: exit.code, exitSignal: exit.signal, killed: exit.killed };
  } finally {
    if (!run.hasExited()) await stop(run).catch(() => undefined);
    await rm(dataDir, { recursive: true, force: true });
  }
}

/** Runs {@link measureIdle} and prints the result: "% of one core", then how the process exited. */
export async function runIdleBench(opts: IdleBenchOptions = {}): Promise<void> {
  const print = opts.print ?? ((line: string) => console.log(line));
  const command = opts.command ?? DEFAULT_IDLE_COMMAND;
  print(`idle bench: ${command.join(" ")}: measuring ${opts.seconds ?? 30}s after ${opts.settleSeconds ?? 2}s of settling`);
  const r = await measureIdle(opts);
  print(`idle CPU: ${r.percentOfCore.toFixed(3)}% of one core (${r.cpuSeconds.toFixed(2)} s CPU over ${r.wallSeconds.toFixed(1)} s wall, CLK_TCK ${r.clockTicks}, pid ${r.pid}; physical limit 0%)`);
  const how = r.exitCode !== null ? `exit code ${r.exitCode}` : `killed by signal ${r.exitSignal ?? "unknown"}`;
  print(`after SIGTERM: ${how}${r.killed ? " (ignored SIGTERM for 10 s: SIGKILL sent)" : ""}`);
}

/**
 * The same measurement for `cairn serve --storage replicated` on a 3-member dev cluster started for
 * it (etcd's own CPU is not counted: only the worker's). An idle replicated owner still renews its
 * liveness lease (every sixth of `--liveness`) and polls every member's status (once a second, for
 * the quorum view and the router), so it cannot reach sqlite's near zero.
 */
export async function runReplicatedIdleBench(opts: Omit<IdleBenchOptions, "command"> = {}): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "cairn-idle-etcd-"));
  try {
    const cluster = await startDevCluster({ dir: join(dir, "cluster") });
    try {
      const command = [...DEFAULT_IDLE_COMMAND, "--storage", "replicated", "--etcd", cluster.endpoints.join(",")];
      await runIdleBench({ ...opts, command });
    } finally {
      await cluster.stop();
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function parseArgs(argv: readonly string[]): IdleBenchOptions {
  const opts: IdleBenchOptions = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--") {
      opts.command = argv.slice(i + 1);
      if (opts.command.length === 0) throw new Error("nothing after --: give the command to measure");
      break;
    } else if (arg === "--seconds") {
      opts.seconds = Number(argv[++i]);
    } else if (arg === "--settle") {
      opts.settleSeconds = Number(argv[++i]);
    } else if (arg === "--ready") {
      const value = argv[++i];
      if (value !== "readyz" && value !== "started") throw new Error(`--ready expects readyz or started, got ${String(value)}`);
      opts.ready = value;
    } else {
      throw new Error(`unknown argument ${String(arg)}; usage: bench/idle.ts [--seconds N] [--settle N] [--ready readyz|started] [-- COMMAND ARGS...]`);
    }
  }
  return opts;
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  runIdleBench(parseArgs(process.argv.slice(2))).catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exitCode = 1;
  });
}
