/**
 * Outside observations into inboxes: `Harness.post` (a caller in this process) and the storage
 * mailbox (other processes, `cairn post`), judged by checkOutsideObservation, delivered by one
 * `inbox_received` commit each. Redelivery is a no-op (the observation id is the identity).
 */
import { event, identity } from "../state/events.js";
import type { Database, PostedMessage } from "../storage/contract.js";
import { START_REQUEST_KIND } from "./start-request.js";
import { applySteer, STEER_KIND } from "./steer.js";
import { FORK_KIND, ForkRequest, performFork } from "./fork.js";
import { LogCorrupt } from "../state/reducer.js";
import { SteerRequest } from "../state/steer.js";
import { StorageRejected } from "../storage/errors.js";
import { ConfigError } from "../errors.js";
import type { HarnessCore } from "./core.js";
import { checkOutsideObservation, OutsideObservation, outsideToObservation, payloadProblem } from "./observations.js";

/** Delivers `observation` to `session`'s inbox (see Harness.post for the rules). */
export async function postObservation(host: HarnessCore, session: string, observation: OutsideObservation): Promise<{ duplicate: boolean }> {
  const tooBig = payloadProblem((observation as { payload?: unknown } | null)?.payload);
  if (tooBig !== null) throw new ConfigError(`bad observation: ${tooBig}`);
  let parsed: ReturnType<typeof OutsideObservation.safeParse>;
  try {
    parsed = OutsideObservation.safeParse(observation);
  } catch (err) {
    if (err instanceof RangeError) throw new ConfigError("bad observation: the payload is nested too deeply.");
    throw err;
  }
  if (!parsed.success) throw new ConfigError(`bad observation: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
  const s = host.session(session);
  if (s === undefined) throw new ConfigError(`session "${session}" does not exist in database "${host.name}".`);
  const check = checkOutsideObservation(s, parsed.data, host.limits.inboxLimit);
  if (!check.ok) {
    if (check.reason === "inbox_full") throw new StorageRejected("backlog_full", check.message);
    throw new StorageRejected(check.reason === "conflict" ? "conflict" : "invalid", check.message);
  }
  if (check.duplicate) return { duplicate: true };
  const at = host.nowIso();
  const obs = outsideToObservation(parsed.data, at);
  try {
    await host.commit([event("inbox_received", session, identity.inbox(session, obs.id), at, { observation: obs })]);
  } catch (err) {
    // A concurrent post of the same id won the race: judge this one against what was committed.
    if (!(err instanceof StorageRejected && err.reason === "duplicate_identity")) throw err;
    const again = checkOutsideObservation(host.session(session)!, parsed.data, Number.MAX_SAFE_INTEGER);
    if (again.ok) return { duplicate: true };
    throw new StorageRejected(again.reason === "conflict" ? "conflict" : "invalid", again.message);
  }
  return { duplicate: false };
}

/** Moves messages from the storage mailbox into inboxes. Serialized: a drain asked for while one runs runs after it. */
export class MailboxDelivery {
  private draining = false;
  private again = false;
  /**
   * True when the mailbox may hold messages that wait for an inbox to make room: the last drain left
   * some behind (an inbox was full) or failed, or none ran yet. Only then is a drain worth its read
   * after a turn consumed inbox items; new messages have their own signal.
   */
  private behind = true;
  /** The drain running now, if one is. */
  private current: Promise<void> | null = null;

  constructor(
    private readonly host: HarnessCore,
    private readonly db: Database,
    /** Handles a start request (start-request.ts): the run is started before later messages are judged. */
    private readonly onStart: ((m: PostedMessage) => Promise<void>) | null = null,
    /** Runs one batch's delivery (the harness holds the drivers of runs it starts until it ends). */
    private readonly around: (deliver: () => Promise<void>) => Promise<void> = (deliver) => deliver(),
    /** Starts driving a run this delivery created (a fork, once its copy is complete). */
    private readonly begin: (session: string) => void = () => undefined,
  ) {}

  /**
   * Whether a turn that consumed inbox items should drain the mailbox: messages were left behind for
   * a full inbox, or a drain is running now (it may be judging an inbox this turn just emptied; asking
   * again makes it run once more after).
   */
  wantsDrainAfterConsume(): boolean {
    return this.behind || this.draining;
  }

  /** Resolves once no drain runs (the one running now, and any it was asked to run again, have ended). */
  drained(): Promise<void> {
    return this.current ?? Promise.resolve();
  }

  async drain(): Promise<void> {
    if (this.draining) {
      this.again = true;
      return this.current ?? undefined;
    }
    this.draining = true;
    let done!: () => void;
    this.current = new Promise<void>((resolve) => (done = resolve));
    try {
      do {
        this.again = false;
        if (this.host.stopping()) return;
        await this.around(() => this.drainOnce());
      } while (this.again);
    } catch (err) {
      this.behind = true;
      if (!this.host.stopping()) this.host.logger.error({ err }, "could not drain the mailbox");
    } finally {
      this.draining = false;
      this.current = null;
      done();
    }
  }

  private async drainOnce(): Promise<void> {
    const { host } = this;
    this.behind = true;
    const messages = await this.db.drain();
    let ackTo = 0;
    let leftBehind = false;
    const full = new Set<string>();
    for (const m of messages) {
      if (m.kind === STEER_KIND) {
        // Before the full-inbox rule: an operator's request never waits behind observations.
        await this.steer(m);
        if (!leftBehind) ackTo = m.mseq;
        continue;
      }
      if (m.kind === FORK_KIND) {
        // Acknowledged only once the copy is complete: an owner killed mid-copy leaves it to the next.
        await this.fork(m);
        if (!leftBehind) ackTo = m.mseq;
        continue;
      }
      if (full.has(m.session)) {
        leftBehind = true;
        continue;
      }
      if (m.kind === START_REQUEST_KIND && this.onStart !== null) {
        await this.onStart(m);
        if (!leftBehind) ackTo = m.mseq;
        continue;
      }
      const s = host.session(m.session);
      const bad = payloadProblem(m.payload);
      const parsed = bad === null ? OutsideObservation.safeParse({ id: m.id, kind: m.kind, payload: m.payload }) : null;
      if (s === undefined || parsed === null || !parsed.success) {
        host.logger.warn({ session: m.session, id: m.id }, "dropped a mailbox message for an unknown session or with a bad shape");
        if (s !== undefined) await this.refused(m, "invalid", bad ?? "the message is not a valid observation (id, kind and a JSON payload)");
        if (!leftBehind) ackTo = m.mseq;
        continue;
      }
      const check = checkOutsideObservation(s, parsed.data, host.limits.inboxLimit);
      if (!check.ok && check.reason === "inbox_full") {
        // Leave it in the mailbox until that inbox drains; other sessions' messages go on. Only
        // messages before the first one left behind can be acknowledged; later ones are
        // delivered now and again after, which their identities make a no-op.
        full.add(m.session);
        leftBehind = true;
        continue;
      }
      if (check.ok && !check.duplicate) {
        const obs = outsideToObservation(parsed.data, m.at);
        await host.commit([event("inbox_received", m.session, identity.inbox(m.session, obs.id), host.nowIso(), { observation: obs })]);
      } else if (!check.ok) {
        host.logger.warn({ session: m.session, id: m.id, reason: check.reason }, `refused a mailbox message: ${check.message}`);
        await this.refused(m, check.reason === "inbox_full" ? "invalid" : check.reason, check.message);
      }
      if (!leftBehind) ackTo = m.mseq;
    }
    if (ackTo > 0) await this.db.ack(ackTo);
    this.behind = leftBehind;
  }

  /** An operator's request (pause, unpause, cancel, approve, deny): applied, or refused with a reason the requester sees. */
  private async steer(m: PostedMessage): Promise<void> {
    const s = this.host.session(m.session);
    if (s === undefined) {
      this.host.logger.warn({ session: m.session, id: m.id }, "dropped an operator's request for a run that does not exist");
      return;
    }
    const parsed = SteerRequest.safeParse(m.payload);
    if (!parsed.success) {
      await this.refused(m, "invalid", `not a valid request: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
      return;
    }
    const verdict = await applySteer(this.host, m.session, m.id, parsed.data);
    if (verdict.kind === "refused") {
      this.host.logger.warn({ session: m.session, id: m.id, code: verdict.code }, `refused an operator's request: ${verdict.message}`);
      await this.refused(m, verdict.code, verdict.message);
    }
  }

  /** A fork request (`cairn fork`): the copy is made, finished, or refused with a reason the requester sees on the origin. */
  private async fork(m: PostedMessage): Promise<void> {
    const parsed = ForkRequest.safeParse(m.payload);
    if (!parsed.success) {
      this.host.logger.warn({ session: m.session, id: m.id }, "dropped a malformed fork request from the mailbox");
      return;
    }
    const r = parsed.data;
    let result: Awaited<ReturnType<typeof performFork>>;
    try {
      result = await performFork(this.host, this.db, m.session, r, this.begin);
    } catch (err) {
      // A log the plan cannot fold would refuse it again on every delivery: refuse it once, so that
      // it does not hold up the requests behind it. Storage errors leave it for the next drain.
      if (!(err instanceof LogCorrupt)) throw err;
      this.host.logger.error({ err, session: m.session, origin: r.origin }, "a fork request cannot be planned");
      result = { kind: "refused", code: "invalid", message: `the fork cannot be made: ${err.message}` };
    }
    if (result.kind !== "refused") return;
    this.host.logger.warn({ session: m.session, origin: r.origin, id: m.id }, `refused a fork request: ${result.message}`);
    // The refusal is recorded on a run that exists: the origin, or the run already holding the id.
    const on = this.host.session(r.origin) !== undefined ? r.origin : this.host.session(m.session) !== undefined ? m.session : null;
    if (on !== null) await this.refused({ ...m, session: on }, result.code, result.message);
  }

  /** A message refused at drain time becomes an event the poster sees (`cairn status`, `post --wait`). */
  private async refused(m: { mseq: number; session: string; id: string; kind: string }, code: "ended" | "conflict" | "forged" | "invalid", reason: string): Promise<void> {
    const id = typeof m.id === "string" ? m.id.slice(0, 200) : "";
    const kind = typeof m.kind === "string" ? m.kind.slice(0, 100) : "";
    try {
      await this.host.commit([event("post_refused", m.session, identity.postRefused(m.session, m.mseq), this.host.nowIso(), { id, kind, code, reason: reason.slice(0, 2000) })]);
    } catch (err) {
      if (!(err instanceof StorageRejected && err.reason === "duplicate_identity")) throw err;
    }
  }
}
