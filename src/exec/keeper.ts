/**
 * The cell keeper: a small process beside an owner that holds its cells to the owner's lease even
 * when the owner itself can no longer act.
 *
 * The lease promises that an owner's cells stop before its lease can have expired, so
 * that the next owner, which waits for that lease, never overlaps them. A live owner keeps the
 * promise itself (`guardLease` kills its cells when the lease is lost). A frozen owner (SIGSTOP, a
 * stalled VM) or a dead one (SIGKILL, OOM) cannot; on the same host the next owner's recovery stops
 * the survivors, but on another host nothing could, and those cells ran on.
 *
 * So the owner starts a keeper (lazily, with its first cell): a detached process in its own process
 * group, fed through a pipe. The owner tells it each cell's process group (with the leader's start
 * time, so a recycled pid is never signalled) and, every 250 ms, until when its lease is still sure
 * to be held. The keeper SIGKILLs every group it holds when that deadline passes without a newer one:
 * the owner froze, died, or lost the lease. A new keeper gets the deadline and the groups in its
 * arguments (past ARGV_GROUPS, the rest in a file open as its fd 3), so an owner that freezes right
 * after starting it has still handed it everything. When the pipe closes (the owner exited or
 * closed), groups the owner did not clear are killed at the deadline too, not at once, so that
 * same-host recovery can still find the survivors of a crash until then. An owner that stops its
 * cells itself clears them. The keeper's program is keeper-main.ts.
 *
 * A cell can reach its keeper (same user): stopped (SIGSTOP), it is continued at the owner's next
 * beat or add; killed, the owner starts a new one at once and hands it every group it still holds.
 *
 * The keeper adds liveness to the lease, never safety: fencing is the epoch, whatever the clocks.
 * Its deadline is measured on this machine's monotonic clock only, from a remaining time the owner
 * computed with a margin below the lease's real expiry.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, openSync, unlinkSync, writeSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { readProcStat } from "./procfs.js";

/**
 * Node's arguments that start the keeper's program (keeper-main.ts), before the keeper's own: built
 * (dist/), keeper-main.js beside this file; in a bundle of Cairn (deploy/Dockerfile's /app/cairn.mjs,
 * the nemesis's worker), cairn-keeper.mjs beside the bundle, built from keeper-main.ts alongside it
 * (KEEPER_BUNDLE); run from source (tsx), keeper-main.ts bundled into plain JavaScript in memory
 * (see fromSource). Throws when none is there: an owner without a keeper would hold its cells to no
 * lease, so a package that lacks it must fail at open rather than lose that guarantee silently.
 */
let resolved: readonly string[] | null = null;
function keeperCommand(): readonly string[] {
  if (resolved !== null) return resolved;
  const here = import.meta.url;
  if (here.endsWith(".ts")) return (resolved = fromSource(here));
  for (const name of ["./keeper-main.js", `./${KEEPER_BUNDLE}`]) {
    const program = fileURLToPath(new URL(name, here));
    if (existsSync(program)) return (resolved = [program]);
  }
  throw new Error(`the cell keeper's program is missing: neither keeper-main.js nor ${KEEPER_BUNDLE} is beside ${fileURLToPath(here)} (a bundle of Cairn must ship src/exec/keeper-main.ts bundled as ${KEEPER_BUNDLE} beside it)`);
}

/** The part of esbuild's API fromSource uses. */
interface EsbuildSync {
  buildSync(options: Record<string, unknown>): { outputFiles: { text: string }[] };
}

/**
 * Run from source: keeper-main.ts bundled by esbuild (which tsx brings), once per process, and
 * handed to node as `-e` code ("cairn-keeper" stands where a program's path would be in its argv).
 * Not run through tsx itself: tsx's own start costs a keeper about 0.4 s of CPU, and a keeper that
 * starts late acts late. Nothing is written, so an owner running as another user from a read-only
 * copy of the sources (the partition tests) starts its keeper too.
 */
function fromSource(here: string): readonly string[] {
  const esbuild = createRequire(here)("esbuild") as EsbuildSync;
  const entry = fileURLToPath(new URL("./keeper-main.ts", here));
  const built = esbuild.buildSync({ entryPoints: [entry], bundle: true, platform: "node", format: "esm", target: "node20", write: false, logLevel: "error" });
  return ["--input-type=module", "-e", built.outputFiles[0]!.text, "cairn-keeper"];
}

/** The file name of keeper-main.ts bundled, beside a bundle of Cairn (see keeperCommand). */
export const KEEPER_BUNDLE = "cairn-keeper.mjs";

/** How often the owner tells the keeper its lease's deadline. */
export const KEEPER_BEAT_MS = 250;

/**
 * Groups handed to a new keeper in its arguments (about 20 bytes each: well under Linux's 128 KiB
 * for one argument); an owner holding more hands it the rest in a file (see spill), never through
 * the pipe after the start: an owner frozen before its queued writes drained would leave them
 * unheld.
 */
const ARGV_GROUPS = 4000;

/** A keeper that exits is replaced at once, up to this many starts in RESTART_WINDOW_MS; then once a second. */
const RESTARTS_AT_ONCE = 5;
const RESTART_WINDOW_MS = 10_000;

/** One owner's keeper. Every method is fire-and-forget and never throws. */
export class CellKeeper {
  private child: ChildProcess | null = null;
  private beat: NodeJS.Timeout | null = null;
  private closed = false;
  /** Drops not sent yet (see drop). */
  private dropped = "";
  /** The groups the keeper holds for this owner (pgid to leader start time), to hand to a new keeper. */
  private readonly held = new Map<number, string>();
  /** Keepers started, the first included (tests), and when the recent ones started (restart limit). */
  private started = 0;
  private recentStarts: number[] = [];
  private restartTimer: NodeJS.Timeout | null = null;

  /**
   * @param remainingMs how long the owner's lease is still sure to be held (0: lost or released).
   * @param label shown in `ps` (the database's name), so an operator can tell whose keeper it is.
   */
  constructor(
    private readonly remainingMs: () => number,
    private readonly label: string,
  ) {
    this.command = keeperCommand();
  }

  /** Node's arguments that start the keeper's program (see keeperCommand). */
  private readonly command: readonly string[];

  /** Holds `pgid` (leader started at `startTime`, as /proc reports it) to the lease. Starts the keeper on first use. */
  add(pgid: number, startTime: string): void {
    if (this.closed || !Number.isInteger(pgid) || pgid <= 1) return;
    this.held.set(pgid, startTime);
    if (this.child === null) {
      this.ensure();
    } else {
      this.continueIfStopped();
      this.send(`add ${pgid} ${startTime}`);
    }
  }

  /**
   * `pgid` ended (or was stopped by the owner): forget it. Sent with the next line (an `add`, or the
   * beat within KEEPER_BEAT_MS), not on its own: one write to the keeper fewer per cell. Until then
   * the keeper may still kill the group at a deadline, which is harmless: it ended, and a recycled
   * pid is never signalled (the leader's start time is checked).
   */
  drop(pgid: number): void {
    this.held.delete(pgid);
    if (this.child !== null) this.dropped += `drop ${pgid}\n`;
  }

  /**
   * The owner is done: `stoppedItsCells` when it stopped every cell itself (a clean close, a fence),
   * so nothing is left for the keeper; otherwise the keeper kills what it holds at the deadline.
   */
  close(stoppedItsCells: boolean): void {
    if (this.closed) return;
    this.closed = true;
    if (this.beat !== null) clearInterval(this.beat);
    if (this.restartTimer !== null) clearTimeout(this.restartTimer);
    if (stoppedItsCells) this.held.clear();
    if (this.child === null) return;
    if (stoppedItsCells && this.keeperStopped()) {
      // Continued later, it could act on its old deadline before it reads "clear": nothing is left
      // for it to do, so it is ended instead.
      this.signalKeeper("SIGKILL");
      return;
    }
    this.continueIfStopped();
    if (stoppedItsCells) this.send("clear");
    else this.sendBeat();
    this.child.stdin?.end();
  }

  /** The keeper's pid (tests), or null before the first cell. */
  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  /** How many keepers this owner started, the first included (tests). */
  get keepersStarted(): number {
    return this.started;
  }

  /** Starts a keeper and hands it the lease deadline and every group held. */
  private ensure(): void {
    if (this.child !== null || this.closed) return;
    this.started++;
    this.recentStarts = [...this.recentStarts.filter((t) => performance.now() - t < RESTART_WINDOW_MS), performance.now()];
    let child: ChildProcess;
    const entries = [...this.held].map(([pgid, start]) => `${pgid}:${start}`);
    let rest: number | null = null;
    /** The groups past the arguments, when they could not be spilled: sent through the pipe after the start. */
    let piped: string[] = [];
    try {
      const args = [...this.command, this.label, this.deadline(), entries.slice(0, ARGV_GROUPS).join(",")];
      if (entries.length > ARGV_GROUPS) {
        try {
          rest = spill(entries.slice(ARGV_GROUPS).join(","));
          args.push("fd3");
        } catch {
          // No file can be written (the temporary directory is missing or full): a keeper that holds
          // the groups in its arguments at once and gets the rest through the pipe is still far
          // better than none. Only an owner frozen before the pipe drained leaves those unheld.
          piped = entries.slice(ARGV_GROUPS);
        }
      }
      child = spawn(process.execPath, args, {
        detached: true,
        stdio: rest === null ? ["pipe", "ignore", "ignore"] : ["pipe", "ignore", "ignore", rest],
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      });
    } catch {
      // Node throws for some spawn failures (ENOMEM, an argument it refuses) instead of emitting
      // "error": the same as a keeper that exited at once, never an exception out of add() or a timer.
      this.restart();
      return;
    } finally {
      if (rest !== null) closeQuietly(rest);
    }
    // A spawn that fails emits "error" and no "exit": either way the keeper is gone.
    child.on("error", () => this.keeperExited(child));
    child.on("exit", () => this.keeperExited(child));
    child.stdin?.on("error", () => undefined);
    child.unref();
    (child.stdin as unknown as { unref?: () => void } | null)?.unref?.();
    this.child = child;
    this.dropped = "";
    for (const entry of piped) this.send(`add ${entry.replace(":", " ")}`);
    if (this.beat === null) {
      this.beat = setInterval(() => this.sendBeat(), KEEPER_BEAT_MS);
      this.beat.unref();
    }
  }

  /**
   * A keeper that exits while its owner runs was killed (a cell can signal it) or failed to start:
   * the groups it held would be unguarded, so a new keeper takes them over at once.
   */
  private keeperExited(child: ChildProcess): void {
    if (this.child !== child) return;
    this.child = null;
    this.restart();
  }

  /** Starts a keeper in place of one that is gone, if it holds groups (see keeperExited). */
  private restart(): void {
    if (this.closed || this.held.size === 0 || this.restartTimer !== null) return;
    // At once; only a keeper that keeps dying (RESTARTS_AT_ONCE in RESTART_WINDOW_MS: it cannot
    // start, or something kills it in a loop) is restarted once a second, so that this never spins.
    const now = performance.now();
    const recent = this.recentStarts.filter((t) => now - t < RESTART_WINDOW_MS);
    if (recent.length < RESTARTS_AT_ONCE) {
      this.ensure();
      return;
    }
    this.restartTimer = setTimeout(() => {
      this.restartTimer = null;
      this.ensure();
    }, 1000);
    this.restartTimer.unref();
  }

  private keeperStopped(): boolean {
    const pid = this.child?.pid;
    if (pid === undefined) return false;
    const state = readProcStat(pid)?.state;
    return state === "T" || state === "t";
  }

  /**
   * A stopped keeper (a cell can send it SIGSTOP) would miss its deadline: continue it. Sent without
   * reading its state first: the kernel discards a SIGCONT to a process that runs (the keeper keeps
   * SIGCONT's default action), and one kill() costs less than reading /proc/PID/stat on every add.
   */
  private continueIfStopped(): void {
    this.signalKeeper("SIGCONT");
  }

  private signalKeeper(signal: NodeJS.Signals): void {
    const pid = this.child?.pid;
    if (pid === undefined) return;
    try {
      process.kill(pid, signal);
    } catch {
      // gone meanwhile: keeperExited starts another
    }
  }

  /** The lease's deadline on CLOCK_MONOTONIC in nanoseconds (see keeper-main.ts), or "none" for a lease that never ends. */
  private deadline(): string {
    const ms = this.remainingMs();
    if (ms === Infinity) return "none";
    // NaN or negative: the lease is not sure to be held at all, so the deadline is now.
    const remainingNs = ms > 0 ? BigInt(Math.floor(ms * 1e6)) : 0n;
    return String(process.hrtime.bigint() + remainingNs);
  }

  private sendBeat(): void {
    this.continueIfStopped();
    this.send(`beat ${this.deadline()}`);
  }

  private send(line: string): void {
    const stdin = this.child?.stdin;
    if (stdin && !stdin.destroyed && stdin.writable) stdin.write(`${this.dropped}${line}\n`);
    this.dropped = "";
  }
}

/**
 * `text` in a file that has no name, open for reading and writing: the descriptor is handed to a new
 * keeper as its fd 3 (it reads from offset 0, so the shared offset does not matter). The file is
 * unlinked right after it is created, so nothing is left behind when either process dies; only an
 * owner killed between the open and the unlink (two system calls) leaves an empty file in the
 * temporary directory. Throws when it cannot be written; the caller then sends those groups through
 * the pipe instead.
 */
function spill(text: string): number {
  const path = join(tmpdir(), `cairn-keeper-${process.pid}-${randomBytes(6).toString("hex")}`);
  const fd = openSync(path, "wx+", 0o600);
  try {
    unlinkSync(path);
    const bytes = Buffer.from(text, "latin1");
    for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at, bytes.length - at, at);
    return fd;
  } catch (err) {
    closeQuietly(fd);
    throw err;
  }
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // already closed
  }
}
