/**
 * What every part of one replicated Storage shares: the member router, the options, the logger, the
 * quorum monitor and the counters, plus the helpers every request goes through.
 */
import type { Etcd3, ICompare, IRequestOp, ITxnResponse } from "etcd3";
import type { CairnError } from "../../src/errors.js";
import { classifyEtcdError, mapEtcdError } from "./etcd-errors.js";
import type { HealthMonitor } from "./health.js";
import type { ReplicatedLogger, ResolvedOptions } from "./options.js";
import type { Router } from "./router.js";

/** Counters shared by the databases of one Storage (for stats and tests). */
export interface Counters {
  /** etcd transactions sent to append to a log (each retry counts). */
  commitTxns: number;
  /** Attempts of those: one per member tried. */
  commitAttempts: number;
  /** Commit calls resolved with a receipt. */
  commitsResolved: number;
  /** Transactions that waited `groupDelayMs` for more commits to join them (commit-pipeline.ts). */
  commitGroupWaits: number;
}

export class Context {
  readonly counters: Counters = { commitTxns: 0, commitAttempts: 0, commitsResolved: 0, commitGroupWaits: 0 };

  constructor(
    readonly router: Router,
    readonly opts: Readonly<ResolvedOptions>,
    readonly log: ReplicatedLogger,
    readonly health: HealthMonitor,
  ) {}

  /**
   * One etcd request, routed around silent members (router.ts) within `commitTimeoutMs`. An outage
   * is reported to the health monitor before the error is rethrown unchanged (callers decide what an
   * unknown outcome means); a success marks the quorum held (when `linearizable`).
   */
  async call<T>(op: (client: Etcd3) => Promise<T>, linearizable = true): Promise<T> {
    try {
      const res = await this.router.call(op, this.opts.commitTimeoutMs);
      if (linearizable) this.health.noteSuccess();
      return res;
    } catch (err) {
      if (classifyEtcdError(err) === "outage") this.health.noteOutage();
      throw err;
    }
  }

  /** One etcd transaction (see `call`). */
  txn(compare: ICompare[], success: IRequestOp[], failure: IRequestOp[] = []): Promise<ITxnResponse> {
    return this.call((client) => client.kv.txn({ compare, success, failure }));
  }

  /** The commit pipeline's transaction (see `txn`), its attempts counted. */
  commitTxn(compare: ICompare[], success: IRequestOp[], failure: IRequestOp[]): Promise<ITxnResponse> {
    return this.call((client) => {
      this.counters.commitAttempts++;
      return client.kv.txn({ compare, success, failure });
    });
  }

  /** Maps an etcd error for operation `op` on database `db` (see etcd-errors.ts). */
  fail(err: unknown, op: string, db?: string): CairnError {
    return mapEtcdError(err, { op, ...(db === undefined ? {} : { db }), ...(this.opts.username === undefined ? {} : { user: this.opts.username }), endpoints: this.opts.endpoints });
  }
}
