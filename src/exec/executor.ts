/**
 * The executor: runs one cmd or script cell in its own process group, behind a gate, inside the cell
 * boundary (sandbox.ts).
 *
 * `prepare` starts a tiny gate (the native launcher's forked child, blocked reading its stdin; see
 * launcher.ts) in a new session and process group, and returns the gate's identity (pid, pgid, start
 * time) BEFORE any of the cell's code runs. The harness commits `execution_started` with that
 * identity, then calls `release()`: the gate reads "go" and execs the cell's init (native/launcher.c,
 * `init`), inside a bubblewrap sandbox or not, keeping the same pid, process group and start time;
 * the init runs the cell. If the harness dies before releasing, the gate reads end-of-file and exits
 * 125: nothing ran.
 *
 * What a cell gets, besides its argv: an environment from an allow-list (environment.ts), never the
 * harness's own; a cgroup of its own with memory and process limits where the machine allows it,
 * else rlimits set by its init (cgroup.ts); in the sandbox, its workspace writable, the rest of the
 * root read-only, the paths the harness names hidden, no network unless asked, and a PID namespace
 * whose first process is its init, so nothing it starts outlives it.
 *
 * Stopping uses our own group signals (SIGTERM, grace, SIGKILL to the gate's group): a cell's
 * grandchildren must stop with it. No exit hook kills children when this process exits: a surviving
 * group is found and stopped by the next process with `stopSurvivor` (identity.ts), which is what
 * durability requires.
 */
import { statSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { CairnError } from "../errors.js";
import type { ProcessIdentity } from "../state/projection.js";
import { type CellLimits, DEFAULT_CELL_LIMITS, detectCgroups, formatBytes, type CellCgroup, type CellCgroups } from "./cgroup.js";
import { cellEnvironment } from "./environment.js";
import { terminateGroup } from "./group.js";
import { bootId, hostName } from "./identity.js";
import { type LaunchCell, probePythonVersion, resolveLaunch } from "./launch.js";
import type { GateLauncher } from "./gate.js";
import { decodeWaitStatus, gateLauncher, nativeLauncherPath } from "./launcher.js";
import { type OutputChunk, OutputCapture } from "./output.js";
import { liveGroupMembers, readProcStat } from "./procfs.js";
import { ensurePrivateDir } from "./private.js";
import { type CellNetwork, SANDBOX_RUN_DIR, type SandboxBind, bwrapArgv, existingPaths } from "./sandbox.js";
import { which as defaultWhich } from "./which.js";
import { describeExit, formatSeconds, spawnErrorWords } from "./words.js";

/** Where, and within what, a cell runs. */
export interface CellBoundary {
  /** The sandbox: bubblewrap at a path, or none (the harness's user's reach). */
  readonly sandbox: { readonly kind: "bwrap"; readonly bwrap: string } | { readonly kind: "none" };
  /** Inside the sandbox: no network (`off`) or the host's. Without a sandbox, always the host's. */
  readonly network: CellNetwork;
  /** Host paths the cell must not see (its harness's data and runtime dirs, other runs' workspaces, credentials). */
  readonly hide: readonly string[];
  /** The cell API socket (`cairn timer` and friends) on the host: the cell finds it in CAIRN_TIMER_SOCKET. */
  readonly socket?: string;
  /** A directory holding the `cairn` command for cells: put first on the cell's PATH. */
  readonly binDir?: string;
  /** A directory of Python modules for cells (`cairn_effects`): put first on the cell's PYTHONPATH. */
  readonly pythonDir?: string;
  /** Names of the harness's environment variables passed on to cells, besides the allow-list. */
  readonly passEnv: readonly string[];
  readonly limits: CellLimits;
}

/** No sandbox, the host's network, the default limits: what a launch without a boundary gets. */
export const UNSANDBOXED: CellBoundary = { sandbox: { kind: "none" }, network: "host", hide: [], passEnv: [], limits: DEFAULT_CELL_LIMITS };

/** One cell launch. */
export interface LaunchSpec {
  cellId: number;
  cell: LaunchCell;
  /** Working directory of the cell; must exist. */
  cwd: string;
  /** Where script files are written (e.g. `<dataDir>/scripts/<session>`); created if missing. */
  scriptDir: string;
  /** Environment of the cell besides the allow-list and the boundary's (the harness adds CAIRN_SESSION etc.). */
  env?: Record<string, string>;
  /** Sandbox, network, hidden paths, limits. Default {@link UNSANDBOXED}. */
  boundary?: CellBoundary;
  /** More files bound into the sandbox (the executor's own steps use it). */
  binds?: readonly SandboxBind[];
  /** Wall-time limit from release, in ms. */
  wallTimeMs: number;
  /** Total captured bytes (stdout + stderr); past it output is dropped, counted and marked. */
  outputLimitBytes: number;
  /** Minimum time between two `onOutput` calls, in ms. Default 100. */
  flushIntervalMs?: number;
  /** Receives output batches, awaited and never concurrently; the harness commits them. */
  onOutput: (chunks: { stream: "stdout" | "stderr"; data: string }[]) => Promise<void>;
}

/** How an execution ended. */
export interface ExecutionOutcome {
  result: "success" | "error" | "cancelled";
  exit_code: number | null;
  signal: string | null;
  duration_ms: number;
  output_bytes: number;
  dropped_bytes: number;
  detail: string | null;
}

/** A gated launch: the process exists, stopped at the gate, with its identity known. */
export interface GatedLaunch {
  kind: "gated";
  /** The gate's identity; `exec` keeps pid, pgid and start time, so it is the cell's identity too. */
  identity: ProcessIdentity;
  /** Lets the cell's code run. Call once, after `execution_started` is committed. Throws if aborted or stopped. */
  release(): void;
  /** Before release: kills the gate (nothing ran) and resolves once its group is gone. After release: `stop("cancelled")`. */
  abort(): Promise<void>;
  /**
   * Kills the whole process group (SIGTERM, grace, SIGKILL); resolves once `done` has settled, or
   * `settleWithinMs` after the group is gone, whichever comes first (delivering the last output may
   * wait for a storage that cannot answer; the kill itself is always waited for).
   */
  stop(reason: "cancelled" | "shutdown", settleWithinMs?: number): Promise<void>;
  /**
   * The outcome, once the leader exited, leftovers of its group were stopped and all output was
   * delivered. Rejects with the error `onOutput` threw, if it threw (output after it was not delivered).
   */
  done: Promise<ExecutionOutcome>;
}

/** What `prepare` returns. */
export type Prepared = { kind: "unlaunchable"; outcome: ExecutionOutcome } | GatedLaunch;

/** Options of {@link createExecutor}. */
export interface ExecutorOptions {
  /** PATH lookup of a bare command name. Default: search `process.env.PATH`. */
  which?: (cmd: string) => string | null;
  /** Wall clock in ms, for `duration_ms`. Default `Date.now`. */
  now?: () => number;
  /** SIGTERM-to-SIGKILL grace when stopping a group (stop, wall time, leftovers). Default 2000 ms. */
  killGraceMs?: number;
  /** What starts the gate processes. Default: this process's {@link gateLauncher}. */
  launcher?: GateLauncher;
  /** Cell cgroups. Default: {@link detectCgroups} (null where they cannot be made: rlimits then). */
  cgroups?: CellCgroups | null;
}

/** The executor handed to the harness. */
export interface Executor {
  /** Resolves the cell and spawns it gated; see {@link GatedLaunch}. Throws only on programming or I/O errors. */
  prepare(spec: LaunchSpec): Promise<Prepared>;
}

/** How often a running cell's init is checked for having been stopped (see release). */
const INIT_WATCH_MS = 1000;

/** How long to wait for the output pipes to close after the whole group is gone, before giving up on them. */
const PIPE_DRAIN_MS = 2000;

const unlaunchable = (detail: string): Prepared => ({ kind: "unlaunchable", outcome: { result: "error", exit_code: null, signal: null, duration_ms: 0, output_bytes: 0, dropped_bytes: 0, detail } });

/**
 * Creates an executor. Each `prepare` is independent; the executor holds no state but a cached
 * `python3 --version`.
 */
export function createExecutor(opts: ExecutorOptions = {}): Executor {
  const whichFn = opts.which ?? ((cmd: string) => defaultWhich(cmd));
  const now = opts.now ?? Date.now;
  const killGraceMs = opts.killGraceMs ?? 2000;
  let launcher: GateLauncher | null = opts.launcher ?? null;
  const cgroups = opts.cgroups === undefined ? detectCgroups() : opts.cgroups;
  const pythonVersions = new Map<string, Promise<string | null>>();
  const pythonVersion = (python3: string): Promise<string | null> => {
    let v = pythonVersions.get(python3);
    if (v === undefined) {
      v = probePythonVersion(python3);
      pythonVersions.set(python3, v);
    }
    return v;
  };

  async function prepare(spec: LaunchSpec): Promise<Prepared> {
    if (!Number.isInteger(spec.cellId) || spec.cellId < 0) throw new CairnError("usage", `cellId must be an integer >= 0, got ${spec.cellId}`);
    if (!(spec.wallTimeMs > 0)) throw new CairnError("usage", `wallTimeMs must be > 0, got ${spec.wallTimeMs}`);
    if (!Number.isInteger(spec.outputLimitBytes) || spec.outputLimitBytes < 0) {
      throw new CairnError("usage", `outputLimitBytes must be an integer >= 0, got ${spec.outputLimitBytes}`);
    }
    let cwdOk = false;
    try {
      cwdOk = statSync(spec.cwd).isDirectory();
    } catch (_err) {
      cwdOk = false;
    }
    if (!cwdOk) return unlaunchable(`working directory does not exist or is not a directory: ${spec.cwd}`);

    const resolved = await resolveLaunch(spec.cell, { cellId: spec.cellId, cwd: spec.cwd, scriptDir: spec.scriptDir }, { which: whichFn, pythonVersion });
    if (!resolved.ok) return unlaunchable(resolved.detail);
    launcher ??= gateLauncher();
    const boundary = spec.boundary ?? UNSANDBOXED;
    const init = nativeLauncherPath();
    if (init === null) throw new CairnError("config", "the cell launcher build/cairn-launcher is not built");
    const sandboxed = boundary.sandbox.kind === "bwrap";
    // Limits: the cell's own cgroup where one can be made, else rlimits its init sets.
    let group: CellCgroup | null = null;
    try {
      group = cgroups?.create(boundary.limits) ?? null;
    } catch (err) {
      return unlaunchable(`the cell's cgroup could not be created (${(err as Error).message.slice(0, 200)})`);
    }
    const initArgs = group !== null ? [] : ["--nproc", String(boundary.limits.processes), "--data", String(boundary.limits.memoryBytes)];
    const socketInside = `${SANDBOX_RUN_DIR}/cairn.sock`;
    const binInside = `${SANDBOX_RUN_DIR}/bin`;
    const pythonInside = `${SANDBOX_RUN_DIR}/python`;
    const fixed: Record<string, string> = { ...resolved.env, ...spec.env };
    const binds: SandboxBind[] = [...(spec.binds ?? [])];
    let argv = resolved.argv;
    const script = resolved.script;
    const scriptInside = script === undefined ? null : `${SANDBOX_RUN_DIR}/${basename(script.path)}`;
    if (sandboxed && script !== undefined && scriptInside !== null) {
      binds.push({ src: script.path, dest: scriptInside });
      argv = argv.map((a) => (a === script.path ? scriptInside : a));
    }
    // A script's declared dependencies, when its cells have no network: installed after release by
    // `uv sync --script` in a sandbox of its own that has the network but sees neither the workspace
    // nor anything else the cell's does not; the script then runs offline from the same cache.
    let depsStep: LaunchSpec | null = null;
    if (sandboxed && boundary.network === "off" && script !== undefined && scriptInside !== null && script.deps.length > 0 && argv[1] === "run") {
      const cache = join(spec.scriptDir, "uv-cache");
      ensurePrivateDir(cache);
      const cacheInside = `${SANDBOX_RUN_DIR}/uv-cache`;
      const cacheBind = { src: cache, dest: cacheInside, writable: true };
      binds.push(cacheBind);
      fixed.UV_CACHE_DIR = cacheInside;
      fixed.UV_OFFLINE = "1";
      depsStep = {
        cellId: spec.cellId,
        cell: { kind: "cmd", argv: [argv[0]!, "sync", "--script", scriptInside] },
        cwd: cache,
        scriptDir: spec.scriptDir,
        env: { UV_CACHE_DIR: cacheInside },
        boundary: { sandbox: boundary.sandbox, network: "host", hide: [...boundary.hide, resolve(spec.cwd)], passEnv: boundary.passEnv, limits: boundary.limits },
        binds: [{ src: script.path, dest: scriptInside }, cacheBind],
        wallTimeMs: spec.wallTimeMs,
        outputLimitBytes: 64 * 1024,
        flushIntervalMs: 100,
        onOutput: async () => undefined,
      };
    }
    if (boundary.socket !== undefined) fixed.CAIRN_TIMER_SOCKET = sandboxed ? socketInside : boundary.socket;
    if (sandboxed) {
      fixed.HOME = "/tmp";
      fixed.TMPDIR = "/tmp";
    } else if (process.env.HOME !== undefined) fixed.HOME = process.env.HOME;
    const env = cellEnvironment(process.env, boundary.passEnv, fixed);
    if (boundary.binDir !== undefined) env.PATH = `${sandboxed ? binInside : boundary.binDir}:${env.PATH}`;
    if (boundary.pythonDir !== undefined) {
      const dir = sandboxed ? pythonInside : boundary.pythonDir;
      env.PYTHONPATH = env.PYTHONPATH ? `${dir}:${env.PYTHONPATH}` : dir;
    }
    if (sandboxed) {
      if (boundary.socket !== undefined) binds.push({ src: boundary.socket, dest: socketInside, writable: true });
      if (boundary.binDir !== undefined) binds.push({ src: boundary.binDir, dest: binInside });
      if (boundary.pythonDir !== undefined) binds.push({ src: boundary.pythonDir, dest: pythonInside });
      argv = bwrapArgv({
        bwrap: boundary.sandbox.bwrap,
        init,
        cwd: resolve(spec.cwd),
        network: boundary.network,
        hide: existingPaths(boundary.hide),
        binds,
        tmpBytes: boundary.limits.memoryBytes,
        initArgs,
        argv,
      });
    } else {
      argv = [init, "init", ...initArgs, "--", ...argv];
    }

    const capture = new OutputCapture({
      limitBytes: spec.outputLimitBytes,
      flushIntervalMs: spec.flushIntervalMs ?? 100,
      onOutput: spec.onOutput as (chunks: OutputChunk[]) => Promise<void>,
    });
    // An argv the kernel or Node refuses (a NUL byte, an argument over MAX_ARG_STRLEN, a command line
    // over ARG_MAX) must end as an execution that could not start, never as a launch that hangs.
    const started = await launcher.start({ argv, cwd: spec.cwd, env });
    if (!started.ok) {
      await group?.close();
      return unlaunchable(`the process could not be started: ${spawnErrorWords(started.error)}`);
    }
    const child = started.gate;
    if (group !== null) {
      try {
        // Before release: everything the cell starts is born inside its group.
        group.add(child.pid);
      } catch (err) {
        await terminateGroup(child.pid, { graceMs: 0 });
        await group.close();
        return unlaunchable(`the cell could not be put in its cgroup (${(err as Error).message.slice(0, 200)})`);
      }
    }
    child.stdin.on("error", () => undefined);
    const pid = child.pid;
    // The native launcher read the gate's identity right after its setsid; Node's spawn did not.
    const stat = child.stat ?? readProcStat(pid);
    if (stat === null || stat.pgid !== pid) {
      await terminateGroup(pid, { graceMs: 0 });
      throw new CairnError("internal", `the launch gate (pid ${pid}) is not the leader of its own process group or vanished before release`);
    }
    const identity: ProcessIdentity = { host: hostName(), boot_id: bootId(), pid, pgid: pid, start_time: stat.startTime };

    type Phase = "gated" | "released" | "aborted" | "exited";
    let phase: Phase = "gated";
    let releasedAt: number | null = null;
    let stopReason: "cancelled" | "shutdown" | "abort" | null = null;
    let timedOut = false;
    let wallTimer: NodeJS.Timeout | null = null;
    /** The dependencies step while it runs, and why it failed (the script then never ran). */
    let depsLaunch: GatedLaunch | null = null;
    let depsFailure: string | null = null;
    let initWatch: NodeJS.Timeout | null = null;
    let killing: Promise<unknown> | null = null;
    const killGroup = (graceMs: number): Promise<unknown> => {
      killing ??= terminateGroup(pid, { graceMs });
      return killing;
    };

    const streamsClosed = Promise.all(
      (["stdout", "stderr"] as const).map((name) => {
        const stream = child[name];
        stream.on("data", (data: Buffer) => capture.push(name, data));
        // The native launcher hands the streams over paused (after reading its tag off them).
        stream.resume();
        return new Promise<void>((resolve) => {
          stream.once("close", () => resolve());
          stream.once("error", () => resolve());
        });
      }),
    );
    const done = (async (): Promise<ExecutionOutcome> => {
      const leader = await child.exited;
      // The cell's own status, as its init reported it; the leader's when none came (never released).
      const reported = await child.reportedStatus;
      const { code, signal } = reported === null ? leader : decodeWaitStatus(reported);
      const lost = leader.lost;
      const endedAt = now();
      const wasReleased = releasedAt !== null;
      phase = "exited";
      if (wallTimer !== null) clearTimeout(wallTimer);
      if (initWatch !== null) clearInterval(initWatch);
      // The leader is gone; the cell's group must not outlive it (background children it left behind).
      let leftovers = "";
      if (killing !== null) await killing;
      // The native launcher asked right after the reap; when it found the group empty, no process
      // can have joined it since (only a member can add one), and a later look could only find a new
      // group that reused the pid's number.
      const left = child.groupEmptyAtExit?.() === true ? [] : liveGroupMembers(pid);
      if (left.length > 0) {
        const stopped = await terminateGroup(pid, { graceMs: killGraceMs });
        leftovers = stopped.empty
          ? `; ${left.length} process(es) it left running in its process group were stopped`
          : `; processes ${stopped.remaining.join(", ")} of its process group could not be stopped`;
      }
      // Pipes close once every holder is gone; a process that left the group could keep them open.
      let drainTimer: NodeJS.Timeout | null = null;
      const drained = await Promise.race([
        streamsClosed.then(() => true),
        new Promise<boolean>((resolve) => {
          drainTimer = setTimeout(() => resolve(false), PIPE_DRAIN_MS);
        }),
      ]);
      if (drainTimer !== null) clearTimeout(drainTimer);
      if (!drained) {
        child.stdout.destroy();
        child.stderr.destroy();
        leftovers += "; output after the process group ended was not captured (a process outside the group kept the pipes open)";
      }
      const duration = releasedAt === null ? 0 : Math.max(0, endedAt - releasedAt);
      const limited = group?.report() ?? { oomKills: 0, pidsRefused: 0 };
      await group?.close();
      const limitHit =
        limited.oomKills > 0
          ? `killed: memory limit ${formatBytes(boundary.limits.memoryBytes)} (${limited.oomKills} process(es) killed by the kernel)`
          : limited.pidsRefused > 0
            ? `process limit ${boundary.limits.processes} reached (${limited.pidsRefused} fork(s) refused)`
            : null;
      if (limitHit !== null) leftovers += `; ${limitHit}`;
      await capture.finish();
      const base = { exit_code: code, signal, duration_ms: duration, output_bytes: capture.outputBytes, dropped_bytes: capture.droppedBytes };
      if (!wasReleased) {
        const why =
          stopReason === "abort"
            ? "aborted before release"
            : stopReason === "shutdown"
              ? "stopped before release by harness shutdown"
              : stopReason === "cancelled"
                ? "cancelled before release"
                : `the launch gate ended before release (${describeExit(code, signal)})`;
        return { ...base, result: stopReason === null ? "error" : "cancelled", detail: `${why}; the cell's code never ran` };
      }
      if (depsFailure !== null) return { ...base, result: "error", detail: depsFailure };
      if (stopReason === "cancelled" || stopReason === "abort") return { ...base, result: "cancelled", detail: `cancelled${leftovers}` };
      if (lost !== undefined) return { ...base, result: "error", detail: `the exit status is unknown: ${lost}${leftovers}` };
      if (stopReason === "shutdown") return { ...base, result: "cancelled", detail: `stopped by harness shutdown${leftovers}` };
      if (timedOut) return { ...base, result: "error", detail: `killed: wall-time limit of ${formatSeconds(spec.wallTimeMs)} s reached${leftovers}` };
      if (limited.oomKills > 0 && limitHit !== null) return { ...base, result: "error", detail: `${limitHit}; ${describeExit(code, signal)}${leftovers.replace(`; ${limitHit}`, "")}` };
      if (code === 0 && signal === null) return { ...base, result: "success", detail: leftovers === "" ? null : leftovers.slice(2) };
      return { ...base, result: "error", detail: `${describeExit(code, signal)}${leftovers}` };
    })();
    // `done` is also awaited inside stop()/abort(); keep an unobserved rejection from crashing the process.
    done.catch(() => undefined);

    /** The dependencies step (see depsStep), then "go"; or, when it failed or the cell was stopped meanwhile, end of file: the gate runs nothing. */
    const installThenGo = async (step: LaunchSpec): Promise<void> => {
      let tail = "";
      let why = "";
      let ok = false;
      try {
        const p = await prepare({ ...step, onOutput: async (chunks) => void (tail = (tail + chunks.map((c) => c.data).join("")).slice(-2000)) });
        if (p.kind === "unlaunchable") why = p.outcome.detail ?? "it could not start";
        else if (phase !== "released" || stopReason !== null || timedOut) await p.abort();
        else {
          depsLaunch = p;
          p.release();
          const o = await p.done;
          ok = o.result === "success";
          why = o.detail ?? `exit ${o.exit_code}`;
        }
      } catch (err) {
        why = err instanceof Error ? err.message : String(err);
      }
      depsLaunch = null;
      if (ok && phase === "released" && stopReason === null && !timedOut) {
        child.stdin.end("go\n");
        return;
      }
      if (!ok && stopReason === null && !timedOut) depsFailure = `the script's dependencies could not be installed (uv sync --script: ${why})${tail.trim() === "" ? "" : `: ${tail.trim().slice(-1500)}`}; the script did not run`;
      child.stdin.end();
    };

    const settled = (): Promise<void> => done.then(
      () => undefined,
      () => undefined,
    );

    const handle: GatedLaunch = {
      kind: "gated",
      identity,
      done,
      release(): void {
        if (phase !== "gated") {
          throw new CairnError("usage", `cannot release cell ${spec.cellId}: it was already ${phase === "released" ? "released" : phase}`);
        }
        phase = "released";
        releasedAt = now();
        capture.start();
        wallTimer = setTimeout(() => {
          if (phase !== "released") return;
          timedOut = true;
          void killGroup(killGraceMs);
          void depsLaunch?.stop("cancelled");
        }, spec.wallTimeMs);
        // Without a sandbox a cell can stop its init (`kill -STOP $PPID`), which would then never
        // report its end: while the cell runs, a stopped init is continued (in a sandbox the init is
        // the namespace's first process, which the cell cannot stop).
        initWatch = setInterval(() => {
          if (readProcStat(pid)?.state !== "T") return;
          try {
            process.kill(pid, "SIGCONT");
          } catch {
            // gone meanwhile
          }
        }, INIT_WATCH_MS);
        initWatch.unref();
        if (depsStep === null) child.stdin.end("go\n");
        else void installThenGo(depsStep);
      },
      async abort(): Promise<void> {
        if (phase === "gated") {
          phase = "aborted";
          stopReason = "abort";
          await killGroup(0);
          await settled();
          return;
        }
        if (phase === "released") return handle.stop("cancelled");
        await settled();
      },
      async stop(reason: "cancelled" | "shutdown", settleWithinMs = Infinity): Promise<void> {
        if (phase === "gated") {
          phase = "aborted";
          stopReason = reason;
          await killGroup(0);
        } else if (phase === "released") {
          if (!timedOut) stopReason ??= reason;
          await Promise.all([killGroup(killGraceMs), depsLaunch?.stop(reason)]);
        }
        if (settleWithinMs === Infinity) return settled();
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([settled(), new Promise<void>((resolve) => (timer = setTimeout(resolve, settleWithinMs)))]);
        clearTimeout(timer);
      },
    };
    return handle;
  }

  return { prepare };
}
