/**
 * A nemesis worker: one process owning one database, as `cairn serve` does (open, take over, resume,
 * exit 3 when fenced, 4 when a commit's outcome is unknown or storage is unavailable, 0 on SIGTERM),
 * driven by the policy model, and starting the runs submitted to it (one file per request in its
 * submit folder; a request whose run is already in the log is not started again). Every commit, open
 * and fence is appended to the history (see history.ts) by a storage wrapper, before the harness
 * learns the outcome.
 *
 * Usage: node --import tsx chaos/nemesis/worker.ts '<WorkerConfig as JSON>'
 * CAIRN_CHAOS_STORAGE_FAULT (see src/storage/chaos-fault.ts) injects lost acknowledgements.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import type { NewEvent } from "../../src/state/events.js";
import { storageFaultsFromEnv } from "../../src/storage/chaos-fault.js";
import type { Database, Storage } from "../../src/storage/contract.js";
import { passThrough, passThroughStorage } from "../support/passthrough.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { HistoryWriter, type HEvent } from "./history.js";
import { planGoal, PolicyModel, type Plan } from "./policy.js";

export interface WorkerConfig {
  readonly db: string;
  readonly worker: string;
  readonly adapter: "sqlite" | "replicated";
  readonly dataDir: string;
  readonly endpoints?: readonly string[];
  readonly history: string;
  readonly effectFile: string;
  readonly submitDir: string;
  /** Where the cells run (their cwd). */
  readonly cwd: string;
  /** The command line prefix of `cairn` for timer cells, or null for no timers. */
  readonly timerCli: string | null;
  readonly longMs: number;
  readonly commitTimeoutMs?: number;
}

const EXIT = { ok: 0, failure: 1, usage: 2, fenced: 3, storage: 4 } as const;

function errorInfo(err: unknown): { code: string; reason: string | null; message: string } {
  const e = err as { code?: unknown; reason?: unknown; message?: unknown };
  return { code: typeof e.code === "string" ? e.code : "error", reason: typeof e.reason === "string" ? e.reason : null, message: String(e.message ?? err).slice(0, 300) };
}

function hEvents(events: readonly NewEvent[]): HEvent[] {
  return events.map((e) => {
    const body = e.body as { cell_id?: unknown };
    return { kind: e.kind, identity: e.identity, session: e.session, ...(typeof body.cell_id === "number" ? { cell: body.cell_id } : {}) };
  });
}

/** Records every commit of `storage`'s databases, their opening and their fences. */
function recording(storage: Storage, hist: HistoryWriter, cfg: WorkerConfig): Storage {
  let op = 0;
  const wrap = async (db: Database): Promise<Database> => {
    let head = -1;
    try {
      head = await db.head();
    } catch {
      // unknown: the checker then skips this opening's head check
    }
    hist.write({ type: "open", db: cfg.db, worker: cfg.worker, pid: process.pid, epoch: db.epoch, head });
    return passThrough(db, {
      commit: async (events) => {
        const n = ++op;
        hist.write({ type: "invoke", db: cfg.db, worker: cfg.worker, epoch: db.epoch, op: n, events: hEvents(events) });
        try {
          const r = await db.commit(events);
          hist.write({ type: "ok", db: cfg.db, worker: cfg.worker, epoch: db.epoch, op: n, firstSeq: r.firstSeq, lastSeq: r.lastSeq });
          return r;
        } catch (err) {
          const info = errorInfo(err);
          const outcome = info.code === "reset" || info.code === "rejected" ? "refused" : "uncertain";
          hist.write({ type: "fail", db: cfg.db, worker: cfg.worker, epoch: db.epoch, op: n, outcome, ...info });
          throw err;
        }
      },
      watch: (listener) =>
        db.watch((signal) => {
          if (signal.type === "fenced") hist.write({ type: "fenced", db: cfg.db, worker: cfg.worker, epoch: db.epoch, by: signal.epoch });
          listener(signal);
        }),
    });
  };
  // Everything else, the owner's lease included, is passed through (passthrough.ts): without the
  // lease the harness would neither wait for an earlier owner's lease nor hold its cells to its own.
  return passThroughStorage(storage, wrap);
}

async function main(): Promise<number> {
  const cfg = JSON.parse(process.argv[2] ?? "{}") as WorkerConfig;
  const hist = new HistoryWriter(cfg.history);
  const faultHook = storageFaultsFromEnv(process.env);
  const faults = faultHook ? { faults: faultHook } : {};
  const base =
    cfg.adapter === "sqlite"
      ? createSqliteStorage({ dataDir: cfg.dataDir, ...faults })
      : createReplicatedStorage({ endpoints: cfg.endpoints ?? [], dataDir: cfg.dataDir, ...(cfg.commitTimeoutMs ? { commitTimeoutMs: cfg.commitTimeoutMs } : {}), ...faults });
  const storage = recording(base, hist, cfg);
  let h: Harness;
  try {
    h = await Harness.open({
      storage,
      name: cfg.db,
      model: new PolicyModel(cfg.effectFile, cfg.timerCli, cfg.longMs),
      workDir: join(cfg.dataDir, "work"),
      limits: { retryBaseMs: 100, stopGraceMs: 500, outputFlushMs: 250 },
      // Cells run sandboxed where this machine can (they write their effect lines in their
      // workspace); the epoch they stamp on them is passed on by name.
      sandbox: { passEnv: ["CHAOS_EPOCH"] },
    });
  } catch (err) {
    const info = errorInfo(err);
    hist.write({ type: "open-failed", db: cfg.db, worker: cfg.worker, pid: process.pid, error: `${info.code}: ${info.message}` });
    process.stderr.write(`nemesis worker ${cfg.worker}: the open failed: ${info.code}: ${info.message}\n`);
    await base.close().catch(() => undefined);
    // As the CLI maps them (src/cli/exit.ts): a wrong job (config) is 2, which the scheduler does not restart.
    if (info.code === "config" || info.code === "usage" || info.code === "not_found") return EXIT.usage;
    return info.code === "reset" ? EXIT.fenced : info.code === "unavailable" || info.code === "uncertain" ? EXIT.storage : EXIT.failure;
  }
  process.env.CHAOS_EPOCH = String(h.epoch);
  process.stdout.write(`opened ${h.epoch}\n`);
  const stopped = new Promise<number>((resolve) => {
    h.onStop((status) => resolve(status === "fenced" ? EXIT.fenced : status === "poisoned" ? EXIT.storage : EXIT.ok));
    process.once("SIGTERM", () => resolve(EXIT.ok));
  });
  const fail = (err: unknown): number => {
    const info = errorInfo(err);
    // Said on stderr, which the nemesis prints beside an exit of 1 or 2 (run.ts): an exit without its reason explains nothing.
    process.stderr.write(`nemesis worker ${cfg.worker}: stopping on ${info.code}${info.reason === null ? "" : ` (${info.reason})`}: ${info.message}\n`);
    return info.code === "reset" ? EXIT.fenced : info.code === "uncertain" || info.code === "unavailable" ? EXIT.storage : EXIT.failure;
  };
  let crashed: number | null = null;
  const submitted = async (): Promise<void> => {
    while (h.status === "open") {
      let names: string[] = [];
      try {
        names = readdirSync(cfg.submitDir).filter((n) => n.endsWith(".json")).sort();
      } catch {
        names = [];
      }
      const goals = new Set(h.sessions().map((id) => h.session(id)?.goal));
      for (const name of names) {
        const plan = JSON.parse(readFileSync(join(cfg.submitDir, name), "utf8")) as Plan;
        const goal = planGoal(plan);
        if (goals.has(goal) || h.status !== "open") continue;
        await h.start({ goal, cwd: cfg.cwd });
        goals.add(goal);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  try {
    await h.resume();
    void submitted().catch((err: unknown) => {
      crashed = fail(err);
    });
    const code = await Promise.race([stopped, new Promise<number>((resolve) => {
      const t = setInterval(() => {
        if (crashed !== null) {
          clearInterval(t);
          resolve(crashed);
        }
      }, 100);
      void stopped.then(() => clearInterval(t));
    })]);
    return code;
  } catch (err) {
    return fail(err);
  } finally {
    await Promise.race([h.close().then(() => base.close()), new Promise((r) => setTimeout(r, 10_000))]).catch(() => undefined);
    hist.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`nemesis worker: ${String((err as Error)?.stack ?? err)}\n`);
    process.exit(1);
  },
);
