/**
 * The replicated adapter: the Storage contract on an etcd cluster of three voting members, one per
 * zone. A commit resolves once etcd committed it, i.e. once a majority (2 of 3 zones) holds it,
 * fsynced. No replication protocol of our own: one guarded etcd transaction per commit (group).
 *
 * Layout of the keys: layout.ts. The etcd client (one stack for every call): client.ts, routed
 * around silent members by router.ts. Commits, grouping and unknown outcomes: commit-pipeline.ts.
 * Ownership and fencing: database.ts. Local SQLite copy: local-copy.ts. Error mapping:
 * etcd-errors.ts. Retries: retry.ts. Limits and deployment: deploy/etcd/README.md.
 */
import { CairnError } from "../../src/errors.js";
import type { LogEvent } from "../../src/state/events.js";
import type { Database, MailboxMessage, OpenOptions, PostedMessage, Reader, Storage, StoredSnapshot } from "../../src/storage/contract.js";
import { readSnapshot } from "./snapshots.js";
import { DatabaseNotFound, ResetError } from "../../src/storage/errors.js";
import { closedHandle } from "../../src/storage/handle.js";
import { checkRange, isValidDatabaseName } from "../../src/storage/semantics.js";
import { readEpochHead, readFromCluster } from "./cluster-log.js";
import { Context } from "./context.js";
import type { ReplicatedDatabase } from "./database.js";
import { HealthMonitor } from "./health.js";
import { ROOT_PREFIX, keysOf } from "./layout.js";
import { postMessage } from "./mailbox.js";
import { replicatedLeases } from "./lease.js";
import { checkMembers, openReplicatedDatabase } from "./open.js";
import { kvsOf, prefixEnd, range } from "./ops.js";
import { resolveOptions, type ReplicatedLogger, type ReplicatedOptions } from "./options.js";
import { Router } from "./router.js";
import { clientOptions, connectionOf } from "./client.js";

export type { ReplicatedOptions, ReplicatedLogger } from "./options.js";
export type { ReplicatedStats } from "./database.js";
export { MAX_BATCH_BYTES, MAX_BATCH_EVENTS, MAX_TXN_OPS } from "./layout.js";
export { localCopyPath } from "./local-copy.js";

const silent: ReplicatedLogger = { info: () => {}, warn: () => {}, error: () => {} };

/**
 * Creates a replicated Storage. Options are validated now (ConfigError naming the option); the
 * cluster is first contacted by `open`, `reader`, `post` or `list`. `open` refuses a cluster with
 * fewer than three voting members unless `allowSmallCluster`. Credentials are never logged.
 */
export function createReplicatedStorage(options: ReplicatedOptions): Storage {
  const opts = resolveOptions(options);
  const log = opts.logger ?? silent;
  // One etcd client per member for every request (client.ts, router.ts); the health monitor's polls
  // go on clients of their own, to the members' advertised URLs.
  const conn = connectionOf(opts);
  const health = new HealthMonitor(clientOptions(conn, false), opts.healthIntervalMs, log);
  const router = new Router(opts.endpoints, clientOptions(conn), opts.attemptTimeoutMs, (url) => health.member(url), opts.commitTimeoutMs);
  const ctx = new Context(router, opts, log, health);
  const open = new Set<ReplicatedDatabase>();
  let membersLogged = false;
  let closed = false;

  const ensureOpen = (): void => {
    if (closed) throw new ResetError("stop", "closed", "this replicated storage was closed; create a new one.");
  };

  return {
    adapter: "replicated",
    leases: replicatedLeases(ctx, opts.leaseMs),

    async open(name: string, openOptions: OpenOptions = {}): Promise<Database> {
      ensureOpen();
      const members = await checkMembers(ctx);
      if (!membersLogged) {
        membersLogged = true;
        for (const m of members) log.info({ member: m.name, zone: m.zone, clientUrls: m.clientUrls }, "etcd voting member");
      }
      health.start(members.flatMap((m) => m.clientUrls.slice(0, 1)));
      const db = await openReplicatedDatabase(ctx, name, openOptions.create !== false, (d) => open.delete(d));
      open.add(db);
      return db;
    },

    async reader(name: string): Promise<Reader> {
      ensureOpen();
      if (!isValidDatabaseName(name)) throw new DatabaseNotFound(name);
      const keys = keysOf(name);
      try {
        if ((await readEpochHead(ctx, keys)).epoch === null) throw new DatabaseNotFound(name);
      } catch (err) {
        throw ctx.fail(err, "read", name);
      }
      let readerClosed = false;
      const guard = (): void => {
        if (readerClosed) throw closedHandle(name, "reader");
      };
      return {
        name,
        async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
          guard();
          checkRange(afterSeq, limit);
          try {
            return await readFromCluster(ctx, keys, afterSeq, limit);
          } catch (err) {
            if (err instanceof CairnError) throw err;
            throw ctx.fail(err, "read", name);
          }
        },
        async head(): Promise<number> {
          guard();
          try {
            return (await readEpochHead(ctx, keys)).head;
          } catch (err) {
            throw ctx.fail(err, "read the head of", name);
          }
        },
        async pending(): Promise<PostedMessage[]> {
          guard();
          try {
            const res = await ctx.txn([], [range(keys.mailPrefix, prefixEnd(keys.mailPrefix))]);
            return kvsOf(res.responses, 0).map((kv) => ({
              ...(JSON.parse(kv.value.toString("utf8")) as MailboxMessage),
              mseq: Number(kv.key.toString("utf8").slice(keys.mailPrefix.length)),
            }));
          } catch (err) {
            throw ctx.fail(err, "read the mailbox of", name);
          }
        },
        async latestSnapshot(): Promise<StoredSnapshot | null> {
          guard();
          try {
            return await readSnapshot(ctx, keys, name);
          } catch (err) {
            if (err instanceof CairnError) throw err;
            throw ctx.fail(err, "read the snapshot of", name);
          }
        },
        async close(): Promise<void> {
          readerClosed = true;
        },
      };
    },

    async post(name: string, message: MailboxMessage): Promise<void> {
      ensureOpen();
      await postMessage(ctx, name, message);
    },

    async list(): Promise<string[]> {
      ensureOpen();
      // A skip scan: one single-key range per database, never the databases' own keys.
      const names: string[] = [];
      const end = prefixEnd(ROOT_PREFIX);
      let from = ROOT_PREFIX;
      try {
        for (;;) {
          const res = await ctx.txn([], [{ request_range: { ...range(from, end, 1).request_range, keys_only: true } }]);
          const kv = kvsOf(res.responses, 0)[0];
          if (!kv) return names.sort();
          const name = kv.key.toString("utf8").slice(ROOT_PREFIX.length).split("/")[0]!;
          if (isValidDatabaseName(name)) names.push(name);
          from = `${ROOT_PREFIX}${name}0`; // "0" sorts right after "/": skip every key of `name`
        }
      } catch (err) {
        throw ctx.fail(err, "list databases in");
      }
    },

    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      await Promise.all([...open].map((db) => db.close()));
      health.stop();
      router.close();
    },
  };
}
