/**
 * The benchmark users care about: a ROUND (model response in, patch admitted, cell launched, result
 * observed, next turn), measured end to end through the Harness with a scripted model that adds one
 * `true` cell per round, beside its floor measured in the same run:
 *
 * - floor of one round = three raw durable commits of the same adapter (sqlite: a fsynced INSERT
 *   transaction on a WAL/synchronous=FULL file; replicated: a guarded etcd transaction of the same
 *   shape as a commit, on a client configured as the adapter's, client.ts) plus a plain
 *   asynchronous spawn of `true` to its exit, inside a bare bubblewrap sandbox when cells get one;
 * - for 1, 8 and 64 sessions in one process: ms per round (one session's wall time / its rounds),
 *   rounds/s in total, commits per round, durable writes per round (on replicated the etcd
 *   transactions: concurrent commits go out together, see groupDelayMs; on sqlite one per commit),
 *   harness CPU per round (process.cpuUsage(): this process
 *   only; etcd runs in its own processes; the cell launcher's forks are its own too), and the
 *   ratios to the floor, and of each CPU figure the main thread's share (/proc: the rest is V8's
 *   helper threads, TurboFan compiling functions that just became hot, and the GC); each run is
 *   a new session (or 8, or 64) of one owner, a Harness open through the whole section as a
 *   worker holds its database, after unmeasured warm-up sessions of that owner
 *   (CAIRN_BENCH_WARMUP rounds of one session, default 3000, then a tenth of that with 8
 *   sessions, and floor rounds); then, apart, one session's first rounds in a Harness opened
 *   just before ("after open": the JIT's transient for a new instance); beside the harness
 *   CPU, the floor's own CPU per round in this process (the client side of its three raw commits and
 *   of its spawn: on replicated, mostly the etcd client, which the harness pays too);
 * - for the same runs, the whole machine's CPU per round from /proc (Linux): this process, the cells
 *   (the cell launcher with what it reaped; the floor's spawned `true`), etcd's members, the rest,
 *   the total, and the rounds/s that total allows on the machine's cores;
 * - resume: Harness.open + resume() of databases of 10k, 100k and 1M events after a snapshot
 *   (sqlite; replicated with an empty data dir, the rebuild of the local copy included), beside the
 *   read + fold of the whole log without a snapshot; and etcd's database size after compaction and
 *   defragmentation, after the first 10k events and at the end;
 * - for one session, the harness CPU of several runs of the same owner, each as long as the table's
 *   (CAIRN_BENCH_REPEAT, default 5, the table's run included; the others follow it at once, before
 *   the rows of more sessions): the median, the lowest and the highest, and beside each run its main thread's CPU and
 *   the wall time of its GC pauses per round (V8's `gc` performance entries), marked when a snapshot
 *   (a few hundred ms of CPU, every 10,000 events) or a major GC fell in it, and the median of the
 *   runs without either. One run's figure moves by a millisecond or more between runs on a shared
 *   2-core machine.
 *
 * Run: node --import tsx bench/rounds.ts [rounds=100]. Env: CAIRN_BENCH_RESUME_SIZES (comma list,
 * default 10000,100000,1000000), CAIRN_BENCH_ADAPTERS (default sqlite,replicated),
 * CAIRN_BENCH_SESSIONS (default 1,8,64; empty skips the rounds), CAIRN_BENCH_RESUME_SHAPES (default
 * output,rounds), CAIRN_BENCH_WARMUP (default 3000), CAIRN_BENCH_REPEAT (default 5; 1: no repeats).
 * Prints numbers; asserts nothing.
 */
import { spawn, execFile } from "node:child_process";
import { bwrapArgv, probeSandbox } from "../src/exec/sandbox.js";
import { nativeLauncherPath } from "../src/exec/launcher.js";
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { PerformanceObserver, constants as perfConstants, performance, type PerformanceEntry } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import BetterSqlite3 from "better-sqlite3";
import { Harness } from "../src/harness/harness.js";
import { event, identity, turnId, type LogEvent, type NewEvent } from "../src/state/events.js";
import { Reducer } from "../src/state/reducer.js";
import { encodeSnapshot } from "../src/state/snapshot.js";
import type { Database, Storage } from "../src/storage/contract.js";
import { createSqliteStorage } from "../storage-adapters/sqlite/index.js";
import { createReplicatedStorage } from "../storage-adapters/replicated/index.js";
import { startDevCluster, type DevCluster } from "../src/cli/devcluster/index.js";
import { clientOptions, closeEtcdClient, memberClient } from "../storage-adapters/replicated/client.js";
import { put, valueIs } from "../storage-adapters/replicated/ops.js";
import { tagBatches } from "../chaos/support/tagging.js";
import { passThrough, passThroughStorage } from "../chaos/support/passthrough.js";
import { parseProcStat, startCpuWindow, summarize, type CpuBreakdown } from "./stats.js";
import { clockTicksPerSecond } from "./idle.js";
import { LoopModel } from "../chaos/support/loop-model.js";

export { LoopModel };

const run = promisify(execFile);


interface Backend {
  readonly name: "sqlite" | "replicated";
  /** A fresh Storage (a new data dir on replicated means an empty local copy). */
  storage(dataDir: string): Storage;
  /** One raw durable commit, the adapter's physical minimum, for loop `loop`. */
  rawCommit(loop: number): Promise<void>;
  close(): Promise<void>;
}

function sqliteBackend(dir: string): Backend {
  const file = join(dir, "raw.db");
  const raw = new BetterSqlite3(file);
  raw.pragma("journal_mode = WAL");
  raw.pragma("synchronous = FULL");
  raw.exec("CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, identity TEXT UNIQUE, body TEXT)");
  const insert = raw.prepare("INSERT INTO events (identity, body) VALUES (?, ?)");
  const body = JSON.stringify({ cell_id: 1, host: "h", boot_id: "b", pid: 1, pgid: 1, start_time: "1" });
  let n = 0;
  const tx = raw.transaction(() => insert.run(`raw-${n++}`, body));
  return {
    name: "sqlite",
    storage: (dataDir) => createSqliteStorage({ dataDir }),
    rawCommit: async () => {
      tx();
    },
    close: async () => {
      raw.close();
    },
  };
}

function replicatedBackend(cluster: DevCluster): Backend {
  // The floor's raw transactions go on a client configured as the adapter's (client.ts), so the
  // ratio compares the harness with the same client.
  const wire = memberClient(cluster.endpoints[0]!, clientOptions({}), 5000);
  const heads = new Map<number, number>();
  const value = "r".repeat(420);
  return {
    name: "replicated",
    storage: (dataDir) => createReplicatedStorage({ endpoints: cluster.endpoints, dataDir }),
    rawCommit: async (loop) => {
      const head = heads.get(loop) ?? 0;
      const k = (s: string): string => `bench/floor/${loop}/${s}`;
      if (head === 0) await wire.kv.txn({ compare: [], success: [put(k("epoch"), "1"), put(k("head"), "0")], failure: [] });
      const res = await wire.kv.txn({
        compare: [valueIs(k("epoch"), "1"), valueIs(k("head"), String(head))],
        success: [put(k(`log/${String(head + 1).padStart(16, "0")}`), value), put(k("head"), String(head + 1))],
        failure: [],
      });
      if (!res.succeeded) throw new Error("floor txn guard failed");
      heads.set(loop, head + 1);
    },
    close: async () => closeEtcdClient(wire),
  };
}

/**
 * The floor's launch: a plain asynchronous spawn of `true`, to its exit, inside a bare bubblewrap
 * sandbox of the shape cells get (the same namespaces, mounts and init) when this machine can build
 * one, as the harness's cells then run in one; plain `true` otherwise.
 */
const sandboxProbe = probeSandbox();
const floorLaunch: string[] = (() => {
  const init = nativeLauncherPath();
  if (!sandboxProbe.ok || init === null) return ["true"];
  return bwrapArgv({ bwrap: sandboxProbe.bwrap, init, cwd: tmpdir(), network: "off", hide: [], binds: [], initArgs: [], argv: ["true"] });
})();

function spawnTrue(): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(floorLaunch[0]!, floorLaunch.slice(1), { stdio: "ignore" });
    child.on("error", reject);
    child.on("exit", () => resolve());
  });
}

interface RoundStats {
  readonly msPerRound: number;
  readonly roundsPerSecond: number;
  readonly commitsPerRound: number;
  /** Durable writes per round: etcd transactions on replicated, where concurrent commits go out together; on sqlite, which writes each commit in its own transaction, the commits. */
  readonly writesPerRound: number;
  readonly cpuMsPerRound: number;
  /** Of cpuMsPerRound, the main thread's (the rest is V8's and libuv's helper threads: TurboFan, GC); NaN without /proc. */
  readonly mainCpuMsPerRound: number;
  /** CPU of the whole machine in the run, by process (null without /proc). */
  readonly machine: CpuBreakdown | null;
  /** Rounds in the run, all sessions together (to divide `machine` by). */
  readonly rounds: number;
  /** The wall time of the main thread's GC pauses per round (V8's `gc` performance entries): not CPU (a pause can wait for helper threads, or for the core). */
  readonly gcMsPerRound: number;
  /** Snapshots the harness started in the run (one per 10,000 events by default: a few hundred ms of CPU each), and V8's major GCs (mark-compact) in it. NaN for the floor. */
  readonly snapshots: number;
  readonly majorGcs: number;
}

/**
 * The wall time of the main thread's GC pauses so far in this process (ms), from V8's `gc` performance
 * entries; observed from the first call on. Node queues an entry in a setImmediate after its GC, so
 * callers let one pass first (`gcPausesNow`), or a GC at a run's end would count in the next run.
 */
let gcPauseMs = 0;
let majorGcs = 0;
let gcObserver: PerformanceObserver | null = null;
function gcPausesSoFar(): number {
  const note = (e: PerformanceEntry): void => {
    gcPauseMs += e.duration;
    if ((e as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind === perfConstants.NODE_PERFORMANCE_GC_MAJOR) majorGcs++;
  };
  if (gcObserver === null) {
    gcObserver = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) note(e);
    });
    gcObserver.observe({ entryTypes: ["gc"] });
  }
  // Entries not delivered yet are taken now (and so not delivered to the callback again).
  for (const e of gcObserver.takeRecords()) note(e);
  return gcPauseMs;
}

/** {@link gcPausesSoFar} once the entries of GCs that already happened are queued. */
async function gcPausesNow(): Promise<number> {
  await new Promise<void>((resolve) => setImmediate(resolve));
  return gcPausesSoFar();
}

/** The floor: `sessions` loops at once, each doing `rounds` x (3 raw commits + spawn of `true`). */
async function floor(backend: Backend, sessions: number, rounds: number): Promise<RoundStats> {
  const window = startCpuWindow(await hz());
  const main0 = mainThreadTicks();
  const gc0 = await gcPausesNow();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: sessions }, async (_, loop) => {
      for (let r = 0; r < rounds; r++) {
        for (let c = 0; c < 3; c++) await backend.rawCommit(loop);
        await spawnTrue();
      }
    }),
  );
  const ms = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const main = ((mainThreadTicks() - main0) * 1000) / (await hz());
  const gc = (await gcPausesNow()) - gc0;
  const machine = window();
  const total = sessions * rounds;
  return { msPerRound: ms / rounds, roundsPerSecond: (total * 1000) / ms, commitsPerRound: 3, writesPerRound: 3, cpuMsPerRound: (cpu.user + cpu.system) / 1000 / total, mainCpuMsPerRound: main / total, machine, rounds: total, gcMsPerRound: gc / total, snapshots: Number.NaN, majorGcs: Number.NaN };
}

/**
 * An owner: one Harness on one database, open for a whole section, as a worker holds the database it
 * serves; each measured run is a new session (or 8, or 64 at once) of this owner. The model is a
 * LoopModel of the length the current run asks for (runs never overlap).
 */
interface Owner {
  /** `sessions` runs of `rounds` rounds each, started at once, measured from their start to their end. */
  run(sessions: number, rounds: number): Promise<RoundStats>;
  close(): Promise<void>;
}

/** The durable writes `db` made so far: etcd transactions of its commits on replicated; NaN when not counted (sqlite: one transaction per commit, the harness sends them one at a time). */
function durableWrites(db: Database | null): number {
  const stats = db?.stats() as { commitTxns?: unknown } | undefined;
  return typeof stats?.commitTxns === "number" ? stats.commitTxns : Number.NaN;
}

async function openOwner(backend: Backend, dir: string, tag: string): Promise<Owner> {
  let commits = 0;
  let snapshots = 0;
  let db: Database | null = null;
  const storage = passThroughStorage(tagBatches(backend.storage(join(dir, `data-${tag}`)), () => commits++), (d) => {
    db = d;
    return passThrough(d, {
      writeSnapshot: (seq, data) => {
        snapshots++;
        return d.writeSnapshot(seq, data);
      },
    });
  });
  const cwd = join(dir, "cwd");
  mkdirSync(cwd, { recursive: true });
  let model = new LoopModel(0);
  let h: Harness;
  try {
    h = await Harness.open({ storage, name: `rounds-${tag}`, model: { name: "loop", step: (req) => model.step(req) }, workDir: join(dir, "work") });
  } catch (err) {
    await storage.close();
    throw err;
  }
  return {
    async run(sessions, rounds) {
      model = new LoopModel(rounds);
      const commits0 = commits;
      const snapshots0 = snapshots;
      const txns0 = durableWrites(db);
      const window = startCpuWindow(await hz());
      const main0 = mainThreadTicks();
      const gc0 = await gcPausesNow();
      const major0 = majorGcs;
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      const ids = await Promise.all(Array.from({ length: sessions }, () => h.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })));
      const outcomes = await Promise.all(ids.map((id) => h.wait(id)));
      const ms = performance.now() - t0;
      const cpu = process.cpuUsage(cpu0);
      const main = ((mainThreadTicks() - main0) * 1000) / (await hz());
      const gc = (await gcPausesNow()) - gc0;
      const machine = window();
      for (const o of outcomes) if (o.result !== "success") throw new Error(`bench run ${o.session} ended ${o.result}: ${o.reason}`);
      const total = sessions * (rounds + 1);
      return { msPerRound: ms / (rounds + 1), roundsPerSecond: (total * 1000) / ms, commitsPerRound: (commits - commits0) / total, writesPerRound: Number.isNaN(txns0) ? (commits - commits0) / total : (durableWrites(db) - txns0) / total, cpuMsPerRound: (cpu.user + cpu.system) / 1000 / total, mainCpuMsPerRound: main / total, machine, rounds: total, gcMsPerRound: gc / total, snapshots: snapshots - snapshots0, majorGcs: majorGcs - major0 };
    },
    async close() {
      try {
        await h.close();
      } finally {
        await storage.close();
      }
    },
  };
}

/** ", snapshot" and ", N major GC" for a run in which they happened. */
function runEvents(r: RoundStats): string {
  return `${r.snapshots > 0 ? `, ${r.snapshots === 1 ? "snapshot" : `${r.snapshots} snapshots`}` : ""}${r.majorGcs > 0 ? `, ${r.majorGcs} major GC` : ""}`;
}

/** This process's main thread's CPU so far, in clock ticks (NaN without /proc). */
function mainThreadTicks(): number {
  try {
    return parseProcStat(readFileSync(`/proc/self/task/${process.pid}/stat`, "utf8")).own;
  } catch {
    return Number.NaN;
  }
}

/** Clock ticks per second of /proc's times (asked once, when first needed; 100 when getconf fails). */
let ticksPerSecond: Promise<number> | null = null;
const hz = (): Promise<number> => (ticksPerSecond ??= clockTicksPerSecond().catch(() => 100));

/** One-session runs measured for the median (CAIRN_BENCH_REPEAT, default 5, the table's included; 1: only the table's). */
function repeatRuns(): number {
  const raw = process.env["CAIRN_BENCH_REPEAT"];
  if (raw === undefined || raw === "") return 5;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`CAIRN_BENCH_REPEAT must be a whole number of runs, 1 or more, got "${raw}".`);
  return n;
}

/** Rounds of the one-session warm-up run (CAIRN_BENCH_WARMUP, default 3000; 0: none). */
function warmupRounds(): number {
  const raw = process.env["CAIRN_BENCH_WARMUP"];
  if (raw === undefined || raw === "") return 3000;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`CAIRN_BENCH_WARMUP must be a whole number of rounds (0 for no warm-up), got "${raw}".`);
  return n;
}

const fmt = (x: number, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : "-");

async function roundsSection(backend: Backend, dir: string, rounds: number, sessionCounts: readonly number[]): Promise<void> {
  console.log(`\n${backend.name}: ${rounds} rounds per session, one \`true\` cell per round; floor = 3 raw durable commits + spawn of \`true\`${floorLaunch.length > 1 ? " in a bare bubblewrap sandbox (cells run sandboxed too)" : " (no sandbox here: cells run without one too)"}`);
  // The measured runs are sessions of one owner (one Harness on one database, as a worker holds its
  // database for hours or days) that has run unmeasured sessions first: its cell launcher started,
  // V8's hot code compiled. A row that opened a Harness of its own after a warm-up run in another one
  // would measure V8 recompiling much of the round's code for the new instance (TurboFan code
  // specialized on the previous instance's objects is dropped with them: "weak objects"
  // deoptimizations): about 2 to 3 ms more CPU per round with one replicated session. That transient
  // is printed apart, below the table (`after open`).
  // The warm-up: one session (CAIRN_BENCH_WARMUP rounds, default 3000), then 8 sessions, then the
  // floor's own loop. A short warm-up leaves V8 compiling through the measured runs: after 20 rounds,
  // about 1.5 ms of CPU per round more with one sqlite session, 2 to 4 ms on replicated; after 300, V8's --trace-opt still counted 183 TurboFan compilations taking 1.4 s
  // in the next 300 rounds. In one replicated session of one owner, TurboFan's compile time per 500
  // rounds was 2.36 s, 0.66, 0.90, 0.31, 0.25, 0.42, 0.16, 0.09 (4,000 rounds, --trace-opt): it
  // falls under 1 ms per round only after about 3,000 rounds.
  const warm = warmupRounds();
  repeatRuns(); // a bad value is refused before anything runs
  gcPausesSoFar(); // observing from here on
  const owner = await openOwner(backend, dir, "owner");
  const machineRows: string[] = [];
  /** The one-session runs: the table's, then the repeats. */
  const oneSession: RoundStats[] = [];
  let cores = 0;
  try {
    if (warm > 0) {
      await owner.run(1, warm);
      await owner.run(8, Math.max(1, Math.floor(warm / 10)));
      await floor(backend, 1, Math.max(1, Math.floor(warm / 6)));
    }
    console.log(`(one owner, one Harness open through the section: unmeasured warm-up sessions first (CAIRN_BENCH_WARMUP=${warm}): ${warm} rounds of one session, ${Math.max(1, Math.floor(warm / 10))} rounds of 8, ${Math.max(1, Math.floor(warm / 6))} floor rounds; the cell launcher started, the hot code compiled)`);
    console.log("sessions   ms/round  floor ms  ratio   rounds/s  floor r/s  ratio   commits/round  durable writes  harness CPU ms/round  floor CPU ms/round  main thread: harness  floor  harness GC pauses (wall)");
    for (const sessions of sessionCounts) {
      const f = await floor(backend, sessions, sessions >= 64 ? Math.max(10, Math.floor(rounds / 4)) : rounds);
      const h = await owner.run(sessions, rounds);
      console.log(
        `${String(sessions).padStart(8)} ${fmt(h.msPerRound).padStart(10)} ${fmt(f.msPerRound).padStart(9)} ${(fmt(h.msPerRound / f.msPerRound) + "x").padStart(6)} ${fmt(h.roundsPerSecond, 1).padStart(10)} ${fmt(f.roundsPerSecond, 1).padStart(10)} ${(fmt(f.roundsPerSecond / h.roundsPerSecond) + "x").padStart(6)} ${fmt(h.commitsPerRound).padStart(14)} ${fmt(h.writesPerRound).padStart(14)} ${fmt(h.cpuMsPerRound).padStart(21)} ${fmt(f.cpuMsPerRound).padStart(19)} ${fmt(h.mainCpuMsPerRound).padStart(21)} ${fmt(f.mainCpuMsPerRound).padStart(6)} ${fmt(h.gcMsPerRound).padStart(26)}`,
      );
      if (sessions === 1) {
        // The repeats follow at once, back to back, before the rows of more sessions: one sample of
        // one condition. The first runs of a series
        // tend to be higher than the later ones, in either order (in two runs of ten, after the last
        // row: 6.56, 6.17, 5.68, 5.17, then 4.7 to 5.0; back to back: 7.25, 6.70, 7.82, 6.66, then
        // 4.9 to 6.0); not explained.
        oneSession.push(h);
        while (oneSession.length < repeatRuns()) oneSession.push(await owner.run(1, rounds));
      }
      machineRows.push(machineRow(sessions, "harness", h), machineRow(sessions, "floor", f));
      cores = h.machine?.cores ?? cores;
    }
    if (oneSession.length > 0) {
      const repeat = repeatRuns();
      const cpu = summarize(oneSession.map((r) => r.cpuMsPerRound));
      console.log(
        `one session, harness CPU ms/round in ${oneSession.length} runs of ${rounds} rounds (the table's first, CAIRN_BENCH_REPEAT=${repeat}): median ${fmt(cpu.p50)} (nearest rank), lowest ${fmt(cpu.min)}, highest ${fmt(cpu.max)}; ` +
          `each run, harness CPU (its main thread's CPU; the wall time of its GC pauses; a snapshot or major GCs in it): ${oneSession.map((r) => `${fmt(r.cpuMsPerRound)} (${fmt(r.mainCpuMsPerRound)}, ${fmt(r.gcMsPerRound)}${runEvents(r)})`).join(", ")}`,
      );
      // A snapshot (every 10,000 events: about 1,300 rounds here) costs a few hundred ms of CPU, and a
      // major GC tens: the run they fall in pays all of it. Said apart, so that a high single run can
      // be told from a slower round.
      const quiet = oneSession.filter((r) => r.snapshots === 0 && r.majorGcs === 0);
      if (quiet.length > 0 && quiet.length < oneSession.length) {
        const q = summarize(quiet.map((r) => r.cpuMsPerRound));
        console.log(`  of those, the ${quiet.length} runs without a snapshot or a major GC: median ${fmt(q.p50)}, lowest ${fmt(q.min)}, highest ${fmt(q.max)}`);
      }
    }
  } finally {
    await owner.close();
  }
  // The same process, warm, with a Harness opened just before: what a run pays right after its owner
  // opened the database (JIT recompilation for the new instance).
  const fresh = await openOwner(backend, dir, "after-open");
  try {
    const h = await fresh.run(1, rounds);
    console.log(`after open: one session's first ${rounds} rounds in a Harness opened just before (this process warm): ${fmt(h.msPerRound)} ms/round, harness CPU ${fmt(h.cpuMsPerRound)} ms/round (main thread ${fmt(h.mainCpuMsPerRound)})`);
  } finally {
    await fresh.close();
  }
  if (machineRows.some((r) => r !== "")) {
    console.log(`\nthe whole machine's CPU per round (ms, from /proc, in the same runs): this process; the cells (the cell launcher with the gates and cells it reaped, or the floor's spawned \`true\`); etcd (all members); the rest of the machine; the total; and the rounds/s that total allows on all ${cores} cores`);
    console.log("sessions  run        this process  cells   etcd  rest  machine  machine-bound r/s");
    for (const r of machineRows) if (r !== "") console.log(r);
  }
}

/** One row of the machine table: CPU per round of each group in one run ("" without /proc). */
function machineRow(sessions: number, run: string, s: RoundStats): string {
  const m = s.machine;
  if (m === null) return "";
  const per = (x: number) => x / s.rounds;
  const self = m.ms["self"] ?? 0;
  const cells = (m.ms["cairn-launcher"] ?? 0) + (m.ms["reaped"] ?? 0);
  const etcd = m.ms["etcd"] ?? 0;
  const machine = m.ms["machine"] ?? 0;
  const rest = Math.max(0, machine - self - cells - etcd);
  return `${String(sessions).padStart(8)}  ${run.padEnd(9)} ${fmt(per(self)).padStart(13)} ${fmt(per(cells)).padStart(6)} ${fmt(per(etcd)).padStart(6)} ${fmt(per(rest)).padStart(5)} ${fmt(per(machine)).padStart(8)} ${fmt((m.cores * 1000) / per(machine), 0).padStart(18)}`;
}

/** Round-shaped events (9 per round: prepare, attempt, response, accept, queue, start, output, finish, observation). */
function* roundEvents(session: string, at: string): Generator<NewEvent> {
  yield event("session_created", session, identity.session(session), at, { goal: "bench", cwd: "/tmp", validators: [], budgets: {} });
  for (let n = 1; ; n++) {
    const turn = turnId(session, n);
    const cell = n;
    const patch = [{ op: "test", path: "/revision", value: n - 1 }, ...(n > 1 ? [{ op: "remove", path: "/cells/0" }] : []), { op: "add", path: "/cells/-", value: { id: cell, previous_id: null, kind: "cmd", argv: ["true"] } }];
    const delivered = n > 1 ? [`execution:${n - 1}`] : [];
    yield event("turn_prepared", session, identity.turn(turn), at, { turn, n, revision: n - 1, delivered });
    yield event("model_attempt", session, identity.attempt(turn, 1), at, { turn, attempt: 1 });
    yield event("model_response", session, identity.response(turn, 1), at, { turn, attempt: 1, patch, usage: { input_tokens: 900, output_tokens: 40 } });
    yield event("patch_accepted", session, identity.patch(turn), at, { turn, attempt: 1, patch, revision: n, new_cell_ids: [cell], removed_ids: n > 1 ? [n - 1] : [], consumed: delivered });
    yield event("execution_queued", session, identity.queued(session, cell), at, { cell_id: cell, kind: "cmd" });
    yield event("execution_started", session, identity.execution(session, cell), at, { cell_id: cell, host: "bench", boot_id: "b", pid: 4_000_000, pgid: 4_000_000, start_time: "1" });
    yield event("execution_output", session, identity.output(session, cell, 0), at, { cell_id: cell, n: 0, stream: "stdout", data: "ok\n" });
    yield event("execution_finished", session, identity.finished(session, cell), at, { cell_id: cell, result: "success", exit_code: 0, signal: null, duration_ms: 2, output_bytes: 3, dropped_bytes: 0, detail: null, unknown: null });
    const oid = `execution:${cell}`;
    yield event("inbox_received", session, identity.inbox(session, oid), at, { observation: { id: oid, source: "execution", kind: "finished", at, payload: { cell_id: cell, result: "success" } } });
  }
}

/** Output-heavy events: one round, then one long-running cell's output (1 event per line). */
function* outputEvents(session: string, at: string): Generator<NewEvent> {
  const rounds = roundEvents(session, at);
  for (let i = 0; i < 6; i++) yield rounds.next().value as NewEvent; // session .. execution_started of cell 1 (cell 1 stays running)
  for (let n = 0; ; n++) yield event("execution_output", session, identity.output(session, 1, n), at, { cell_id: 1, n, stream: "stdout", data: `line ${n} of a long build log with some text in it\n` });
}

/**
 * Commits `size` events of `shape` through `storage`, writing a snapshot every `every` events (as
 * the harness does) and one at the end. `onProgress` sees the head after each commit.
 */
export async function craft(storage: Storage, name: string, size: number, shape: "rounds" | "output", every: number, onProgress?: (head: number) => Promise<void>): Promise<{ snapshotBytes: number }> {
  const db = await storage.open(name);
  const r = new Reducer();
  const gen = shape === "rounds" ? roundEvents("s1", new Date().toISOString()) : outputEvents("s1", new Date().toISOString());
  let head = 0;
  let sinceSnapshot = 0;
  let snapshotBytes = 0;
  const snapshot = async () => {
    const text = encodeSnapshot(r.projection());
    snapshotBytes = Buffer.byteLength(text);
    await db.writeSnapshot(head, text);
    sinceSnapshot = 0;
  };
  while (head < size) {
    const batch: NewEvent[] = [];
    // Whole rounds per batch keep every batch a plausible commit; at most 117 events (replicated: 126).
    while (batch.length < 117 && head + batch.length < size) batch.push(gen.next().value as NewEvent);
    const receipt = await db.commit(batch);
    r.apply(batch.map((e, i) => ({ ...e, seq: receipt.firstSeq + i }) as LogEvent));
    head = receipt.lastSeq;
    sinceSnapshot += batch.length;
    if (sinceSnapshot >= every) await snapshot();
    await onProgress?.(head);
  }
  if (sinceSnapshot > 0) await snapshot();
  await db.close();
  return { snapshotBytes };
}

/** etcd's database size (max over members) after compacting history and defragmenting every member. */
async function etcdSize(cluster: DevCluster): Promise<number> {
  const endpoints = cluster.endpoints.join(",");
  const status = JSON.parse((await run("etcdctl", ["--endpoints", endpoints, "endpoint", "status", "-w", "json"])).stdout) as { Status: { header: { revision: number } } }[];
  const rev = Math.max(...status.map((s) => s.Status.header.revision));
  // Compacting the history of a million events takes longer than etcdctl's default 5 s timeout: give it
  // time, and fail loudly unless the revision was already compacted (then there is nothing to do).
  await run("etcdctl", ["--endpoints", endpoints, "--command-timeout=600s", "compaction", "--physical", String(rev)]).catch((err: unknown) => {
    if (!/already been compacted|required revision has been compacted/.test(String((err as { stderr?: unknown }).stderr ?? err))) throw err;
  });
  // `--physical` waits for the member that served the request; the others compact in the background,
  // in batches. Defragmenting a member before it finished leaves the old revisions' pages in its file:
  // wait until every member's in-use size stops shrinking.
  const inUse = async () => (JSON.parse((await run("etcdctl", ["--endpoints", endpoints, "endpoint", "status", "-w", "json"])).stdout) as { Status: { dbSizeInUse: number } }[]).map((m) => m.Status.dbSizeInUse).join(",");
  for (let last = await inUse(), tries = 0; tries < 150; tries++) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    const now = await inUse();
    if (now === last) break;
    last = now;
  }
  await run("etcdctl", ["--endpoints", endpoints, "defrag", "--command-timeout=600s"]);
  const after = JSON.parse((await run("etcdctl", ["--endpoints", endpoints, "endpoint", "status", "-w", "json"])).stdout) as { Status: { dbSize: number } }[];
  return Math.max(...after.map((s) => s.Status.dbSize));
}

const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;

async function resumeSection(backend: Backend, dir: string, sizes: readonly number[], shapes: readonly ("output" | "rounds")[], cluster: DevCluster | null): Promise<void> {
  console.log(`\n${backend.name}: resume (Harness.open + resume()) after a snapshot${backend.name === "replicated" ? ", on an empty data dir (local copy rebuilt)" : ""}; beside it, read + fold of the whole log`);
  console.log("events      shape     snapshot   open+resume   whole-log read+fold");
  for (const size of sizes) {
    for (const shape of shapes) {
      const name = `resume-${shape}-${size}`;
      const writerDir = join(dir, `resume-writer-${shape}-${size}`);
      const writer = backend.storage(writerDir);
      let size10k: number | null = null;
      let crafted;
      try {
        crafted = await craft(writer, name, size, shape, 10_000, async (head) => {
          if (cluster !== null && size10k === null && head >= 10_000 && size > 10_000) size10k = await etcdSize(cluster);
        });
      } finally {
        await writer.close();
      }
      const readerDir = backend.name === "replicated" ? join(dir, `resume-fresh-${shape}-${size}`) : writerDir;
      const storage = backend.storage(readerDir);
      let openMs: number;
      try {
        const t0 = performance.now();
        const h = await Harness.open({ storage, name, model: new LoopModel(0), workDir: join(dir, "work"), snapshots: false });
        await h.resume();
        openMs = performance.now() - t0;
        await h.close();
      } finally {
        await storage.close();
      }
      let foldMs = Number.NaN;
      {
        // The whole log, without a snapshot: the writer's own copy holds every event.
        const s = backend.storage(writerDir);
        try {
          const t0 = performance.now();
          const db = await s.open(name);
          const r = new Reducer();
          for (;;) {
            const page = await db.read(r.headSeq, 5000);
            if (page.length === 0) break;
            r.apply(page);
          }
          foldMs = performance.now() - t0;
          await db.close();
        } finally {
          await s.close();
        }
      }
      console.log(`${String(size).padStart(8)}   ${shape.padEnd(7)} ${mib(crafted.snapshotBytes).padStart(10)} ${(fmt(openMs / 1000, 3) + " s").padStart(13)} ${(fmt(foldMs / 1000, 3) + " s").padStart(21)}`);
      if (cluster !== null && size10k !== null) {
        console.log(`           etcd db size after compaction + defrag: ${mib(size10k)} after 10k events, ${mib(await etcdSize(cluster))} after ${size}`);
      }
    }
  }
}

/** Runs the benchmark and prints the results. */
export async function runRoundsBench(rounds = 100): Promise<void> {
  const adapters = (process.env["CAIRN_BENCH_ADAPTERS"] ?? "sqlite,replicated").split(",");
  const sessions = (process.env["CAIRN_BENCH_SESSIONS"] ?? "1,8,64").split(",").map(Number).filter((n) => n > 0);
  const sizes = (process.env["CAIRN_BENCH_RESUME_SIZES"] ?? "10000,100000,1000000").split(",").map(Number).filter((n) => n > 0);
  const shapes = (process.env["CAIRN_BENCH_RESUME_SHAPES"] ?? "output,rounds").split(",").filter((x): x is "output" | "rounds" => x === "output" || x === "rounds");
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-rounds-"));
  let cluster: DevCluster | null = null;
  try {
    if (adapters.includes("sqlite")) {
      const b = sqliteBackend(dir);
      try {
        if (sessions.length > 0) await roundsSection(b, join(dir, "sqlite"), rounds, sessions);
        await resumeSection(b, join(dir, "sqlite"), sizes, shapes, null);
      } finally {
        await b.close();
      }
    }
    if (adapters.includes("replicated")) {
      cluster = await startDevCluster({ dir: join(dir, "cluster") });
      const b = replicatedBackend(cluster);
      try {
        if (sessions.length > 0) await roundsSection(b, join(dir, "replicated"), rounds, sessions);
        await resumeSection(b, join(dir, "replicated"), sizes, shapes, cluster);
      } finally {
        await b.close();
      }
    }
  } finally {
    await cluster?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const n = Number(process.argv[2] ?? 100);
  await runRoundsBench(Number.isInteger(n) && n > 0 ? n : 100);
}
