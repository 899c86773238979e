/**
 * Starting a gate process through the small native launcher (native/launcher.c, built by `npm ci`).
 * It gives the executor a pid that leads its own session and process group, three stream sockets
 * (the gate's stdin, stdout, stderr) and a promise of how the leader exited.
 *
 * Why a launcher, and why the only path. Node starts every child with fork(): the harness's whole
 * address space has its page tables copied, and each page it writes afterwards takes a
 * copy-on-write fault, which made a launch cost the harness 3.5 to 6.5 ms of CPU (52 to 317 MB of
 * heap), the largest cost of a round. The launcher is a tiny C program started once per process; it
 * forks the gate, so the harness only writes a request and accepts three connections. Measured
 * beside Node's spawn in one run by `npm run bench -- launch`.
 *
 * The gate is the launcher's forked child: it waits for "go" on its stdin, then execs the argv it
 * was given (the cell's init, inside the sandbox or not; see executor.ts). Its contract: it blocks
 * reading "go" and runs nothing before; a gate whose stdin peer is gone reads end-of-file and exits
 * 125; its identity (pid = pgid, start time from /proc) is read by the launcher right after its
 * setsid. Release, stopping and identity stay with the harness.
 *
 * The connections come back on a Unix socket in a private directory (0700, this user's, made with
 * mkdtemp): other users cannot connect at all; a connection counts only once its first line names
 * the 128-bit token of a launch in progress, which only this process and its launcher know; and
 * unpaired connections are few (MAX_UNPAIRED) and short-lived (UNPAIRED_TIMEOUT_MS), so nobody can
 * pile them up. The launcher is started with an empty environment: it holds no secret.
 *
 * After release the gate keeps its stdin connection as fd 3 for the cell's init, which reports the
 * cell's exact wait status there ("X <status>"): through a sandbox, the leader's own exit code could
 * not tell a signal from an exit code.
 *
 * If the launcher itself dies while cells run (someone killed it), the harness cannot learn their
 * exit status: each such cell is followed until its leader is gone, and then ends with an exit status
 * marked unknown (the executor reports it as an error that says so). The next launch starts a new
 * launcher.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants as fsConstants, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { constants as osConstants } from "node:os";
import { dirname, join, resolve as resolvePath } from "node:path";
import { fileURLToPath } from "node:url";
import { ConfigError } from "../errors.js";
import { makePrivateTempDir } from "./private.js";
import { readProcStat } from "./procfs.js";
import type { GateExit, GateLauncher, GateProcess, GateSpawn, GateStart } from "./gate.js";

/** What failed, from the step an E answer names (native/launcher.c). */
function failedStep(step: string | undefined, p: { cwd: string; program: string }): string {
  if (step === "chdir") return `the working directory ${p.cwd} could not be entered`;
  if (step === "connect") return "the cell launcher could not connect back to this process";
  if (step === "exec" || step === undefined) return `spawn ${p.program}`;
  return `spawn ${p.program} (at ${step})`;
}

/** The launcher refuses a request larger than this (native/launcher.c's MAX_FRAME); so do we, first. */
const MAX_FRAME = 32 * 1024 * 1024;
/** How often a cell whose launcher died is checked for having ended. */
const ORPHAN_POLL_MS = 100;
/** While launches or exits are awaited, how often the launcher is checked for being stopped. */
const STOPPED_CHECK_MS = 1000;
/** A connection that has not been paired with a launch by then is closed (a stranger's, or a stale one). */
const UNPAIRED_TIMEOUT_MS = 1000;
/** At most this many connections may wait to be paired; more are closed at once. */
const MAX_UNPAIRED = 64;
/** How long, after the gate's leader exited, its init's status report may still take to arrive. */
const STATUS_WAIT_MS = 1000;

const signalNames = new Map<number, string>(Object.entries(osConstants.signals).map(([name, n]) => [n, name]));
const errnoNames = new Map<number, string>(Object.entries(osConstants.errno).map(([name, n]) => [n, name]));

function errnoError(errno: number, what: string): NodeJS.ErrnoException {
  const code = errnoNames.get(errno) ?? `errno ${errno}`;
  const err: NodeJS.ErrnoException = new Error(`${what}: ${code}`);
  err.code = code;
  err.errno = -errno;
  return err;
}

/** Decodes a raw wait(2) status into Node's (code, signal). */
export function decodeWaitStatus(status: number): GateExit {
  const low = status & 0x7f;
  if (low === 0) return { code: (status >> 8) & 0xff, signal: null };
  return { code: null, signal: signalNames.get(low) ?? `SIG${low}` };
}

/** The path of the built launcher (build/cairn-launcher), or null when it is not there (or not executable). */
export function nativeLauncherPath(): string | null {
  // src/exec (run from source) and dist/src/exec (built) are two and three levels below the root; a
  // bundle (deploy/Dockerfile's /app/cairn.mjs) sits at the root.
  const here = dirname(fileURLToPath(import.meta.url));
  for (const up of ["../..", "../../..", "."]) {
    const candidate = join(here, up, "build", "cairn-launcher");
    try {
      accessSync(candidate, fsConstants.X_OK);
      return candidate;
    } catch (_err) {
      // not here
    }
  }
  return null;
}

interface Pending {
  readonly token: string;
  /** The cell's directory, as sent: named when entering it failed. */
  readonly cwd: string;
  readonly program: string;
  readonly conns: (Socket | null)[];
  pid: number | null;
  /** From the S answer: the gate's pgid and start time, when the launcher could read them. */
  stat: { pgid: number; startTime: string } | null;
  /** Listened for from the S answer on: the X line can come before the last connection does. */
  exited: Promise<GateExit> | null;
  /** Set from the X answer: the gate's group was empty right after the reap. */
  readonly groupEmpty: { value: boolean };
  readonly resolve: (r: GateStart) => void;
}

/**
 * One running launcher process and the socket its connections come back to. Used by every executor
 * of this process; started lazily, restarted by the next launch if it died.
 */
class NativeLauncher implements GateLauncher {
  private readonly path: string;
  private running: { child: ChildProcess; server: Server; dir: string; dead: boolean } | null = null;
  /** Connections accepted and not yet paired with a launch. */
  private unpaired = 0;
  /** Checks, while busy, that the launcher is not stopped (see `continueIfStopped`). */
  private watchdog: NodeJS.Timeout | null = null;
  private starting: Promise<NonNullable<NativeLauncher["running"]>> | null = null;
  private readonly pending = new Map<string, Pending>();
  /** Exits awaited, by pid; set when the launcher answers S, resolved by its X. */
  private readonly exits = new Map<number, (e: GateExit, groupEmpty: boolean) => void>();

  constructor(
    path: string,
    private readonly unpairedTimeoutMs = UNPAIRED_TIMEOUT_MS,
  ) {
    this.path = path;
  }

  async start(spec: GateSpawn): Promise<GateStart> {
    // Node refuses a NUL byte in an argument or the environment (a C string cannot hold one); so do we,
    // in the same words, before anything is sent.
    for (const s of [...spec.argv, spec.cwd, ...Object.entries(spec.env).flat()]) {
      if (s.includes("\0")) {
        const err: NodeJS.ErrnoException = new TypeError(`The argument 'args' must be a string without null bytes. Received ${JSON.stringify(s.slice(0, 80))}`);
        err.code = "ERR_INVALID_ARG_VALUE";
        return { ok: false, error: err };
      }
    }
    const token = this.nextToken();
    const env = Object.entries(spec.env).map(([k, v]) => `${k}=${v}`);
    // The launcher's own directory is this process's when it was started, not now: a relative cwd is
    // resolved here, against this process's current directory, as Node's spawn does.
    const cwd = resolvePath(spec.cwd);
    const fields = [token, cwd, String(spec.argv.length), ...spec.argv, String(env.length), ...env];
    const body = Buffer.from(`${fields.join("\0")}\0`, "utf8");
    if (body.length > MAX_FRAME) return { ok: false, error: errnoError(osConstants.errno.E2BIG, "spawn") };
    const frame = Buffer.allocUnsafe(4 + body.length);
    frame.writeUInt32LE(body.length, 0);
    body.copy(frame, 4);

    const running = await this.ensureRunning();
    return new Promise<GateStart>((resolve) => {
      this.pending.set(token, { token, cwd, program: spec.argv[0] ?? "", conns: [null, null, null], pid: null, stat: null, groupEmpty: { value: false }, exited: null, resolve });
      this.refresh();
      running.child.stdin?.write(frame);
    });
  }

  /** Random bytes for tokens, drawn 256 tokens at a time (one randomBytes call per launch cost more than the rest of the frame). */
  private tokenPool = Buffer.alloc(0);
  private tokenAt = 0;

  /** A fresh random 128-bit token (hex), never handed out twice. */
  private nextToken(): string {
    if (this.tokenAt + 16 > this.tokenPool.length) {
      this.tokenPool = randomBytes(16 * 256);
      this.tokenAt = 0;
    }
    const token = this.tokenPool.toString("hex", this.tokenAt, this.tokenAt + 16);
    this.tokenAt += 16;
    return token;
  }

  private ensureRunning(): Promise<NonNullable<NativeLauncher["running"]>> {
    if (this.running !== null && !this.running.dead) return Promise.resolve(this.running);
    this.starting ??= this.launch().finally(() => {
      this.starting = null;
    });
    return this.starting;
  }

  private async launch(): Promise<NonNullable<NativeLauncher["running"]>> {
    // A directory of its own, 0700: only this user can even connect (see the header).
    const dir = makePrivateTempDir("cairn-launcher-");
    const path = join(dir, "s");
    const server = createServer({ allowHalfOpen: false }, (socket) => this.accept(socket));
    try {
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen(path, () => {
          server.off("error", reject);
          resolve();
        });
      });
    } catch (err) {
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
    server.on("error", () => undefined);
    server.unref();
    // Its own session: a terminal's ^C to the harness's group must not kill the launcher (cells being
    // stopped by that same shutdown still need their exits reported). An empty environment: cells get
    // theirs from each request, and the launcher holds no secret of the harness's.
    const child = spawn(this.path, [path], { detached: true, stdio: ["pipe", "pipe", "inherit"], env: {} });
    const running = { child, server, dir, dead: false };
    child.on("error", () => this.died(running, "it could not be started"));
    child.once("exit", (code, signal) => this.died(running, signal !== null ? `it was killed by ${signal}` : `it exited with code ${code}`));
    child.stdin?.on("error", () => undefined);
    let buf = "";
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      buf += chunk;
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        this.answer(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    });
    child.unref();
    this.running = running;
    this.refresh();
    return running;
  }

  /** Keeps this process alive while a launch or an exit is awaited, and only then. */
  private refresh(): void {
    const r = this.running;
    const busy = r !== null && !r.dead && (this.pending.size > 0 || this.exits.size > 0);
    if (busy && this.watchdog === null) {
      this.watchdog = setInterval(() => this.continueIfStopped(), STOPPED_CHECK_MS);
      this.watchdog.unref();
    } else if (!busy && this.watchdog !== null) {
      clearInterval(this.watchdog);
      this.watchdog = null;
    }
    if (r === null || r.dead) return;
    const out = r.child.stdout as Socket | null;
    if (busy) out?.ref();
    else out?.unref();
    (r.child.stdin as Socket | null)?.unref();
  }

  /**
   * A cell can stop its parent, which is the launcher (`kill -STOP $PPID`): every later launch and
   * every exit report would then wait until someone continued it, and the run would wedge. So while
   * anything is awaited, the launcher is sent SIGCONT. Nothing else stops it: it runs in
   * its own session, out of reach of a terminal's job control.
   */
  private continueIfStopped(): void {
    const pid = this.running?.child.pid;
    if (pid === undefined || this.running?.dead !== false) return;
    // Not read from /proc first: the kernel discards a SIGCONT to a process that runs (the launcher
    // keeps SIGCONT's default action), and one kill() costs less than the read on every launch.
    try {
      process.kill(pid, "SIGCONT");
    } catch {
      // gone meanwhile: its exit is handled by died()
    }
  }

  private answer(line: string): void {
    const [kind, a, b, step, start] = line.split(" ");
    if (kind === "S" && a !== undefined) {
      const p = this.pending.get(a);
      const pid = Number(b);
      if (p === undefined || !Number.isInteger(pid)) return;
      p.pid = pid;
      // "S token pid pgid starttime" ("- -" when the launcher could not read /proc: read here then).
      const pgid = Number(step);
      if (Number.isInteger(pgid) && start !== undefined && /^\d+$/.test(start)) p.stat = { pgid, startTime: start };
      p.exited = this.track(pid, p.groupEmpty);
      this.settle(p);
    } else if (kind === "E" && a !== undefined) {
      const p = this.pending.get(a);
      if (p === undefined) return;
      this.pending.delete(a);
      for (const c of p.conns) c?.destroy();
      p.resolve({ ok: false, error: errnoError(Number(b), failedStep(step, p)) });
      this.refresh();
    } else if (kind === "X" && a !== undefined) {
      const pid = Number(a);
      const resolve = this.exits.get(pid);
      if (resolve === undefined) return;
      this.exits.delete(pid);
      resolve(decodeWaitStatus(Number(b)), step === "1");
      this.refresh();
    }
  }

  /** A connection back from the launcher: "<token> <n>\n", then the stream itself. */
  private accept(socket: Socket): void {
    socket.on("error", () => undefined);
    if (this.unpaired >= MAX_UNPAIRED) {
      socket.destroy();
      return;
    }
    this.unpaired++;
    let counted = true;
    const paired = (): void => {
      if (counted) this.unpaired--;
      counted = false;
    };
    // Until its tag pairs it with a launch, a connection must not keep this process alive (an
    // awaited launch does, through the launcher's stdout).
    socket.unref();
    const unpaired = setTimeout(() => socket.destroy(), this.unpairedTimeoutMs);
    unpaired.unref();
    socket.once("close", () => {
      clearTimeout(unpaired);
      paired();
    });
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const nl = head.indexOf(10);
      if (nl < 0) {
        if (head.length > 64) socket.destroy();
        return;
      }
      clearTimeout(unpaired);
      paired();
      socket.off("data", onData);
      socket.pause();
      const [token, n] = head.subarray(0, nl).toString("latin1").split(" ");
      const rest = head.subarray(nl + 1);
      const p = token === undefined ? undefined : this.pending.get(token);
      const stream = Number(n);
      if (p === undefined || !(stream === 0 || stream === 1 || stream === 2) || p.conns[stream] !== null) {
        socket.destroy();
        return;
      }
      if (rest.length > 0) socket.unshift(rest);
      p.conns[stream] = socket;
      this.settle(p);
    };
    socket.on("data", onData);
  }

  /** Resolves a launch once the launcher named its pid and all three connections arrived. */
  private settle(p: Pending): void {
    const [stdin, stdout, stderr] = p.conns;
    if (p.pid === null || p.exited === null || stdin == null || stdout == null || stderr == null) return;
    this.pending.delete(p.token);
    // Paired: the gate's streams hold this process like a child's pipes do.
    for (const c of [stdin, stdout, stderr]) c.ref();
    // The gate's stdin carries, after release, its init's report of the cell's wait status; its end
    // (every holder gone) is how we know no report is coming.
    const reportedStatus = readStatusReport(stdin);
    // As Node does for a child's stdin: once the process is gone, nothing more can be written to it.
    void p.exited.then(async () => {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([reportedStatus, new Promise((r) => (timer = setTimeout(r, STATUS_WAIT_MS)))]);
      clearTimeout(timer);
      stdin.destroy();
    });
    const empty = p.groupEmpty;
    const gate: GateProcess = { pid: p.pid, stdin, stdout, stderr, exited: p.exited, groupEmptyAtExit: () => empty.value, reportedStatus };
    p.resolve({ ok: true, gate: p.stat === null ? gate : { ...gate, stat: p.stat } });
    this.refresh();
  }

  private track(pid: number, groupEmpty: { value: boolean }): Promise<GateExit> {
    return new Promise<GateExit>((resolve) =>
      this.exits.set(pid, (exit, empty) => {
        groupEmpty.value = empty;
        resolve(exit);
      }),
    );
  }

  /** The launcher is gone: fail what was not started, and follow what runs until it ends. */
  private died(running: NonNullable<NativeLauncher["running"]>, why: string): void {
    if (running.dead) return;
    running.dead = true;
    running.server.close();
    rmSync(running.dir, { recursive: true, force: true });
    if (this.running === running) this.running = null;
    for (const p of this.pending.values()) {
      for (const c of p.conns) c?.destroy();
      if (p.pid !== null) continue; // started: followed below like the others
      this.pending.delete(p.token);
      p.resolve({ ok: false, error: errnoError(osConstants.errno.ECHILD, `the cell launcher died before answering (${why})`) });
    }
    for (const p of [...this.pending.values()]) {
      // Started, but its connections never all arrived: it cannot be released; its gate reads end-of-file.
      this.pending.delete(p.token);
      p.resolve({ ok: false, error: errnoError(osConstants.errno.ECHILD, `the cell launcher died while starting the gate (${why})`) });
    }
    const lost = `the cell launcher (pid ${running.child.pid ?? "?"}) that started it ${why.replace(/^it /, "")}, so its exit status could not be read`;
    for (const [pid, resolve] of [...this.exits]) {
      this.exits.delete(pid);
      const start = readProcStat(pid)?.startTime ?? null;
      const poll = setInterval(() => {
        const now = readProcStat(pid);
        if (now === null || now.startTime !== start || now.state === "Z" || now.state === "X") {
          clearInterval(poll);
          resolve({ code: null, signal: null, lost }, false);
        }
      }, ORPHAN_POLL_MS);
    }
    this.refresh();
  }
}

/**
 * Reads what the gate's stdin connection carries back: the cell's init writes "X <status>\n" once
 * its cell has ended. Resolves with the status, or null when the connection ends without one.
 */
function readStatusReport(stdin: Socket): Promise<number | null> {
  return new Promise((resolve) => {
    let text = "";
    const done = (): void => {
      const m = /^X (-?\d+)\n/.exec(text);
      resolve(m === null ? null : Number(m[1]));
    };
    stdin.on("data", (chunk: Buffer) => {
      if (text.length < 64) text += chunk.toString("latin1");
    });
    stdin.once("end", done);
    stdin.once("close", done);
    stdin.resume();
  });
}

let chosen: GateLauncher | null = null;

/** The sentence a missing launcher is refused with. */
export const LAUNCHER_MISSING =
  "the cell launcher build/cairn-launcher is not built, so no cell can run: install a C compiler (Debian: apt-get install gcc libc6-dev) and run `node scripts/build-launcher.mjs` (npm ci does it)";

/**
 * The launcher this process uses, started lazily. Throws ConfigError (LAUNCHER_MISSING) when it was
 * not built.
 */
export function gateLauncher(): GateLauncher {
  if (chosen === null) {
    const path = nativeLauncherPath();
    if (path === null) throw new ConfigError(LAUNCHER_MISSING);
    chosen = new NativeLauncher(path);
  }
  return chosen;
}

/** A launcher of its own (for tests): the native one at `path`. */
export function createNativeLauncher(path: string, options: { unpairedTimeoutMs?: number } = {}): GateLauncher {
  return new NativeLauncher(path, options.unpairedTimeoutMs);
}
