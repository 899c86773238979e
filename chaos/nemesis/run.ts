/**
 * One nemesis run: a workload on several databases (sqlite, sqlite on a small tmpfs, replicated on a
 * real three-member etcd cluster), a scheduler loop that restarts workers per deploy/README.md's exit
 * code table, a seeded fault schedule (schedule.ts) executed against the real processes, a final
 * phase that heals everything and lets every run end, then the checker (checker.ts) over the history,
 * the final logs and the effect files. Used by nemesis.test.ts (short, fixed seeds) and main.ts (the
 * CLI, any length).
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { chmodSync, chownSync, closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, renameSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { LogEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";
import { startDevCluster, type DevCluster } from "../../src/cli/devcluster/index.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { check, report, type FinalEvent, type Floor, type Verdict } from "./checker.js";
import { firewall, firewallUnavailable, type Firewall } from "../support/firewall.js";
import { HistoryWriter, parseHistory, type HRecord } from "./history.js";
import type { Plan } from "./policy.js";
import { bundle } from "./bundle.js";
import { between, rng } from "./rng.js";
import { schedule, type Fault, type FaultKind } from "./schedule.js";
import type { WorkerConfig } from "./worker.js";

const REPO = fileURLToPath(new URL("../../", import.meta.url));

export interface NemesisOptions {
  readonly seed: number;
  /** Faults to inject over `spanMs`. */
  readonly faults: number;
  readonly spanMs: number;
  /** Runs submitted over the fault phase. */
  readonly runs: number;
  /** Hang guard of the final phase (every run must end within it once the faults stop). */
  readonly settleLimitMs?: number;
  readonly floor?: Floor;
  /** Keep the working directory (it is kept anyway when the check fails). */
  readonly keep?: boolean;
  /** Progress lines. */
  readonly log?: (line: string) => void;
  /** Use the etcd cluster (default: when `etcd` is installed). */
  readonly replicated?: boolean;
  /** Only these fault kinds, with these weights (default: every kind, see WEIGHTS). */
  readonly weights?: Partial<Record<FaultKind, number>>;
  /**
   * Run each worker in its own UTS namespace with its own host name (root and `unshare` needed), as if
   * every worker were a machine of its own: recovery then cannot check or stop an earlier owner's
   * surviving cells (they ran on "another host"), so only the lease wait keeps them from overlapping
   * a newer owner's cells. Default: every worker on this host (recovery stops survivors itself).
   */
  readonly hostPerWorker?: boolean;
  /** How long a long-running cell runs, in ms (default 1500). */
  readonly longMs?: number;
}

export interface NemesisResult {
  readonly seed: number;
  readonly root: string;
  readonly verdict: Verdict;
  readonly faultsInjected: number;
  /** Database lost (worker killed or paused) → the next opening of it, in ms. */
  readonly recoveryMs: number[];
  readonly summary: string;
  /** The report of the anomalies (empty string when none). */
  readonly failure: string;
}

interface Db {
  readonly name: string;
  readonly adapter: "sqlite" | "replicated";
  readonly dataDir: string;
  readonly submitDir: string;
  readonly effectFile: string;
  /** Run workers as this uid (replicated, so that iptables can single them out). */
  readonly user: { uid: number; gid: number } | null;
}

interface Proc {
  readonly db: string;
  readonly worker: string;
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
  stderr: string;
  /** The worker said it opened its database (faults aimed at an owner pick only these). */
  opened: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function has(cmd: string): boolean {
  try {
    execFileSync("sh", ["-c", `command -v ${cmd}`], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

function idsOf(name: string): { uid: number; gid: number } {
  return { uid: Number(execFileSync("id", ["-u", name], { encoding: "utf8" })), gid: Number(execFileSync("id", ["-g", name], { encoding: "utf8" })) };
}

const WEIGHTS: Partial<Record<FaultKind, number>> = {
  "kill-worker": 3,
  "pause-worker": 8,
  "stall-takeover": 2,
  "race-opener": 2,
  "lost-ack": 2,
  "commit-fail": 1,
  "kill-member": 3,
  "pause-member": 6,
  "kill-leader": 2,
  "pause-leader": 3,
  "kill-two-members": 1,
  "pause-two-members": 2,
  "isolate-member": 5,
  "isolate-owner": 5,
  "disk-full": 2,
};

function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}

export async function runNemesis(o: NemesisOptions): Promise<NemesisResult> {
  const log = o.log ?? (() => undefined);
  const root = mkdtempSync(join(tmpdir(), "cairn-nemesis-"));
  chmodSync(root, 0o755);
  const historyFile = join(root, "history.jsonl");
  writeFileSync(historyFile, "");
  chmodSync(historyFile, 0o666);
  const hist = new HistoryWriter(historyFile);
  const cleanups: (() => Promise<void> | void)[] = [];
  const procs = new Set<Proc>();
  let stopping = false;
  let cluster: DevCluster | null = null;
  let fw: Firewall | null = null;
  const noFirewall = firewallUnavailable();
  const useReplicated = (o.replicated ?? has("etcd")) && noFirewall === null;
  if (process.env.CI && noFirewall !== null) throw new Error(`the nemesis cannot run its network faults in CI: ${noFirewall}`);
  if (process.env.CI && !useReplicated) throw new Error("the nemesis needs etcd in CI (installed by .ci/run)");
  if (o.hostPerWorker && process.getuid?.() !== 0) throw new Error("the nemesis needs root for --host-per-worker (each worker gets its own UTS namespace); run it as root or without that flag");
  log(`nemesis: seed ${o.seed}, ${o.faults} faults over ${o.spanMs} ms, ${o.runs} runs${o.hostPerWorker ? ", a host name per worker" : ""}; working dir ${root}`);

  try {
    const built = await bundle();
    cleanups.push(() => rmSync(dirname(built.worker), { recursive: true, force: true }));
    // ---- the databases
    const dbs: Db[] = [];
    const mkDb = (name: string, adapter: Db["adapter"], dataDir: string, user: Db["user"]): Db => {
      const submitDir = join(root, "submit", name);
      mkdirSync(submitDir, { recursive: true });
      mkdirSync(dataDir, { recursive: true });
      const cwd = join(root, "cells", name);
      mkdirSync(cwd, { recursive: true });
      if (user) {
        chownSync(dataDir, user.uid, user.gid);
        chownSync(cwd, user.uid, user.gid);
      }
      // In the cells' workspace: the one place a sandboxed cell may write.
      return { name, adapter, dataDir, submitDir, effectFile: join(cwd, `effects-${name}.txt`), user };
    };
    dbs.push(mkDb("sq-a", "sqlite", join(root, "sqlite"), null));
    // A small tmpfs for the full-disk faults (root only; otherwise an ordinary directory and no disk faults).
    const small = join(root, "small");
    mkdirSync(small);
    let tmpfs = false;
    try {
      if (process.getuid?.() === 0) {
        execFileSync("mount", ["-t", "tmpfs", "-o", "size=24m", "tmpfs", small], { stdio: "ignore" });
        tmpfs = true;
        cleanups.push(() => {
          try {
            execFileSync("umount", ["-l", small], { stdio: "ignore" });
          } catch {
            // already unmounted
          }
        });
      }
    } catch {
      tmpfs = false;
    }
    if (process.env.CI && !tmpfs) throw new Error("the nemesis could not mount its small tmpfs for the full-disk faults (needs root)");
    dbs.push(mkDb("sq-small", "sqlite", join(small, "sqlite"), null));
    const nobody = useReplicated ? idsOf("nobody") : null;
    const nobodyHome = join(root, "nobody");
    if (useReplicated) {
      mkdirSync(join(nobodyHome, "tmp"), { recursive: true });
      chownSync(nobodyHome, nobody!.uid, nobody!.gid);
      chownSync(join(nobodyHome, "tmp"), nobody!.uid, nobody!.gid);
      cluster = await startDevCluster({ dir: join(root, "etcd") });
      fw = firewall();
      const f = fw;
      const onExit = () => f.clear();
      process.once("exit", onExit);
      cleanups.push(() => {
        f.clear();
        process.removeListener("exit", onExit);
      });
      dbs.push(mkDb("rep-a", "replicated", join(root, "rep-a"), nobody));
      dbs.push(mkDb("rep-b", "replicated", join(root, "rep-b"), nobody));
    }
    hist.write({ type: "run", seed: o.seed, profile: `${o.faults} faults / ${o.spanMs} ms / ${o.runs} runs`, dbs: dbs.map((d) => ({ name: d.name, adapter: d.adapter })) });

    // ---- workers and the scheduler loop
    let spawned = 0;
    const jobs = new Map<string, { env: Record<string, string> | null; lastCode: number | null }>(dbs.map((d) => [d.name, { env: null, lastCode: null }]));
    const live = (db: string) => [...procs].filter((p) => p.db === db && p.child.exitCode === null && p.child.signalCode === null);
    const spawnWorker = (db: Db, role: "scheduled" | "racer"): Proc => {
      const worker = `${db.name}-w${++spawned}`;
      const job = jobs.get(db.name)!;
      const extra = job.env ?? {};
      job.env = null;
      const dataDir = db.adapter === "sqlite" ? db.dataDir : join(db.dataDir, worker);
      if (db.adapter === "replicated") {
        mkdirSync(dataDir, { recursive: true });
        if (db.user) chownSync(dataDir, db.user.uid, db.user.gid);
      }
      const cfg: WorkerConfig = {
        db: db.name,
        worker,
        adapter: db.adapter,
        dataDir,
        ...(cluster ? { endpoints: cluster.endpoints } : {}),
        history: historyFile,
        effectFile: db.effectFile,
        submitDir: db.submitDir,
        cwd: join(root, "cells", db.name),
        timerCli: `'${process.execPath}' '${built.cli}'`,
        longMs: o.longMs ?? 1500,
        commitTimeoutMs: 1500,
      };
      const base: NodeJS.ProcessEnv = {};
      for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("CAIRN_") && !k.startsWith("NODE_TEST")) base[k] = v;
      const env = db.user ? { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: nobodyHome, TMPDIR: join(nobodyHome, "tmp"), NODE_NO_WARNINGS: "1", ...extra } : { ...base, NODE_NO_WARNINGS: "1", ...extra };
      // hostPerWorker: unshare execs sh, which names the new UTS namespace, drops to the worker's user
      // if it has one, and execs node: the child's pid stays the worker's, for the signals.
      const ownHost = o.hostPerWorker === true;
      const drop = db.user ? `setpriv --reuid=${db.user.uid} --regid=${db.user.gid} --clear-groups ` : "";
      const child = spawn(
        ownHost ? "unshare" : process.execPath,
        ownHost ? ["--uts", "sh", "-c", `hostname "$0" && exec ${drop}"$@"`, `nemesis-${worker}`, process.execPath, built.worker, JSON.stringify(cfg)] : [built.worker, JSON.stringify(cfg)],
        {
          cwd: REPO,
          env,
          stdio: ["ignore", "pipe", "pipe"],
          ...(db.user && !ownHost ? { uid: db.user.uid, gid: db.user.gid } : {}),
        },
      );
      const p: Proc = {
        db: db.name,
        worker,
        child,
        stderr: "",
        opened: false,
        exited: new Promise<void>((resolve) => child.once("exit", () => resolve())),
      };
      child.stderr!.setEncoding("utf8").on("data", (d: string) => (p.stderr = (p.stderr + d).slice(-4000)));
      child.stdout!.setEncoding("utf8").on("data", (d: string) => {
        if (d.includes("opened")) p.opened = true;
      });
      procs.add(p);
      hist.write({ type: "spawn", db: db.name, worker, pid: child.pid ?? -1, role, ...(Object.keys(extra).length > 0 ? { env: extra } : {}) });
      void p.exited.then(() => {
        hist.write({ type: "exit", db: db.name, worker, pid: child.pid ?? -1, code: child.exitCode, signal: child.signalCode });
        if (child.exitCode === 1 || child.exitCode === 2) log(`nemesis: worker ${worker} exited ${child.exitCode}: ${p.stderr.slice(-600)}`);
        procs.delete(p);
        jobs.get(db.name)!.lastCode = child.exitCode;
      });
      return p;
    };
    // The scheduler: per deploy/README.md, restart on 1, 4 and death by signal (with a backoff); not on
    // 2 (the job is wrong); 3 (fenced) is not restarted here while another worker owns the database,
    // and restarted when none is left (the owner that fenced it died too).
    const scheduler = (async () => {
      while (!stopping) {
        for (const db of dbs) {
          if (stopping) break;
          if (live(db.name).length === 0 && jobs.get(db.name)!.lastCode !== 2) spawnWorker(db, "scheduled");
        }
        await sleep(300);
      }
    })();

    // ---- submitted runs and outside posts
    const workR = rng(o.seed ^ 0x5eed);
    const submitted = new Map<string, number>(dbs.map((d) => [d.name, 0]));
    const submit = (n: number) => {
      const db = dbs[n % dbs.length]!;
      const req = `r${String(n + 1).padStart(4, "0")}`;
      const plan: Plan = { req, cells: between(workR, 2, 4), long: between(workR, 0, 1), timer: workR() < 0.25 };
      const file = join(db.submitDir, `${req}.json`);
      writeFileSync(`${file}.tmp`, JSON.stringify(plan));
      renameSync(`${file}.tmp`, file);
      submitted.set(db.name, submitted.get(db.name)! + 1);
      hist.write({ type: "submit", db: db.name, req });
    };
    const posters = new Map<string, Storage>();
    const storageFor = (db: Db): Storage => {
      let s = posters.get(db.name);
      if (s === undefined) {
        s = db.adapter === "sqlite" ? createSqliteStorage({ dataDir: db.dataDir }) : createReplicatedStorage({ endpoints: cluster!.endpoints, dataDir: join(root, "poster", db.name), commitTimeoutMs: 1500 });
        posters.set(db.name, s);
      }
      return s;
    };
    let postsInFlight = 0;
    let posted = 0;
    const post = (db: Db) => {
      const k = submitted.get(db.name)!;
      if (k === 0 || postsInFlight >= 4) return;
      const session = `s${between(workR, 1, k)}`;
      const id = `p${++posted}`;
      postsInFlight += 1;
      const msg = { id, session, kind: "note", payload: { n: posted }, at: new Date().toISOString() };
      void storageFor(db)
        .post(db.name, msg)
        .then(
          () => hist.write({ type: "post", db: db.name, session, id, outcome: "ok" }),
          (err: unknown) => {
            const code = (err as { code?: string }).code;
            hist.write({ type: "post", db: db.name, session, id, outcome: code === "rejected" || code === "not_found" ? "refused" : "failed", error: String((err as Error).message ?? err).slice(0, 200) });
          },
        )
        .finally(() => (postsInFlight -= 1));
    };

    // ---- the nemesis
    const dbCount = dbs.length;
    const weights: Partial<Record<FaultKind, number>> = { ...(o.weights ?? WEIGHTS) };
    if (!useReplicated) for (const k of Object.keys(weights) as FaultKind[]) if (k.includes("member") || k.includes("leader") || k === "isolate-owner") delete weights[k];
    if (!tmpfs) delete weights["disk-full"];
    const plan = schedule({ seed: o.seed, faults: o.faults, spanMs: o.spanMs, dbs: dbCount, weights });
    const ends = new Set<{ run: () => Promise<void> }>();
    const pausedMembers = [0, 0, 0];
    const killedMembers = [0, 0, 0];
    const memberChain: Promise<void>[] = [Promise.resolve(), Promise.resolve(), Promise.resolve()];
    const onMember = (j: number, f: () => Promise<void>) => (memberChain[j] = memberChain[j]!.then(f).catch(() => undefined));
    let diskFull = 0;
    const filler = join(small, "filler");
    const lostAt: { db: string; at: number }[] = [];
    const recoveryMs: number[] = [];
    let injected = 0;

    const leader = async (fallback: number): Promise<number> => {
      const st = await Promise.race([cluster!.status(), sleep(2000).then(() => null)]);
      const i = st?.members.findIndex((m) => m.isLeader) ?? -1;
      return i >= 0 ? i : fallback;
    };
    const memberKill = (j: number) =>
      onMember(j, async () => {
        killedMembers[j]! += 1;
        if (killedMembers[j] === 1) await cluster!.kill(j);
      });
    const memberRevive = (j: number) =>
      onMember(j, async () => {
        killedMembers[j]! -= 1;
        if (killedMembers[j] === 0) {
          await cluster!.restart(j);
          if (pausedMembers[j]! > 0) cluster!.signal(j, "SIGSTOP");
        }
      });
    const memberPause = (j: number) =>
      onMember(j, async () => {
        pausedMembers[j]! += 1;
        if (killedMembers[j] === 0) cluster!.signal(j, "SIGSTOP");
      });
    const memberThaw = (j: number) =>
      onMember(j, async () => {
        pausedMembers[j]! -= 1;
        if (pausedMembers[j] === 0 && killedMembers[j] === 0) cluster!.signal(j, "SIGCONT");
      });
    const ports = (j: number) => [Number(new URL(cluster!.members[j]!.clientUrl).port), Number(new URL(cluster!.members[j]!.peerUrl).port)];

    const inject = async (f: Fault): Promise<void> => {
      const db = dbs[f.target % dbCount]!;
      const later = (what: string, run: () => Promise<void> | void) => {
        const end = {
          run: async () => {
            if (!ends.has(end)) return;
            ends.delete(end);
            clearTimeout(timer);
            await run();
            hist.write({ type: "fault", n: f.n, kind: f.kind, target: what, phase: "end" });
          },
        };
        ends.add(end);
        const timer = setTimeout(() => void end.run(), f.durationMs);
      };
      const begin = (target: string, detail?: string) => {
        injected += 1;
        hist.write({ type: "fault", n: f.n, kind: f.kind, target, phase: "begin", ...(detail ? { detail } : {}) });
      };
      // The owner if one opened, else whichever worker is starting (a kill while it opens is a fault too).
      const owner = () => live(db.name).filter((p) => p.opened).at(-1) ?? live(db.name).at(-1);
      switch (f.kind) {
        case "kill-worker": {
          const p = owner();
          if (!p) return;
          begin(p.worker);
          lostAt.push({ db: db.name, at: Date.now() });
          p.child.kill("SIGKILL");
          return;
        }
        case "pause-worker": {
          const p = owner();
          if (!p) return;
          begin(p.worker, `${f.durationMs} ms`);
          p.child.kill("SIGSTOP");
          later(p.worker, () => void p.child.kill("SIGCONT"));
          return;
        }
        case "stall-takeover": {
          // A stalled machine and its replacement: the owner is frozen (its cells run on, beside it)
          // and a new worker opens the database at once. The new one must launch nothing until the
          // frozen owner's lease is gone, and by then the frozen owner's cells must be dead.
          const p = owner();
          if (!p) return;
          begin(p.worker, `${f.durationMs} ms frozen, a new worker started`);
          p.child.kill("SIGSTOP");
          spawnWorker(db, "racer");
          later(p.worker, () => void p.child.kill("SIGCONT"));
          return;
        }
        case "race-opener": {
          begin(db.name);
          spawnWorker(db, "racer");
          return;
        }
        case "lost-ack":
        case "commit-fail": {
          const p = owner();
          const point = f.kind === "lost-ack" ? "commit:after-durable" : "commit:before";
          jobs.get(db.name)!.env = { CAIRN_CHAOS_STORAGE_FAULT: `${point}@${f.nth}` };
          begin(db.name, `next life: ${point}@${f.nth}`);
          if (p) p.child.kill("SIGKILL");
          return;
        }
        case "kill-member":
        case "kill-leader": {
          const j = f.kind === "kill-leader" ? await leader(f.target) : f.target;
          begin(`member ${j}`, `${f.durationMs} ms`);
          void memberKill(j);
          later(`member ${j}`, () => memberRevive(j));
          return;
        }
        case "pause-member":
        case "pause-leader": {
          const j = f.kind === "pause-leader" ? await leader(f.target) : f.target;
          begin(`member ${j}`, `${f.durationMs} ms`);
          void memberPause(j);
          later(`member ${j}`, () => memberThaw(j));
          return;
        }
        case "kill-two-members":
        case "pause-two-members": {
          const js = [f.target, (f.target + 1) % 3];
          begin(`members ${js.join(",")}`, `${f.durationMs} ms`);
          for (const j of js) void (f.kind === "kill-two-members" ? memberKill : memberPause)(j);
          later(`members ${js.join(",")}`, () => {
            for (const j of js) void (f.kind === "kill-two-members" ? memberRevive : memberThaw)(j);
          });
          return;
        }
        case "isolate-member": {
          const id = await fw!.isolatePorts(ports(f.target));
          begin(`member ${f.target}`, `${f.durationMs} ms`);
          later(`member ${f.target}`, () => fw!.heal(id));
          return;
        }
        case "isolate-owner": {
          const js = [...Array(f.target).keys()].map((k) => (f.n + k) % 3);
          const id = await fw!.cutUid(nobody!.uid, js.map((j) => ports(j)[0]!));
          begin(`replicated owners from members ${js.join(",")}`, `${f.durationMs} ms`);
          later(`owners`, () => fw!.heal(id));
          return;
        }
        case "disk-full": {
          begin("sq-small", `${f.durationMs} ms`);
          diskFull += 1;
          if (diskFull === 1) {
            const fd = openSync(filler, "w");
            const chunk = Buffer.alloc(1 << 20);
            try {
              for (;;) writeSync(fd, chunk);
            } catch {
              // ENOSPC: full
            } finally {
              closeSync(fd);
            }
          }
          later("sq-small", () => {
            diskFull -= 1;
            if (diskFull === 0) rmSync(filler, { force: true });
          });
          return;
        }
      }
    };

    // ---- the fault phase
    const t0 = Date.now();
    const submitEvery = o.spanMs / Math.max(1, o.runs);
    let nextSubmit = 0;
    let nextPost = 0;
    let fi = 0;
    const inflight = new Set<Promise<void>>();
    while (fi < plan.length || nextSubmit < o.runs) {
      const now = Date.now() - t0;
      while (fi < plan.length && plan[fi]!.atMs <= now) {
        const f = plan[fi++]!;
        const p = inject(f).catch((err: unknown) => log(`nemesis: fault ${f.n} ${f.kind} could not be injected: ${String(err)}`));
        inflight.add(p);
        void p.finally(() => inflight.delete(p));
      }
      while (nextSubmit < o.runs && nextSubmit * submitEvery <= now) submit(nextSubmit++);
      if (now >= nextPost) {
        post(dbs[between(workR, 0, dbCount - 1)]!);
        nextPost = now + between(workR, 100, 600);
      }
      await sleep(20);
    }
    log(`nemesis: fault phase over after ${Date.now() - t0} ms, ${injected} faults injected; healing`);

    // ---- heal everything, let every run end
    await Promise.all([...inflight]);
    for (const e of [...ends]) await e.run();
    fw?.clear();
    for (let j = 0; j < 3 && cluster; j++) {
      await memberChain[j];
      if (killedMembers[j]! > 0) {
        killedMembers[j] = 1;
        void memberRevive(j);
      }
      pausedMembers[j] = Math.min(pausedMembers[j]!, 1);
      if (pausedMembers[j]! > 0) void memberThaw(j);
      await memberChain[j];
    }
    rmSync(filler, { force: true });
    for (const p of procs) p.child.kill("SIGCONT");

    const readers = new Map<string, Storage>();
    const readLog = async (db: Db): Promise<LogEvent[]> => {
      let s = readers.get(db.name);
      if (s === undefined) {
        s = db.adapter === "sqlite" ? createSqliteStorage({ dataDir: db.dataDir }) : createReplicatedStorage({ endpoints: cluster!.endpoints, dataDir: join(root, "reader", db.name) });
        readers.set(db.name, s);
      }
      const r = await s.reader(db.name);
      try {
        return await r.read(0);
      } finally {
        await r.close();
      }
    };
    const settleLimit = o.settleLimitMs ?? 180_000;
    const settleStart = Date.now();
    const ended = async (db: Db): Promise<boolean> => {
      const want = submitted.get(db.name)!;
      if (want === 0) return true;
      const events = await readLog(db).catch(() => null);
      if (events === null) return false;
      const sessions = events.filter((e) => e.kind === "session_created").length;
      const done = events.filter((e) => e.kind === "run_ended").length;
      return sessions >= want && done >= sessions;
    };
    for (;;) {
      const all = await Promise.all(dbs.map((d) => ended(d)));
      if (all.every(Boolean)) break;
      if (Date.now() - settleStart > settleLimit) {
        log(`nemesis: the runs did not all end within ${settleLimit} ms of the heal; checking what is there`);
        break;
      }
      await sleep(1000);
    }
    log(`nemesis: settled ${Date.now() - settleStart} ms after the heal`);

    // ---- stop the workers, read the final logs
    stopping = true;
    await scheduler;
    for (const p of procs) p.child.kill("SIGTERM");
    await Promise.race([Promise.all([...procs].map((p) => p.exited)), sleep(15_000)]);
    for (const p of procs) p.child.kill("SIGKILL");
    await Promise.all([...procs].map((p) => p.exited));
    for (const s of posters.values()) await s.close().catch(() => undefined);
    const finals = new Map<string, FinalEvent[]>();
    mkdirSync(join(root, "final"));
    for (const db of dbs) {
      // A database no worker ever created has an empty log (the checker then reports its runs missing).
      const events = await readLog(db).catch((err: unknown) => {
        if ((err as { code?: string }).code === "not_found") return [] as LogEvent[];
        throw err;
      });
      writeFileSync(join(root, "final", `${db.name}.jsonl`), events.map((e) => JSON.stringify(e)).join("\n") + (events.length ? "\n" : ""));
      hist.write({ type: "final", db: db.name, head: events.length });
    }
    for (const s of readers.values()) await s.close().catch(() => undefined);
    hist.close();

    // ---- the check: only from the files
    const history = parseHistory(readFileSync(historyFile, "utf8"));
    const effectsByDb = new Map<string, string[]>();
    for (const db of dbs) {
      finals.set(db.name, readFileSync(join(root, "final", `${db.name}.jsonl`), "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as FinalEvent));
      effectsByDb.set(db.name, existsSync(db.effectFile) ? readFileSync(db.effectFile, "utf8").split("\n") : []);
    }
    const floor = o.floor ?? { ackedCommits: Math.max(20, o.runs * 4), successfulRuns: Math.ceil(o.runs / 2), effectLines: 1, proceeds: 1 };
    const verdict = check({ history, finals, effects: effectsByDb, floor });
    // recovery: a worker killed → the next opening of its database
    for (const l of lostAt) {
      const next = history.find((r): r is Extract<HRecord, { type: "open" }> => r.type === "open" && r.db === l.db && r.at >= l.at);
      if (next) recoveryMs.push(next.at - l.at);
    }
    const failure = verdict.anomalies.length > 0 ? report(o.seed, verdict.anomalies) : "";
    const st = verdict.stats;
    const summary = [
      `nemesis seed ${o.seed}: ${injected} faults injected, ${verdict.anomalies.length} anomalies`,
      `  faults by kind: ${Object.entries(st.faults).sort().map(([k, v]) => `${k} ${v}`).join(", ")}`,
      `  commits: ${st.commits.acknowledged} acknowledged, ${st.commits.refused} refused, ${st.commits.uncertain} uncertain; opens ${st.opens}, fences seen ${st.fences}`,
      `  runs: ${st.runs.success} success, ${st.runs.failure} failure, ${st.runs.unfinished} unfinished; effect lines ${st.effectLines} (effects made ${st.effectsMade}); posts ${Object.entries(st.posts).map(([k, v]) => `${k} ${v}`).join(", ")}`,
      `  effect ledger answers: ${Object.entries(st.ledger).sort().map(([k, v]) => `${k} ${v}`).join(", ") || "none"}`,
      `  worker exits: ${Object.entries(st.exits).sort().map(([k, v]) => `${k}: ${v}`).join(", ")}`,
      `  recovery after a killed worker (kill → next open): p50 ${percentile(recoveryMs, 50)} ms, p90 ${percentile(recoveryMs, 90)} ms, max ${percentile(recoveryMs, 100)} ms (n=${recoveryMs.length})`,
    ].join("\n");
    return { seed: o.seed, root, verdict, faultsInjected: injected, recoveryMs, summary, failure };
  } finally {
    stopping = true;
    for (const p of procs) {
      p.child.kill("SIGCONT");
      p.child.kill("SIGKILL");
    }
    await Promise.race([Promise.all([...procs].map((p) => p.exited)), sleep(5000)]);
    hist.close();
    fw?.clear();
    await cluster?.stop().catch(() => undefined);
    for (const c of cleanups.reverse()) await c();
  }
}

/** Removes a run's working directory. */
export function removeRun(root: string): void {
  try {
    execFileSync("umount", ["-l", join(root, "small")], { stdio: "ignore" });
  } catch {
    // not mounted
  }
  rmSync(root, { recursive: true, force: true });
}
