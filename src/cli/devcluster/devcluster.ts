/**
 * A development etcd cluster whose three members are children of this process (tests, benchmarks,
 * the chaos drivers): `startDevCluster`, then `stop()` in `after`/`finally`. Nothing is faked: members
 * fsync, elect a leader and lose quorum as production members do; only the zones are pretend (one
 * machine). For development only.
 */
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { ConfigError } from "../../errors.js";
import { StorageUnavailable } from "../../storage/errors.js";
import {
  clientUrl,
  DEV_ZONES,
  enableAuth,
  memberArgs,
  memberStatuses,
  planMembers,
  proposesThrough,
  spawnMember,
  waitHealthy,
  type ClusterStatus,
  type DevClusterOptions,
  type DevMember,
} from "./members.js";

/** A running dev cluster whose members are children of this process. */
export interface DevCluster {
  /** Client URLs of all members, in zone order. */
  readonly endpoints: string[];
  readonly members: readonly DevMember[];
  /** Root credentials when started with `auth: true` (a random password), else null. */
  readonly root: { readonly username: string; readonly password: string } | null;
  /** Sends `signal` (default SIGKILL) to member `i` and waits for it to exit. */
  kill(i: number, signal?: NodeJS.Signals): Promise<void>;
  /** Sends `signal` to member `i` without waiting (SIGSTOP / SIGCONT freeze and thaw it: a hung machine). */
  signal(i: number, signal: NodeJS.Signals): void;
  /**
   * SIGSTOPs member `i` and resolves once every thread of it is stopped (Linux /proc). `signal` returns
   * as soon as the signal is sent, and a member can still answer a request in the moments before all
   * its threads have stopped: a test that needs silence at once waits here.
   */
  freeze(i: number, timeoutMs?: number): Promise<void>;
  /** Starts member `i` again on the same ports and data directory (it rejoins the cluster). */
  restart(i: number): Promise<void>;
  /** Health of every member; never throws. */
  status(): Promise<ClusterStatus>;
  /**
   * Whether a write proposal (a lease grant, then its revoke) commits through every running member,
   * each within 1.5 s; never throws. `status()` is not enough after a thaw: a member SIGCONTed a
   * moment ago still reports the leader it knew before it froze while an election is under way, and
   * requests sent through it wait for that election.
   */
  serving(): Promise<boolean>;
  /** Kills every member and waits for them to exit. Safe to call twice. */
  stop(): Promise<void>;
}

/** Whether every thread of `pid` is stopped (state T in /proc/PID/task/TID/stat); false when unreadable. */
function allThreadsStopped(pid: number): boolean {
  try {
    const tids = readdirSync(`/proc/${pid}/task`);
    if (tids.length === 0) return false;
    for (const tid of tids) {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
      const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
      if (state !== "T" && state !== "t") return false;
    }
    return true;
  } catch {
    return false;
  }
}

function waitExit(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/**
 * Starts three etcd members (one per zone) as children of this process and waits until the cluster
 * has a leader and every member answers. Throws StorageUnavailable (with the members' log tails) when
 * it does not become healthy in time; the members are stopped in that case.
 */
export async function startDevCluster(options: DevClusterOptions): Promise<DevCluster> {
  const binary = options.etcdBinary ?? "etcd";
  const plans = await planMembers(options.dir, options.zones ?? DEV_ZONES);
  const token = `cairn-dev-${randomBytes(6).toString("hex")}`;
  const tls = options.tls;
  const args = plans.map((p) => memberArgs(p, plans, token, tls));
  const children: (ChildProcess | null)[] = plans.map((p, i) => spawnMember(binary, p, args[i]!, false));
  const endpoints = plans.map((p) => clientUrl(p.clientPort, tls));
  let root: { username: string; password: string } | null = null;
  let stopped = false;

  const killOne = async (i: number, signal: NodeJS.Signals): Promise<void> => {
    const child = children[i];
    if (!child) return;
    children[i] = null;
    if (child.exitCode === null && child.signalCode === null) {
      child.kill(signal);
      await waitExit(child);
    }
  };
  const stop = async (): Promise<void> => {
    stopped = true;
    await Promise.all(plans.map((_, i) => killOne(i, "SIGKILL")));
  };

  try {
    await waitHealthy(endpoints, options.readyTimeoutMs ?? 30_000, plans.map((p) => p.logFile), tls);
    if (options.auth) root = await enableAuth(endpoints, tls);
  } catch (err) {
    await stop();
    throw err;
  }

  const members = (): DevMember[] =>
    plans.map((p, i) => ({
      name: p.name,
      clientUrl: endpoints[i]!,
      peerUrl: `http://127.0.0.1:${p.peerPort}`,
      dataDir: p.dataDir,
      logFile: p.logFile,
      pid: children[i]?.pid ?? null,
    }));
  const check = (i: number): void => {
    if (!Number.isInteger(i) || i < 0 || i >= plans.length) throw new ConfigError(`member index ${i} is out of range 0..${plans.length - 1}`);
  };

  return {
    endpoints,
    get members() {
      return members();
    },
    root,
    async kill(i, signal = "SIGKILL") {
      check(i);
      await killOne(i, signal);
    },
    signal(i, signal) {
      check(i);
      children[i]?.kill(signal);
    },
    async freeze(i, timeoutMs = 10_000) {
      check(i);
      const child = children[i];
      if (child?.pid === undefined || child.exitCode !== null || child.signalCode !== null) throw new ConfigError(`dev cluster member ${i} is not running; it cannot be frozen`);
      child.kill("SIGSTOP");
      const deadline = Date.now() + timeoutMs;
      while (!allThreadsStopped(child.pid)) {
        if (Date.now() > deadline) throw new StorageUnavailable(`dev cluster member ${i} (pid ${child.pid}) was sent SIGSTOP but not all its threads stopped within ${timeoutMs} ms`);
        await sleep(2);
      }
    },
    async restart(i) {
      check(i);
      if (stopped) throw new ConfigError("the dev cluster was stopped; start a new one");
      await killOne(i, "SIGKILL");
      children[i] = spawnMember(binary, plans[i]!, args[i]!, false);
    },
    status() {
      return memberStatuses(
        members().map((m, i) => ({ ...m, running: children[i] !== null && children[i]!.exitCode === null })),
        root,
        tls,
      );
    },
    async serving() {
      const running = members().filter((_, i) => children[i] !== null && children[i]!.exitCode === null && children[i]!.signalCode === null);
      const ok = await Promise.all(running.map((m) => proposesThrough(m.clientUrl, root, tls)));
      return running.length > 0 && ok.every(Boolean);
    },
    stop,
  };
}
