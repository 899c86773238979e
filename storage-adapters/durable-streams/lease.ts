/**
 * Owner leases of the Durable Streams adapter: liveness for standby workers, never safety (the
 * producer epoch on the log fences, as before). The records and who holds by them: lease-fold.ts.
 *
 * A lease is live while its holder keeps appending renewals (every third of its length). Each reader
 * times it on its own monotonic clock from when it observed the holder's latest record: no clock of
 * two machines is ever compared, and the server's clock is not used. A reader that has just started
 * has observed nothing older than now, so it waits one lease length for a holder that died before it
 * looked (a holder on this host whose process is gone costs no wait). The holder gives the lease up
 * (`onLost`) once a renewal has not been acknowledged for three quarters of its length: before any
 * reader, whose clock started at or after that renewal was sent, can see it expire.
 *
 * Taking the lease appends a `take` naming the holder it replaces; the stream's order decides between
 * two takers of the same lease (the first valid one holds), and the taker learns the outcome by reading
 * the stream back up to its record. Waiters queue with `queue` records and renew their place; a free
 * lease goes to the oldest live waiter.
 *
 * Bounded: a generation holds about ROLL_RECORDS records, then the holder appends `moved` and closes
 * it in one request, creates the next generation and appends its `carry` (every reader computes the
 * same carry from the closed generation, so a follower can supply it when the holder died mid-roll),
 * the index gets one record, and the generation before the previous one is deleted.
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import type { HeldLease, LeaseTicket, LeaseView, OwnerInfo, OwnerLeases } from "../../src/storage/contract.js";
import { pidAlive } from "../../src/storage/pid.js";
import { checkDatabaseName } from "../../src/storage/semantics.js";
import { START, type Wire } from "./http.js";
import { applyLease, carryOf, emptyState, leaseIndex, leaseStream, parseIndex, parseLeaseRecord, ROLL_RECORDS, type Entry, type LeaseRecord, type LeaseState } from "./lease-fold.js";
import { Lock, readFailure } from "./log-view.js";
import { sleep } from "./mailbox.js";

/** How long a release or a withdrawal waits for the server before it is left to expire. */
const GIVE_UP_MS = 2000;

/** One database's lease as this process has read it, caught up on demand. */
class LeaseLog {
  gen: number | null = null;
  private offset = START;
  state: LeaseState = emptyState();
  /** When this process observed each token's latest record (performance.now()). */
  private readonly seen = new Map<string, number>();
  /** When this process first observed each token. */
  private readonly first = new Map<string, number>();
  readonly lock = new Lock();
  /** The tokens of the leases this process holds. */
  readonly mine = new Set<string>();
  /** This process closed the current generation: it creates the next one at once. */
  private rolling = false;
  /** The carry of the current generation, as this process read the previous one's end (until appended). */
  private supply: Extract<LeaseRecord, { t: "carry" }> | null = null;
  /** The current generation came from the index and its carry was missing: the previous one was read instead. */
  private steppedBack = false;

  constructor(
    private readonly wire: Wire,
    readonly name: string,
    private readonly ttlMs: number,
  ) {}

  /** Whether this process has seen `k` write again since it first saw it (else its renewals may have stopped long ago). */
  confirmed(k: string): boolean {
    const first = this.first.get(k);
    const at = this.seen.get(k);
    return first !== undefined && at !== undefined && at > first;
  }

  /** Whether `e` is live as this process sees it now. */
  live(e: Entry): boolean {
    const at = this.seen.get(e.k);
    if (at === undefined || performance.now() - at >= e.l) return false;
    return !(e.o.host === hostname() && !pidAlive(e.o.pid));
  }

  /** Reads every record up to the end of the current generation, following rolls. `create`: make generation 0 when there is none yet. */
  async sync(create: boolean): Promise<"ok" | "none"> {
    if (this.gen === null && (await this.locate(create)) === "none") return "none";
    for (let hops = 0; ; hops++) {
      if (hops > 200) throw new Error(`the owner lease of "${this.name}": generation ${this.gen} could not be read to a settled end`);
      const res = await this.wire.read(leaseStream(this.name, this.gen!), this.offset);
      if (res.kind === "not-found" || res.kind === "gone") {
        // Deleted behind a process that fell two rolls behind: start again from the index.
        this.gen = null;
        if ((await this.locate(create)) === "none") return "none";
        continue;
      }
      if (res.kind === "timeout") return "ok";
      for (const m of res.messages) {
        const r = parseLeaseRecord(m);
        if (r !== null) this.apply(r);
      }
      this.offset = res.next;
      if (this.state.moved !== null) {
        await this.follow(this.state.moved, carryOf(this.state));
        continue;
      }
      if (!(res.upToDate || res.messages.length === 0)) continue;
      if (this.state.carried) return "ok";
      await this.settle();
    }
  }

  /**
   * At the end of a generation whose carry is not there yet: a process that followed the previous
   * generation appends the carry itself (once; copies count once, with the same content); one that
   * came from the index steps back to the previous generation, to follow it; else it waits a moment.
   */
  private async settle(): Promise<void> {
    if (this.supply !== null) {
      const carry = this.supply;
      this.supply = null;
      if ((await this.wire.appendPlain(leaseStream(this.name, this.gen!), JSON.stringify(carry))) === "appended") return;
    }
    if (!this.steppedBack && this.gen! >= 1) {
      this.steppedBack = true;
      this.enter(this.gen! - 1, null);
      return;
    }
    await sleep(50);
  }

  private apply(r: LeaseRecord): void {
    const { seen, gone } = applyLease(this.state, r);
    const now = performance.now();
    for (const k of gone) {
      this.seen.delete(k);
      this.first.delete(k);
    }
    // A carry renews nothing: a token keeps the time it was last seen writing.
    for (const k of seen) {
      if (r.t === "carry" && this.seen.has(k)) continue;
      if (!this.first.has(k)) this.first.set(k, now);
      this.seen.set(k, now);
    }
  }

  /**
   * Moves to generation `g` after the previous one ended with `carry`. Only the roller creates it, at
   * once; others wait for it to exist, so that two processes do not create it at the same moment. When
   * the roller died between closing the old generation and creating the new one, a follower creates it
   * after a lease length.
   */
  private async follow(g: number, carry: Extract<LeaseRecord, { t: "carry" }>): Promise<void> {
    const path = leaseStream(this.name, g);
    const end = performance.now() + this.ttlMs;
    // The holder never waits (only a holder rolls: when the roller is gone, the holder is too, unless
    // it is this process, whose lease must not run out while it waits).
    const now = this.rolling || (carry.holder !== null && this.mine.has(carry.holder.k));
    let exists = false;
    while (!now && !(exists = await this.wire.exists(path)) && performance.now() < end) await sleep(Math.min(200, this.ttlMs / 10));
    if (!exists) await this.wire.create(path);
    this.enter(g, carry);
  }

  /** Starts reading generation `g` from its beginning; `supply`: the carry this process knows for it. */
  private enter(g: number, supply: Extract<LeaseRecord, { t: "carry" }> | null): void {
    this.gen = g;
    this.offset = START;
    this.state = emptyState(g === 0);
    this.supply = supply;
  }

  /** Finds the newest generation in the index (none: 0, created when `create`). */
  private async locate(create: boolean): Promise<"ok" | "none"> {
    let g = 0;
    let offset = START;
    for (;;) {
      const res = await this.wire.read(leaseIndex(this.name), offset);
      if (res.kind !== "data") break;
      for (const m of res.messages) g = Math.max(g, parseIndex(m) ?? 0);
      offset = res.next;
      if (res.upToDate || res.messages.length === 0) break;
    }
    if (g === 0) {
      if (!(await this.wire.exists(leaseStream(this.name, 0)))) {
        if (!create) return "none";
        await this.wire.create(leaseStream(this.name, 0));
      }
    }
    this.steppedBack = false;
    this.enter(g, null);
    return "ok";
  }

  /** Appends `r` to the current generation (following a roll that closed it first). */
  async append(r: LeaseRecord): Promise<void> {
    for (let tries = 0; tries < 8; tries++) {
      if (this.gen === null) await this.sync(true);
      const result = await this.wire.appendPlain(leaseStream(this.name, this.gen!), JSON.stringify(r));
      if (result === "appended") return;
      if (result === "not-found") this.gen = null;
      await this.sync(true);
    }
    throw new Error(`the owner lease of "${this.name}" moved on at every try`);
  }

  /** Ends the current generation and starts the next (the holder's job, at ROLL records). */
  async roll(): Promise<void> {
    const g = this.gen!;
    const moved = await this.wire.appendPlain(leaseStream(this.name, g), JSON.stringify({ v: 1, t: "moved", to: g + 1 } satisfies LeaseRecord), { close: true });
    this.rolling = moved === "appended";
    try {
      await this.sync(true);
    } finally {
      this.rolling = false;
    }
    if (moved !== "appended") return;
    await this.wire.create(leaseIndex(this.name));
    await this.wire.appendPlain(leaseIndex(this.name), JSON.stringify({ v: 1, t: "gen", g: g + 1 }));
    if (g >= 1) await this.wire.remove(leaseStream(this.name, g - 1)).catch(() => false);
  }
}

/** Owner leases on the server behind `wire`, each `ttlMs` long; `rollRecords` bounds a generation. */
export function durableStreamsLeases(wire: Wire, ttlMs: number, rollRecords = ROLL_RECORDS): OwnerLeases {
  const logs = new Map<string, LeaseLog>();
  const logOf = (name: string): LeaseLog => {
    checkDatabaseName(name);
    let log = logs.get(name);
    if (log === undefined) {
      log = new LeaseLog(wire, name, ttlMs);
      logs.set(name, log);
    }
    return log;
  };
  const failing = async <T>(name: string, what: string, body: () => Promise<T>): Promise<T> => {
    try {
      return await body();
    } catch (err) {
      throw readFailure(name, `${what} its owner lease`, err);
    }
  };

  return {
    ttlMs,

    async read(name: string): Promise<LeaseView | null> {
      const log = logOf(name);
      // A holder this process has seen write only once may have stopped renewing long ago: it is
      // shown live once a renewal of it is seen, and not live when none comes within two renewal
      // periods (`acquire` still waits the whole lease for it).
      const end = performance.now() + (ttlMs * 2) / 3 + 100;
      for (;;) {
        const view = await failing(name, "reading", () =>
          log.lock.run(async (): Promise<{ view: LeaseView | null; sure: boolean }> => {
            if ((await log.sync(false)) === "none" || log.state.holder === null) return { view: null, sure: true };
            const h = log.state.holder;
            const sure = log.confirmed(h.k) || !log.live(h) || performance.now() > end;
            return { view: { owner: h.o, live: log.live(h) && (log.confirmed(h.k) || log.mine.has(h.k)) }, sure: sure || log.mine.has(h.k) };
          }),
        );
        if (view.sure) return view.view;
        await sleep(Math.min(200, ttlMs / 10));
      }
    },

    async acquire(name: string, owner: OwnerInfo, options: { readonly force?: boolean; readonly ticket?: LeaseTicket } = {}): Promise<HeldLease | null> {
      const log = logOf(name);
      const ticket = options.ticket instanceof DsTicket ? options.ticket : undefined;
      const force = options.force === true;
      const k = randomUUID();
      let sentAt = 0;
      const taken = await failing(name, "taking", () =>
        log.lock.run(async () => {
          await log.sync(true);
          const holder = log.state.holder;
          if (!force) {
            if (holder !== null && log.live(holder)) return false;
            const first = log.state.queue.find((e) => log.live(e));
            if (first !== undefined && first.k !== ticket?.k) return false;
          }
          sentAt = performance.now();
          await log.append({ v: 1, t: "take", k, o: owner, l: ttlMs, prev: holder?.k ?? null, force, ...(ticket ? { w: ticket.k } : {}) });
          // Read back past the record: the stream's order says whether this take is the valid one.
          await log.sync(true);
          return log.state.holder?.k === k;
        }),
      );
      if (!taken) return null;
      await ticket?.stop();
      return new DsHeldLease(log, k, ttlMs, rollRecords, sentAt);
    },

    async enqueue(name: string, owner: OwnerInfo): Promise<LeaseTicket> {
      const log = logOf(name);
      const k = randomUUID();
      await failing(name, "queueing for", () => log.lock.run(() => log.append({ v: 1, t: "queue", k, o: owner, l: ttlMs })));
      return new DsTicket(log, k, ttlMs);
    },
  };
}

/** Bounded by GIVE_UP_MS; never throws. */
async function bounded(work: Promise<unknown>): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([work.catch(() => undefined), new Promise((r) => (timer = setTimeout(r, GIVE_UP_MS)))]);
  clearTimeout(timer);
}

/** This process's place in the queue, renewed every third of the lease until withdrawn. */
class DsTicket implements LeaseTicket {
  private timer: NodeJS.Timeout | null;

  constructor(
    private readonly log: LeaseLog,
    readonly k: string,
    ttlMs: number,
  ) {
    const renew = (): void => {
      if (this.timer === null) return;
      // A lost renewal is retried at the next tick (the place lasts three).
      this.log.lock.run(() => this.log.append({ v: 1, t: "wait", k: this.k })).catch(() => undefined);
    };
    this.timer = setInterval(renew, Math.max(50, Math.floor(ttlMs / 3)));
    this.timer.unref();
  }

  /** Stops renewing (the take that used this ticket removed its place). */
  async stop(): Promise<void> {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  async withdraw(): Promise<void> {
    if (this.timer === null) return;
    await this.stop();
    // Left behind when the server does not answer: it drops out after its lease length.
    await bounded(this.log.lock.run(() => this.log.append({ v: 1, t: "leave", k: this.k })));
  }
}

class DsHeldLease implements HeldLease {
  private readonly listeners: ((why: string) => void)[] = [];
  private lost: string | null = null;
  private released = false;
  private renewing = false;
  private timer: NodeJS.Timeout | null;
  private watchdog: NodeJS.Timeout | null = null;
  /** When the latest acknowledged renewal (or the take) was sent. */
  private ackedSentAt: number;
  private epoch: number | undefined;

  constructor(
    private readonly log: LeaseLog,
    private readonly k: string,
    private readonly ttlMs: number,
    private readonly rollRecords: number,
    takeSentAt: number,
  ) {
    // Counted from when the take was sent: no reader saw it earlier.
    this.ackedSentAt = takeSentAt;
    log.mine.add(k);
    this.arm();
    this.timer = setInterval(() => void this.renew(), Math.max(50, Math.floor(ttlMs / 3)));
    this.timer.unref();
  }

  /** The moment no reader can be sure to still see the lease live, less a quarter of it. */
  private get limit(): number {
    return this.ackedSentAt + (this.ttlMs * 3) / 4;
  }

  private arm(): void {
    if (this.watchdog !== null) clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => this.checkDeadline(), Math.max(1, this.limit - performance.now()));
    this.watchdog.unref();
  }

  private checkDeadline(): boolean {
    if (performance.now() < this.limit) return false;
    this.lose(`no renewal was acknowledged by the Durable Streams server for ${Math.round(performance.now() - this.ackedSentAt)} ms (the lease is ${this.ttlMs} ms)`);
    return true;
  }

  private async renew(): Promise<void> {
    if (this.released || this.lost !== null || this.renewing) return;
    // Frozen or starved past the margin: renewing now could revive a lease a standby already saw end.
    if (this.checkDeadline()) return;
    this.renewing = true;
    try {
      await this.log.lock.run(async () => {
        const sentAt = performance.now();
        await this.log.append({ v: 1, t: "renew", k: this.k, ...(this.epoch !== undefined ? { e: this.epoch } : {}) });
        await this.log.sync(true);
        if (this.log.state.holder?.k !== this.k) return this.lose("another process took the lease over");
        this.ackedSentAt = sentAt;
        this.arm();
        if (this.log.state.records >= this.rollRecords) await this.log.roll();
      });
    } catch {
      // Unanswered: the next tick tries again; the watchdog ends the lease in time.
    } finally {
      this.renewing = false;
    }
  }

  private lose(why: string): void {
    if (this.lost !== null || this.released) return;
    this.lost = why;
    this.stopTimers();
    for (const l of this.listeners) l(why);
  }

  private stopTimers(): void {
    this.log.mine.delete(this.k);
    if (this.timer !== null) clearInterval(this.timer);
    if (this.watchdog !== null) clearTimeout(this.watchdog);
    this.timer = null;
    this.watchdog = null;
  }

  async update(epoch: number): Promise<void> {
    if (this.released) return;
    this.epoch = epoch;
    await this.log.lock.run(async () => {
      await this.log.append({ v: 1, t: "renew", k: this.k, e: epoch });
      await this.log.sync(true);
      if (this.log.state.holder?.k !== this.k) this.lose("another process took the lease over");
    });
  }

  onLost(listener: (why: string) => void): void {
    if (this.lost !== null) listener(this.lost);
    else this.listeners.push(listener);
  }

  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.stopTimers();
    // A release not answered in time: the lease expires after its length, as if the holder had died.
    await bounded(this.log.lock.run(() => this.log.append({ v: 1, t: "release", k: this.k })));
  }
}
