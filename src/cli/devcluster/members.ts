/**
 * The members of a development etcd cluster: three real `etcd` processes on 127.0.0.1, one per
 * pretend zone, each with its own data directory and free ports. What the two ways of running one
 * share (planning ports and arguments, spawning, health, auth); see devcluster.ts (members as
 * children of this process: tests, benchmarks, the chaos drivers) and detached.ts (`cairn cluster`).
 * For development only: production clusters are deployed as deploy/etcd describes.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Etcd3, type IOptions } from "etcd3";
import { ConfigError } from "../../errors.js";
import { StorageUnavailable } from "../../storage/errors.js";

/** Default zones (and member names) of a dev cluster. */
export const DEV_ZONES = ["zone-a", "zone-b", "zone-c"] as const;

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

export interface MemberPlan {
  name: string;
  clientPort: number;
  peerPort: number;
  dataDir: string;
  logFile: string;
}

/** True when `port` on 127.0.0.1 can be listened on now. */
export function canListen(port: number): Promise<boolean> {
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

export function clientUrl(port: number, tls: DevClusterTls | undefined): string {
  return `${tls ? "https" : "http"}://127.0.0.1:${port}`;
}

export function memberArgs(plan: MemberPlan, all: readonly MemberPlan[], token: string, tls?: DevClusterTls): string[] {
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

export function spawnMember(binary: string, plan: MemberPlan, args: readonly string[], detached: boolean): ChildProcess {
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

export async function planMembers(dir: string, zones: readonly string[]): Promise<MemberPlan[]> {
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

export async function memberStatuses(
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
export async function proposesThrough(url: string, auth: { username: string; password: string } | null, tls?: DevClusterTls): Promise<boolean> {
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

export async function waitHealthy(
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

export async function enableAuth(endpoints: readonly string[], tls?: DevClusterTls): Promise<{ username: string; password: string }> {
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
