/**
 * Owner A of the partition test, run as its own process (as an unprivileged uid, so that iptables can
 * cut it off alone): opens database `db` on the replicated adapter and commits events in a loop from
 * a few concurrent workers until SIGTERM, printing one JSON line per happening on stdout:
 *
 *   {"t":"opened","epoch":1,"head":0}
 *   {"t":"submit","id":"inbox:a:obs-7"}                       a commit was called
 *   {"t":"ok","id":"inbox:a:obs-7","firstSeq":8,"lastSeq":8}   it resolved
 *   {"t":"err","id":...,"code":"reset","action":"stop","reason":"fenced","message":...}
 *   {"t":"signal","signal":{"type":"fenced","epoch":2}}          from Database.watch
 *   {"t":"stats","stats":{...}}                                  Database.stats(), periodically
 *   {"t":"paused"} / {"t":"resumed"}                            on SIGUSR1 / SIGUSR2: new commits stop / go on
 *   {"t":"closed"} / {"t":"fatal","message":...}
 *
 * Usage: node --import tsx chaos/partition/owner.ts '{"endpoints":[...],"dataDir":"...","db":"p"}'
 */
import { setTimeout as sleep } from "node:timers/promises";
import { event, identity } from "../../src/state/events.js";
import type { Database } from "../../src/storage/contract.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { OWNER_SESSION, type OwnerConfig } from "./protocol.js";

const AT = "2025-01-02T03:04:05.678Z";

function emit(line: object): void {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

function describeError(err: unknown): object {
  const e = err as { code?: unknown; action?: unknown; reason?: unknown; name?: unknown; message?: unknown };
  return { code: e.code ?? null, action: e.action ?? null, reason: e.reason ?? null, name: e.name ?? null, message: String(e.message ?? err) };
}

async function commitOne(db: Database, n: number): Promise<boolean> {
  const id = identity.inbox(OWNER_SESSION, `obs-${n}`);
  const ev = event("inbox_received", OWNER_SESSION, id, AT, {
    observation: { id: `obs-${n}`, source: "external", kind: "note", at: AT, payload: { n } },
  });
  emit({ t: "submit", id });
  try {
    const r = await db.commit([ev]);
    emit({ t: "ok", id, firstSeq: r.firstSeq, lastSeq: r.lastSeq });
    return true;
  } catch (err) {
    emit({ t: "err", id, ...describeError(err) });
    return false;
  }
}

async function main(): Promise<void> {
  const cfg = JSON.parse(process.argv[2] ?? "{}") as OwnerConfig;
  const storage = createReplicatedStorage({
    endpoints: cfg.endpoints,
    dataDir: cfg.dataDir,
    ...(cfg.commitTimeoutMs === undefined ? {} : { commitTimeoutMs: cfg.commitTimeoutMs }),
  });
  const db = await storage.open(cfg.db);
  emit({ t: "opened", epoch: db.epoch, head: await db.head() });
  db.watch((signal) => emit({ t: "signal", signal }));
  const statsTimer = setInterval(() => emit({ t: "stats", stats: db.stats() }), cfg.statsEveryMs ?? 200);

  const sid = identity.session(OWNER_SESSION);
  emit({ t: "submit", id: sid });
  try {
    const r = await db.commit([event("session_created", OWNER_SESSION, sid, AT, { goal: "partition test", cwd: "/", validators: [], budgets: {} })]);
    emit({ t: "ok", id: sid, firstSeq: r.firstSeq, lastSeq: r.lastSeq });
  } catch (err) {
    emit({ t: "err", id: sid, ...describeError(err) });
  }

  let stopping = false;
  let paused = false;
  process.on("SIGUSR1", () => {
    paused = true;
    emit({ t: "paused" });
  });
  process.on("SIGUSR2", () => {
    paused = false;
    emit({ t: "resumed" });
  });
  let next = 0;
  const pause = cfg.pauseMs ?? 20;
  const worker = async (): Promise<void> => {
    while (!stopping) {
      if (paused) {
        await sleep(20);
        continue;
      }
      const ok = await commitOne(db, next++);
      await sleep(ok ? pause : Math.max(pause, 100));
    }
  };
  const workers = Array.from({ length: cfg.workers ?? 3 }, () => worker());

  await new Promise<void>((resolve) => process.once("SIGTERM", () => resolve()));
  stopping = true;
  clearInterval(statsTimer);
  // A worker may still wait for a commit the cluster never answers: do not wait for it forever.
  await Promise.race([Promise.all(workers), sleep(10_000)]);
  await Promise.race([db.close().then(() => storage.close()), sleep(5_000)]);
  emit({ t: "closed" });
  process.exit(0);
}

main().catch((err: unknown) => {
  emit({ t: "fatal", ...describeError(err) });
  process.exit(1);
});
