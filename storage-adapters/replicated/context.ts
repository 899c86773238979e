/**
 * What every part of one replicated Storage shares: the etcd client, the options, the logger, the
 * quorum monitor and the counters, plus the helpers every request goes through.
 */
import type { Etcd3, ICompare, IRequestOp, ITxnResponse } from "etcd3";
import type { CairnError } from "../../src/errors.js";
import { classifyEtcdError, mapEtcdError } from "./etcd-errors.js";
import type { HealthMonitor } from "./health.js";
import type { ReplicatedLogger, ResolvedOptions } from "./options.js";

/** Counters shared by the databases of one Storage (for stats and tests). */
export interface Counters {
  /** etcd transactions sent to append to a log (each retry counts). */
  commitTxns: number;
  /** Commit calls resolved with a receipt. */
  commitsResolved: number;
}

export class Context {
  readonly counters: Counters = { commitTxns: 0, commitsResolved: 0 };

  constructor(
    readonly client: Etcd3,
    readonly opts: Readonly<ResolvedOptions>,
    readonly log: ReplicatedLogger,
    readonly health: HealthMonitor,
  ) {}

  /**
   * One etcd transaction. An outage is reported to the health monitor before the error is rethrown
   * unchanged (callers decide what an unknown outcome means); a success marks the quorum held.
   */
  async txn(compare: ICompare[], success: IRequestOp[], failure: IRequestOp[] = []): Promise<ITxnResponse> {
    try {
      const res = await this.client.kv.txn({ compare, success, failure });
      this.health.noteSuccess();
      return res;
    } catch (err) {
      if (classifyEtcdError(err) === "outage") this.health.noteOutage();
      throw err;
    }
  }

  /** Maps an etcd error for operation `op` on database `db` (see etcd-errors.ts). */
  fail(err: unknown, op: string, db?: string): CairnError {
    return mapEtcdError(err, { op, ...(db === undefined ? {} : { db }), ...(this.opts.username === undefined ? {} : { user: this.opts.username }), endpoints: this.opts.endpoints });
  }
}
