/**
 * `cairn cluster up|down|status|stop|start`: a development etcd cluster whose members run detached,
 * recorded in a JSON state file in its directory (pids, endpoints; the root password with auth), so
 * that later commands find them again. For development only: production clusters are deployed as
 * deploy/etcd describes.
 */
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { z } from "zod";
import { ConfigError } from "../../errors.js";
import {
  canListen,
  DEV_ZONES,
  enableAuth,
  memberArgs,
  memberStatuses,
  planMembers,
  spawnMember,
  waitHealthy,
  type ClusterStatus,
  type DevClusterOptions,
  type MemberPlan,
} from "./members.js";

/** The state file `clusterUp` writes in its directory. */
export const CLUSTER_STATE_FILE = "cairn-cluster.json";

const ClusterState = z.strictObject({
  version: z.literal(1),
  endpoints: z.array(z.string()),
  root: z.strictObject({ username: z.string(), password: z.string() }).nullable(),
  members: z.array(
    z.strictObject({ name: z.string(), clientUrl: z.string(), peerUrl: z.string(), dataDir: z.string(), logFile: z.string(), pid: z.number().int() }),
  ),
});
export type ClusterState = z.infer<typeof ClusterState>;

function statePath(dir: string): string {
  return join(dir, CLUSTER_STATE_FILE);
}

/** Reads the state file `clusterUp` wrote in `dir`; null when there is none. Throws ConfigError when it is unreadable. */
export function readClusterState(dir: string): ClusterState | null {
  const path = statePath(dir);
  if (!existsSync(path)) return null;
  try {
    return ClusterState.parse(JSON.parse(readFileSync(path, "utf8")));
  } catch (err) {
    throw new ConfigError(`the cluster state file ${path} is not valid; remove it after checking no etcd from it still runs`, { cause: err });
  }
}

/** True when `pid` is alive and is an etcd process using `dataDir` (so we never kill a recycled pid). */
function isOurEtcd(pid: number, dataDir: string): boolean {
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    return cmdline.some((a) => a.endsWith("etcd")) && cmdline.includes(dataDir);
  } catch {
    return false;
  }
}

/**
 * `cairn cluster up`: starts a detached three-member dev cluster in `dir`, waits until it is healthy,
 * and writes `dir/cairn-cluster.json` (pids, endpoints; the root password when `auth`). Refuses when
 * the state file names members that still run. Returns the state written.
 */
export async function clusterUp(options: DevClusterOptions): Promise<ClusterState> {
  if (options.tls) throw new ConfigError("the tls dev cluster option is supported by startDevCluster only, not by `cairn cluster up`");
  const existing = readClusterState(options.dir);
  if (existing && existing.members.some((m) => isOurEtcd(m.pid, m.dataDir))) {
    throw new ConfigError(`a dev cluster already runs from ${options.dir} (endpoints ${existing.endpoints.join(",")}); run \`cairn cluster down\` first`);
  }
  const binary = options.etcdBinary ?? "etcd";
  if (existing && existing.members.every((m) => existsSync(m.dataDir))) return restartRecorded(binary, options, existing);
  const plans = await planMembers(options.dir, options.zones ?? DEV_ZONES);
  const token = `cairn-dev-${randomBytes(6).toString("hex")}`;
  const children = plans.map((p) => spawnMember(binary, p, memberArgs(p, plans, token), true));
  const endpoints = plans.map((p) => `http://127.0.0.1:${p.clientPort}`);
  const state: ClusterState = {
    version: 1,
    endpoints,
    root: null,
    members: plans.map((p, i) => ({
      name: p.name,
      clientUrl: endpoints[i]!,
      peerUrl: `http://127.0.0.1:${p.peerPort}`,
      dataDir: p.dataDir,
      logFile: p.logFile,
      pid: children[i]!.pid ?? -1,
    })),
  };
  writeFileSync(statePath(options.dir), JSON.stringify(state, null, 2), { mode: 0o600 });
  try {
    await waitHealthy(endpoints, options.readyTimeoutMs ?? 30_000, plans.map((p) => p.logFile));
    if (options.auth) {
      const root = await enableAuth(endpoints);
      const withRoot = { ...state, root };
      writeFileSync(statePath(options.dir), JSON.stringify(withRoot, null, 2), { mode: 0o600 });
      return withRoot;
    }
  } catch (err) {
    await clusterDown(options.dir);
    throw err;
  }
  return state;
}

/** The members recorded in a state file, as plans (same names, ports and data directories). */
function plansOf(state: ClusterState): MemberPlan[] {
  return state.members.map((m) => ({ name: m.name, clientPort: Number(new URL(m.clientUrl).port), peerPort: Number(new URL(m.peerUrl).port), dataDir: m.dataDir, logFile: m.logFile }));
}

function writeState(dir: string, state: ClusterState): void {
  writeFileSync(statePath(dir), JSON.stringify(state, null, 2), { mode: 0o600 });
}

/**
 * `cairn cluster up` on a directory whose cluster was stopped: the same members on the same ports and
 * data directories (their data holds the membership; the peer URLs are unchanged), so the cluster
 * comes back with its data. A recorded port now taken by another process is a ConfigError.
 */
async function restartRecorded(binary: string, options: DevClusterOptions, existing: ClusterState): Promise<ClusterState> {
  const plans = plansOf(existing);
  await checkPortsFree(plans.flatMap((p) => [p.clientPort, p.peerPort]), options.dir);
  const children = plans.map((p) => spawnMember(binary, p, memberArgs(p, plans, "unused-existing-data"), true));
  const state: ClusterState = { ...existing, members: existing.members.map((m, i) => ({ ...m, pid: children[i]!.pid ?? -1 })) };
  writeState(options.dir, state);
  try {
    await waitHealthy(state.endpoints, options.readyTimeoutMs ?? 30_000, plans.map((p) => p.logFile), undefined, existing.root);
  } catch (err) {
    await clusterDown(options.dir);
    throw err;
  }
  return state;
}

/**
 * Checks that each recorded port can be listened on again. A port that is taken is retried for up to
 * 3 s (a connection that briefly held it as its source port ends), then it is a ConfigError.
 */
async function checkPortsFree(ports: readonly number[], dir: string): Promise<void> {
  for (const port of ports) {
    let free = await canListen(port);
    for (let i = 0; !free && i < 20; i++) {
      await sleep(150);
      free = await canListen(port);
    }
    if (!free) throw new ConfigError(`port ${port} recorded for the dev cluster in ${dir} is taken by another process; stop it, or remove ${dir} to start a new cluster`);
  }
}

/** `cairn cluster stop MEMBER`: stops one member (a drill: the other two keep the quorum). Its data is kept. */
export async function clusterMemberStop(dir: string, member: string): Promise<boolean> {
  const state = readClusterState(dir);
  const m = state?.members.find((x) => x.name === member);
  if (!state || !m) throw new ConfigError(`no member "${member}" in the dev cluster of ${dir}${state ? ` (members: ${state.members.map((x) => x.name).join(", ")})` : ""}`);
  if (!isOurEtcd(m.pid, m.dataDir)) return false;
  process.kill(m.pid, "SIGTERM");
  for (let i = 0; i < 50 && isOurEtcd(m.pid, m.dataDir); i++) await sleep(100);
  if (isOurEtcd(m.pid, m.dataDir)) process.kill(m.pid, "SIGKILL");
  for (let i = 0; i < 50 && isOurEtcd(m.pid, m.dataDir); i++) await sleep(100);
  return true;
}

/** `cairn cluster start MEMBER`: starts one stopped member again on its ports and data; it rejoins. */
export async function clusterMemberStart(dir: string, member: string, etcdBinary = "etcd"): Promise<boolean> {
  const state = readClusterState(dir);
  const i = state?.members.findIndex((x) => x.name === member) ?? -1;
  if (!state || i < 0) throw new ConfigError(`no member "${member}" in the dev cluster of ${dir}${state ? ` (members: ${state.members.map((x) => x.name).join(", ")})` : ""}`);
  const m = state.members[i]!;
  if (isOurEtcd(m.pid, m.dataDir)) return false;
  const plans = plansOf(state);
  await checkPortsFree([plans[i]!.clientPort, plans[i]!.peerPort], dir);
  const child = spawnMember(etcdBinary, plans[i]!, memberArgs(plans[i]!, plans, "unused-existing-data"), true);
  writeState(dir, { ...state, members: state.members.map((x, j) => (j === i ? { ...x, pid: child.pid ?? -1 } : x)) });
  return true;
}

/**
 * `cairn cluster down`: stops the members recorded in `dir`'s state file (SIGTERM, then SIGKILL after
 * 5 s) and waits for them to exit, only after checking each pid is still an etcd using that member's
 * data directory. Returns the names of the members it stopped. Data directories are kept.
 */
export async function clusterDown(dir: string): Promise<string[]> {
  const state = readClusterState(dir);
  if (!state) return [];
  const stopped: string[] = [];
  await Promise.all(
    state.members.map(async (m) => {
      if (!isOurEtcd(m.pid, m.dataDir)) return;
      process.kill(m.pid, "SIGTERM");
      for (let i = 0; i < 50 && isOurEtcd(m.pid, m.dataDir); i++) await sleep(100);
      if (isOurEtcd(m.pid, m.dataDir)) {
        process.kill(m.pid, "SIGKILL");
        for (let i = 0; i < 50 && isOurEtcd(m.pid, m.dataDir); i++) await sleep(100);
      }
      stopped.push(m.name);
    }),
  );
  return stopped;
}

/** `cairn cluster status`: the health of the members recorded in `dir`; null when no cluster was started there. */
export async function clusterStatus(dir: string): Promise<ClusterStatus | null> {
  const state = readClusterState(dir);
  if (!state) return null;
  return memberStatuses(
    state.members.map((m) => ({ name: m.name, clientUrl: m.clientUrl, pid: m.pid, running: isOurEtcd(m.pid, m.dataDir) })),
    state.root,
  );
}
