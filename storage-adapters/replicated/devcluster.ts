/**
 * A real three-member etcd cluster on 127.0.0.1 for development, tests and benchmarks.
 *
 * Each member is an `etcd` child process named after its zone, with its own data directory under
 * `dir`, on free ports (picked below the kernel's ephemeral range; see `freePorts`). Nothing is
 * faked: members fsync, elect a leader and lose quorum like production members do; only the zones
 * are pretend (one machine).
 *
 * Two ways to use it:
 * - `startDevCluster(...)` (tests, benchmarks): the members are children of this process; call
 *   `stop()` in `after`/`finally`.
 * - `clusterUp` / `clusterDown` / `clusterStatus` (the `cairn cluster up|down|status` CLI): members are
 *   detached, and a JSON state file in `dir` records their pids and endpoints.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Etcd3, type IOptions } from "etcd3";
import { z } from "zod";
import { ConfigError } from "../../src/errors.js";
import { StorageUnavailable } from "../../src/storage/errors.js";

/** Default zones (and member names) of a dev cluster. */
export const DEV_ZONES = ["zone-a", "zone-b", "zone-c"] as const;
/** The state file `clusterUp` writes in its directory. */
export const CLUSTER_STATE_FILE = "cairn-cluster.json";

export interface DevClusterOptions {
  /** A directory for the members' data and logs (created if missing). */
  readonly dir: string;
  /** Member names, one member per zone (default `DEV_ZONES`). */
  readonly zones?: readonly string[];
  /** Create a `root` user and enable etcd authentication (default false). */
  readonly auth?: boolean;
  /** The etcd binary (default `etcd` on PATH). */
  readonly etcdBinary?: string;
  /** How long to wait for a healthy cluster, in ms (default 30000). */
  readonly readyTimeoutMs?: number;
  /**
   * Serve client traffic over TLS (`startDevCluster` only): members listen on https client URLs with
   * these files. Peers stay on plain http (one machine). Nothing is generated here.
   */
  readonly tls?: DevClusterTls;
}

/** PEM file paths of a TLS dev cluster. */
export interface DevClusterTls {
  /** CA that signed the member certificate, and (with `clientCertAuth`) the clients' certificates. */
  readonly ca: string;
  /**
   * The members' certificate and key: valid for 127.0.0.1, with both serverAuth and clientAuth usages
   * (etcd dials itself with it, and the dev cluster's own health checks present it as their client
   * certificate).
   */
  readonly cert: string;
  readonly key: string;
  /** Require a client certificate signed by `ca` (`--client-cert-auth`; default true). */
  readonly clientCertAuth?: boolean;
}

export interface DevMember {
  readonly name: string;
  readonly clientUrl: string;
  readonly peerUrl: string;
  readonly dataDir: string;
  readonly logFile: string;
  /** The current process id (changes on restart); null while the member is stopped. */
  readonly pid: number | null;
}

/** One member's health as `status()` sees it. */
export interface MemberStatus {
  readonly name: string;
  readonly clientUrl: string;
  readonly pid: number | null;
  readonly running: boolean;
  readonly reachable: boolean;
  /** The leader id this member believes in ("0" when it has none); null when unreachable. */
  readonly leader: string | null;
  readonly isLeader: boolean;
  readonly raftTerm: string | null;
  readonly dbSizeBytes: number | null;
}

export interface ClusterStatus {
  readonly members: readonly MemberStatus[];
  readonly reachable: number;
  /** A majority answers and agrees there is a leader. */
  readonly quorumHeld: boolean;
}

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

interface MemberPlan {
  name: string;
  clientPort: number;
  peerPort: number;
  dataDir: string;
  logFile: string;
}

/** True when `port` on 127.0.0.1 can be listened on now. */
function canListen(port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

/** The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`), or Linux's default when unreadable. */
export function ephemeralPortRange(): [number, number] {
  try {
    const [low, high] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/).map(Number);
    if (Number.isInteger(low) && Number.isInteger(high) && low! > 0 && high! >= low!) return [low!, high!];
  } catch {
    // not Linux, or no /proc: assume the default range
  }
  return [32768, 60999];
}

/** The lowest port a dev cluster picks from: above the well-known and most registered service ports. */
const DEV_PORT_FLOOR = 12_000;

/**
 * Finds `count` distinct free TCP ports on 127.0.0.1 for dev-cluster members.
 *
 * They are picked at random *below* the kernel's ephemeral range, and checked by listening on them.
 * A port from the ephemeral range (binding port 0) may be taken, between `cluster down` and `cluster
 * up`, as the source port of any outgoing connection on the machine; the recorded member could then
 * not start again. Ports below the range are never handed out by the kernel, so only another
 * listener can take them. When the range leaves too little room below it, ports come from binding 0.
 */
async function freePorts(count: number): Promise<number[]> {
  const [low] = ephemeralPortRange();
  const ports = new Set<number>();
  if (low - DEV_PORT_FLOOR >= 1000) {
    for (let tries = 0; ports.size < count && tries < 200; tries++) {
      const port = DEV_PORT_FLOOR + Math.floor(Math.random() * (low - DEV_PORT_FLOOR));
      if (!ports.has(port) && (await canListen(port))) ports.add(port);
    }
  }
  while (ports.size < count) {
    const server = createServer();
    const port = await new Promise<number>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => {
        const address = server.address();
        server.close(() => (address === null || typeof address === "string" ? reject(new Error("no port")) : resolve(address.port)));
      });
    });
    ports.add(port);
  }
  return [...ports];
}

function clientUrl(port: number, tls: DevClusterTls | undefined): string {
  return `${tls ? "https" : "http"}://127.0.0.1:${port}`;
}

function memberArgs(plan: MemberPlan, all: readonly MemberPlan[], token: string, tls?: DevClusterTls): string[] {
  const peer = (p: MemberPlan) => `http://127.0.0.1:${p.peerPort}`;
  const client = clientUrl(plan.clientPort, tls);
  const tlsArgs = tls
    ? ["--cert-file", tls.cert, "--key-file", tls.key, "--trusted-ca-file", tls.ca, ...(tls.clientCertAuth === false ? [] : ["--client-cert-auth"])]
    : [];
  return [
    ...tlsArgs,
    "--name", plan.name,
    "--data-dir", plan.dataDir,
    "--listen-client-urls", client,
    "--advertise-client-urls", client,
    "--listen-peer-urls", peer(plan),
    "--initial-advertise-peer-urls", peer(plan),
    "--initial-cluster", all.map((p) => `${p.name}=${peer(p)}`).join(","),
    "--initial-cluster-token", token,
    "--initial-cluster-state", "new",
    "--logger", "zap",
    "--log-level", "warn",
  ];
}

function spawnMember(binary: string, plan: MemberPlan, args: readonly string[], detached: boolean): ChildProcess {
  const fd = openSync(plan.logFile, "a");
  try {
    const child = spawn(binary, args, { stdio: ["ignore", fd, fd], detached });
    if (detached) child.unref();
    return child;
  } finally {
    closeSync(fd);
  }
}

function validateZones(zones: readonly string[]): void {
  if (zones.length !== 3 || new Set(zones).size !== 3 || zones.some((z) => !/^[a-z0-9][a-z0-9-]{0,62}$/.test(z))) {
    throw new ConfigError(`dev cluster zones must be three distinct names of lowercase letters, digits and dashes; got ${JSON.stringify(zones)}`);
  }
}

async function planMembers(dir: string, zones: readonly string[]): Promise<MemberPlan[]> {
  validateZones(zones);
  mkdirSync(dir, { recursive: true });
  const ports = await freePorts(zones.length * 2);
  return zones.map((name, i) => ({
    name,
    clientPort: ports[2 * i]!,
    peerPort: ports[2 * i + 1]!,
    dataDir: join(dir, `${name}.etcd`),
    logFile: join(dir, `${name}.log`),
  }));
}

/** The etcd3 client credentials the dev cluster's own clients use (the member certificate as client certificate). */
function clientCredentials(tls: DevClusterTls | undefined): Pick<IOptions, "credentials"> {
  if (!tls) return {};
  return { credentials: { rootCertificate: readFileSync(tls.ca), certChain: readFileSync(tls.cert), privateKey: readFileSync(tls.key) } };
}

function statusClient(url: string, auth: { username: string; password: string } | null, tls?: DevClusterTls): Etcd3 {
  return new Etcd3({
    ...clientCredentials(tls),
    hosts: [url],
    ...(auth ? { auth: { username: auth.username, password: auth.password } } : {}),
    defaultCallOptions: () => ({ deadline: Date.now() + 1500 }),
    dialTimeout: 1500,
  });
}

async function memberStatuses(
  members: readonly { name: string; clientUrl: string; pid: number | null; running: boolean }[],
  auth: { username: string; password: string } | null,
  tls?: DevClusterTls,
): Promise<ClusterStatus> {
  const results = await Promise.all(
    members.map(async (m): Promise<MemberStatus> => {
      const base = { name: m.name, clientUrl: m.clientUrl, pid: m.pid, running: m.running };
      if (!m.running) return { ...base, reachable: false, leader: null, isLeader: false, raftTerm: null, dbSizeBytes: null };
      const client = statusClient(m.clientUrl, auth, tls);
      try {
        const s = await client.maintenance.status();
        return {
          ...base,
          reachable: true,
          leader: s.leader,
          isLeader: s.leader !== "0" && s.leader === s.header.member_id,
          raftTerm: s.raftTerm,
          dbSizeBytes: Number(s.dbSize),
        };
      } catch {
        return { ...base, reachable: false, leader: null, isLeader: false, raftTerm: null, dbSizeBytes: null };
      } finally {
        client.close();
      }
    }),
  );
  const reachable = results.filter((r) => r.reachable).length;
  const withLeader = results.filter((r) => r.reachable && r.leader !== "0").length;
  return { members: results, reachable, quorumHeld: withLeader * 2 > results.length };
}

/** Whether a lease grant and its revoke (two raft proposals) commit through member `url` within 1.5 s each. */
async function proposesThrough(url: string, auth: { username: string; password: string } | null, tls?: DevClusterTls): Promise<boolean> {
  const client = statusClient(url, auth, tls);
  try {
    const lease = await client.leaseClient.leaseGrant({ TTL: 5, ID: 0 });
    await client.leaseClient.leaseRevoke({ ID: lease.ID });
    return true;
  } catch {
    return false;
  } finally {
    client.close();
  }
}

async function waitHealthy(
  endpoints: readonly string[],
  timeoutMs: number,
  logFiles: readonly string[],
  tls?: DevClusterTls,
  auth: { username: string; password: string } | null = null,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const client = new Etcd3({ ...clientCredentials(tls), hosts: [...endpoints], ...(auth ? { auth } : {}), defaultCallOptions: () => ({ deadline: Date.now() + 2000 }) });
  try {
    for (;;) {
      try {
        // A linearizable read needs a leader and a quorum; each member must also answer.
        await client.get("cairn/health").string();
        const all = await Promise.all(
          endpoints.map(async (url) => {
            const c = statusClient(url, auth, tls);
            try {
              return (await c.maintenance.status()).leader !== "0";
            } finally {
              c.close();
            }
          }),
        );
        if (all.every(Boolean)) return;
      } catch {
        // not ready yet
      }
      if (Date.now() > deadline) {
        const tails = logFiles.map((f) => (existsSync(f) ? readFileSync(f, "utf8").slice(-800) : "")).join("\n---\n");
        throw new StorageUnavailable(`the dev etcd cluster did not become healthy within ${timeoutMs} ms; member logs end with:\n${tails}`);
      }
      await sleep(150);
    }
  } finally {
    client.close();
  }
}

async function enableAuth(endpoints: readonly string[], tls?: DevClusterTls): Promise<{ username: string; password: string }> {
  const password = randomBytes(18).toString("base64url");
  const client = new Etcd3({ ...clientCredentials(tls), hosts: [...endpoints] });
  try {
    await client.user("root").create(password);
    await client.role("root").create().catch(() => undefined);
    await client.user("root").addRole("root");
    await client.auth.authEnable();
  } finally {
    client.close();
  }
  return { username: "root", password };
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
