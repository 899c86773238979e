/**
 * Writes projection snapshots as a harness commits: after every `events` events or about `bytes` bytes
 * of events (SnapshotPolicy; estimated as output data plus a fixed 200 bytes per event, not serialized), the projection at the head is encoded at once (so it is exactly the
 * fold of 1..head) and handed to `Database.writeSnapshot` in the background: commits never wait for
 * a snapshot. One write at a time; a failed write is logged and retried at the next due point.
 */
import type { Logger } from "pino";
import type { LogEvent } from "../state/events.js";
import type { Projection } from "../state/projection.js";
import { encodeSnapshot } from "../state/snapshot.js";
import type { Database } from "../storage/contract.js";
import { DEFAULT_SNAPSHOT_POLICY, SnapshotSchedule, type SnapshotPolicy } from "../storage/snapshots.js";

export class Snapshotter {
  private readonly schedule: SnapshotSchedule | null;
  private inflight: Promise<void> | null = null;

  /** `policy` false turns snapshots off; omitted fields take DEFAULT_SNAPSHOT_POLICY's. */
  constructor(
    private readonly db: Database,
    private readonly logger: Logger,
    policy: Partial<SnapshotPolicy> | false | undefined,
  ) {
    this.schedule = policy === false ? null : new SnapshotSchedule({ ...DEFAULT_SNAPSHOT_POLICY, ...policy });
  }

  /** Called after each commit was folded; `projection` is at the last event of `logged`. */
  afterCommit(logged: readonly LogEvent[], projection: Projection): void {
    if (this.schedule === null) return;
    let bytes = 0;
    for (const e of logged) bytes += e.kind === "execution_output" ? e.body.data.length + 200 : 200;
    this.schedule.record(logged.length, bytes);
    if (!this.schedule.due() || this.inflight !== null) return;
    const seq = projection.head;
    const text = encodeSnapshot(projection);
    this.schedule.reset();
    const t0 = performance.now();
    this.inflight = this.db
      .writeSnapshot(seq, text)
      .then(
        () => this.logger.debug({ seq, bytes: text.length, ms: Math.round(performance.now() - t0) }, "snapshot written"),
        (err: unknown) => this.logger.warn({ seq, err: (err as Error).message }, "snapshot not written; the next one is tried later"),
      )
      .finally(() => {
        this.inflight = null;
      });
  }

  /** Resolves when no snapshot write is in flight. */
  async settled(): Promise<void> {
    await this.inflight;
  }
}
