/**
 * A watch that survives its member going silent.
 *
 * The watch stream lives on one member. When the health monitor sees that member unreachable or
 * leaderless, or the stream reports an error or a disconnect, the watch is re-created on another
 * member from "now", and `recheck` is run right after: it reads (linearizably) what the watch would
 * have reported in the gap, so nothing is missed. Creation and cancellation are bounded: a member
 * that does not answer costs at most the attempt deadline, then the next member is tried.
 *
 * Watches are for promptness only (a fence reported within seconds): every owner's write is guarded
 * by its epoch in etcd itself, so a late or lost watch event never makes a write unsafe.
 */
import { GRPCDeadlineExceededError, type IKeyValue, type Watcher } from "etcd3";
import type { Context } from "./context.js";
import { withTimeout } from "./client.js";
import { Retry } from "./retry.js";
import type { Member } from "./router.js";

export interface WatchSpec {
  readonly what: string;
  readonly key?: string;
  readonly prefix?: string;
  readonly onlyPut?: boolean;
  /** The first revision to watch from, for the first stream only (later ones start at "now"). */
  readonly startRevision: string;
  readonly onPut: (kv: IKeyValue) => void;
  readonly onDelete?: (kv: IKeyValue) => void;
  /** Runs after every re-creation: reads what the watch may have missed. */
  readonly recheck: () => Promise<void>;
}

/** Cancelling a watcher on a silent member never waits longer than this. */
const CANCEL_BOUND_MS = 1000;

/**
 * Cancels `w`, waiting at most CANCEL_BOUND_MS for its member; never rejects. Callers that need not
 * wait drop the promise. A cancel its member does not answer leaves the watcher attached in etcd3's
 * watch manager; closing the client empties the manager (client.ts closeEtcdClient).
 */
function cancelBounded(w: Watcher): Promise<void> {
  let cancelling: Promise<void>;
  try {
    cancelling = w.cancel();
  } catch {
    return Promise.resolve(); // etcd3 can throw at once (no stream left): nothing to wait for
  }
  return withTimeout(cancelling, CANCEL_BOUND_MS, () => new Error("cancel timed out")).then(
    () => undefined,
    () => undefined,
  );
}

export class ResilientWatch {
  private watcher: Watcher | null = null;
  /** The stream being created (not yet connected), cancelled too when the watch is. */
  private attempt: Watcher | null = null;
  private member: Member | null = null;
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  private moving: Promise<void> | null = null;

  constructor(
    private readonly ctx: Context,
    private readonly spec: WatchSpec,
  ) {}

  /** Creates the first stream (bounded by the request deadline) and starts watching the member's health. */
  async start(): Promise<void> {
    await this.establish(this.spec.startRevision);
    if (this.closed) return;
    this.timer = setInterval(() => {
      if (this.member !== null && this.ctx.health.member(this.member.url) === false) void this.move("its member stopped answering with a leader");
    }, Math.max(200, Math.min(1000, this.ctx.opts.healthIntervalMs)));
    this.timer.unref();
  }

  private async establish(startRevision: string | null): Promise<void> {
    const deadline = Date.now() + this.ctx.opts.commitTimeoutMs;
    let last: unknown = null;
    let exclude: Member | undefined = this.member ?? undefined;
    while (!this.closed && Date.now() < deadline) {
      const member = this.ctx.router.pick(exclude);
      const bound = Math.max(50, Math.min(this.ctx.opts.attemptTimeoutMs, deadline - Date.now()));
      let builder = member.client.watch();
      builder = this.spec.key !== undefined ? builder.key(this.spec.key) : builder.prefix(this.spec.prefix!);
      if (startRevision !== null) builder = builder.startRevision(startRevision);
      if (this.spec.onlyPut) builder = builder.only("put");
      const w = builder.watcher();
      this.attempt = w;
      try {
        await withTimeout(
          new Promise<void>((resolve, reject) => {
            w.once("connected", () => resolve());
            w.once("error", reject);
          }),
          bound,
          () => new GRPCDeadlineExceededError(`etcd member ${member.url} did not create the ${this.spec.what} watch within ${bound} ms`),
        );
      } catch (err) {
        last = err;
        this.ctx.router.penalize(member);
        exclude = member;
        if (!this.closed) void cancelBounded(w); // else cancel() has cancelled it
        continue;
      } finally {
        this.attempt = null;
      }
      if (this.closed) return; // cancel() has cancelled it (it was the attempt then)
      w.on("put", (kv) => this.spec.onPut(kv));
      if (this.spec.onDelete) w.on("delete", (kv) => this.spec.onDelete!(kv));
      // Only the current stream moves the watch: a dropped one still attached may report later.
      w.on("error", (err: Error) => void (this.watcher === w && this.move(`the stream failed (${err.message})`)));
      w.on("disconnected", () => void (this.watcher === w && this.move("the stream was disconnected")));
      this.dropWatcher();
      this.watcher = w;
      this.member = member;
      return;
    }
    if (this.closed) return;
    throw last ?? new GRPCDeadlineExceededError(`no etcd member created the ${this.spec.what} watch`);
  }

  /** Cancels the current stream without waiting for its member (bounded); the next one replaces it. */
  private dropWatcher(): void {
    const w = this.watcher;
    this.watcher = null;
    if (w !== null) void cancelBounded(w);
  }

  /** Re-creates the stream on another member, then runs the recheck. Never throws; retries while open. */
  private move(why: string): Promise<void> {
    if (this.moving !== null || this.closed) return this.moving ?? Promise.resolve();
    this.moving = (async () => {
      const old = this.watcher;
      this.watcher = null;
      this.ctx.log.warn({ watch: this.spec.what, member: this.member?.url, why }, "etcd watch moved to another member");
      if (old !== null) void cancelBounded(old);
      const retry = new Retry();
      while (!this.closed) {
        try {
          await this.establish(null);
          if (this.closed) return; // cancelled while the stream was being created: nothing to recheck
          await this.spec.recheck();
          return;
        } catch (err) {
          // The stream may have been created and only the recheck failed (a read during a quorum
          // loss): it is dropped before the next one is created, not left attached beside it.
          this.dropWatcher();
          this.ctx.log.warn({ watch: this.spec.what, err: (err as Error).message }, "etcd watch could not be re-created yet; retrying");
          await retry.pause(undefined, false);
        }
      }
    })().finally(() => {
      this.moving = null;
    });
    return this.moving;
  }

  /** Cancels the stream; bounded (a silent member is not waited for). */
  async cancel(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    // A stream still being created (a move in progress) is cancelled now, not when its creation
    // ends: the client may be closed before then (client.ts closeEtcdClient empties it anyway).
    if (this.attempt !== null) void cancelBounded(this.attempt);
    this.attempt = null;
    const w = this.watcher;
    this.watcher = null;
    if (w !== null) await cancelBounded(w);
  }
}
