/**
 * Options of the replicated adapter: one zod schema, parsed once, with environment fallbacks for the
 * connection settings (so secrets need not appear on a command line).
 */
import { z } from "zod";
import { ConfigError } from "../../src/errors.js";
import type { FaultHook } from "../../src/storage/contract.js";

/** A pino-compatible logger (object first, then message). */
export interface ReplicatedLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

const Url = z.string().regex(/^https?:\/\/[^\s,]+$/, "an endpoint is http(s)://host:port");

const OptionsSchema = z.strictObject({
  endpoints: z.array(Url).min(1, "give at least one etcd endpoint"),
  dataDir: z.string().min(1),
  username: z.string().min(1).optional(),
  password: z.string().min(1).optional(),
  tls: z.strictObject({ ca: z.string().min(1), cert: z.string().min(1).optional(), key: z.string().min(1).optional() }).optional(),
  zones: z.record(z.string(), z.string().min(1)).optional(),
  allowSmallCluster: z.boolean().default(false),
  onOutage: z.enum(["wait", "reject"]).default("wait"),
  backlogLimit: z.number().int().positive().default(1000),
  commitTimeoutMs: z.number().int().min(100).default(5000),
  groupDelayMs: z.number().int().min(0).max(100, "must be at most 100 (ms): every commit of a busy process may wait that long").default(2),
  attemptTimeoutMs: z.number().int().min(50).default(1500),
  outageTimeoutMs: z.number().int().nonnegative().default(10_000),
  livenessMs: z.number().int().min(2000).default(3000),
  healthIntervalMs: z.number().int().min(100).default(1000),
  leaseMs: z.number().int().min(1000).default(10_000),
  logger: z.custom<ReplicatedLogger>((v) => typeof v === "object" && v !== null && ["info", "warn", "error"].every((k) => typeof (v as Record<string, unknown>)[k] === "function"), {
    message: "logger must have info, warn and error methods (pino-compatible)",
  }).optional(),
  faults: z.custom<FaultHook>((v) => typeof v === "function", { message: "faults must be a function" }).optional(),
});

/**
 * What `createReplicatedStorage` accepts. `endpoints`, `username`, `password` and `tls` fall back to
 * CAIRN_ETCD_ENDPOINTS (comma-separated), CAIRN_ETCD_USER, CAIRN_ETCD_PASSWORD and
 * CAIRN_ETCD_CA / CAIRN_ETCD_CERT / CAIRN_ETCD_KEY.
 */
export interface ReplicatedOptions {
  /** etcd client URLs (default: CAIRN_ETCD_ENDPOINTS). */
  readonly endpoints?: readonly string[];
  /** Directory of the local SQLite copies, one file per database. */
  readonly dataDir: string;
  readonly username?: string;
  readonly password?: string;
  /** File paths of the CA, and of the client certificate and key for mutual TLS. */
  readonly tls?: { readonly ca: string; readonly cert?: string; readonly key?: string };
  /** Member name -> zone. Default: a member's name is its zone. */
  readonly zones?: Readonly<Record<string, string>>;
  /** Development only: accept fewer than three voting members (default false). */
  readonly allowSmallCluster?: boolean;
  /**
   * While the quorum is lost, commits wait (default), or ("reject") are refused once the quorum has
   * been lost for longer than `outageTimeoutMs`, or once `backlogLimit` commits wait.
   */
  readonly onOutage?: "wait" | "reject";
  /** onOutage "reject": how long the quorum may be lost before commits are refused, in ms (default 10000). */
  readonly outageTimeoutMs?: number;
  /** Commits that may wait for the quorum before new ones are refused (onOutage "reject"; default 1000). */
  readonly backlogLimit?: number;
  /** Deadline of each etcd request in ms (default 5000). A commit outliving it is resolved by reading back. */
  readonly commitTimeoutMs?: number;
  /**
   * Group commit (default 2 ms; 0 turns it off; at most 100): when the last etcd transaction carried
   * more than one commit and fewer than 16 (several sessions of this process commit at once), the next
   * one waits up to this long for more commits to join it, and goes as soon as as many are queued as
   * the recent transactions carried. Fewer, larger transactions: with 8 sessions about 0.7 instead of
   * 1.1 transactions per round, and a third less CPU in etcd's members (README, "Group commit waits
   * for company"). A lone committer never waits: after a transaction of one commit the next is sent
   * at once.
   */
  readonly groupDelayMs?: number;
  /**
   * Deadline of one attempt of a request on one member, in ms (default 1500): past it, the request is
   * tried on the next member (a silent member costs at most this, once; then it is tried last).
   */
  readonly attemptTimeoutMs?: number;
  /**
   * Length of the owner's liveness lease (an etcd lease) in ms (default 3000; etcd grants whole seconds, at least 2).
   * An owner that cannot renew it stops its cells and stops acting before it can have expired; a new
   * owner launches nothing until the previous owner's lease is gone. Liveness only: fencing is by epoch.
   */
  readonly livenessMs?: number;
  /** How often members' health is polled for stats(), in ms (default 1000). */
  readonly healthIntervalMs?: number;
  /** Length of an owner lease (lease.ts) in ms, rounded up to whole seconds (default 10000). */
  readonly leaseMs?: number;
  readonly logger?: ReplicatedLogger;
  readonly faults?: FaultHook;
}

export type ResolvedOptions = z.infer<typeof OptionsSchema>;

/**
 * Merges the environment into `options` and validates. Throws ConfigError naming the option (and the
 * environment variable it may come from). Never echoes a password.
 */
export function resolveOptions(options: ReplicatedOptions, env: NodeJS.ProcessEnv = process.env): Readonly<ResolvedOptions> {
  const fromEnv = (key: string): string | undefined => {
    const v = env[key];
    return v === undefined || v === "" ? undefined : v;
  };
  const envEndpoints = fromEnv("CAIRN_ETCD_ENDPOINTS")?.split(",").map((s) => s.trim()).filter(Boolean);
  const ca = options.tls?.ca ?? fromEnv("CAIRN_ETCD_CA");
  const tls = ca ? { ca, cert: options.tls?.cert ?? fromEnv("CAIRN_ETCD_CERT"), key: options.tls?.key ?? fromEnv("CAIRN_ETCD_KEY") } : undefined;
  const raw = {
    ...options,
    endpoints: options.endpoints ? [...options.endpoints] : envEndpoints,
    username: options.username ?? fromEnv("CAIRN_ETCD_USER"),
    password: options.password ?? fromEnv("CAIRN_ETCD_PASSWORD"),
    tls,
  };
  for (const k of Object.keys(raw) as (keyof typeof raw)[]) if (raw[k] === undefined) delete raw[k];
  const parsed = OptionsSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const path = issue.path.join(".") || "(options)";
    const hint: Record<string, string> = {
      endpoints: " (or set CAIRN_ETCD_ENDPOINTS, comma-separated)",
      username: " (or CAIRN_ETCD_USER)",
      password: " (or CAIRN_ETCD_PASSWORD)",
      tls: " (or CAIRN_ETCD_CA / CAIRN_ETCD_CERT / CAIRN_ETCD_KEY)",
    };
    const what = issue.code === "invalid_type" && issue.input === undefined ? "is required" : issue.message;
    throw new ConfigError(`replicated storage option "${path}" ${what}${hint[String(issue.path[0])] ?? ""}`);
  }
  const o = parsed.data;
  if ((o.username === undefined) !== (o.password === undefined)) {
    throw new ConfigError('replicated storage options "username" and "password" go together (CAIRN_ETCD_USER / CAIRN_ETCD_PASSWORD): give both or neither');
  }
  if (o.tls && (o.tls.cert === undefined) !== (o.tls.key === undefined)) {
    throw new ConfigError('replicated storage option "tls": "cert" and "key" go together (CAIRN_ETCD_CERT / CAIRN_ETCD_KEY)');
  }
  return Object.freeze(o);
}
