/**
 * A session's clocks: one armed timer per registered timer not fired yet, and one for the wall-time
 * budget. The timer functions are injected (HarnessWorld.timers), so tests run time forward without
 * sleeping. Which timer is due is decided in src/state (nextStep, dueTimers); this file arms the
 * wake-ups and commits what fired.
 *
 * Both arms work even while the driver's loop is busy in a model call or a validator: a timer fires
 * and the budget ends the run (aborting the call) without waiting for the loop.
 */
import { timerFiredEvents } from "../state/outcomes.js";
import { wallDeadline } from "../state/next-step.js";
import type { SessionProjection } from "../state/projection.js";
import { z } from "zod";
import { type CellCaller, type CellReply, CellSocket } from "./cell-socket.js";
import { event, identity } from "../state/events.js";
import type { HarnessCore } from "./core.js";
import { EffectRequests } from "./effects.js";
import type { SessionContext } from "./session.js";
import type { TimerFunctions } from "./world.js";

/** setTimeout's longest delay; longer waits are re-armed in chunks. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export class SessionTimers {
  private readonly armed = new Map<string, unknown>();
  private readonly firing = new Map<string, Promise<void>>();
  private budget: unknown = null;
  private stopped = false;

  constructor(
    private readonly ctx: SessionContext,
    private readonly fns: TimerFunctions,
    /** Called after the wall-time budget ended the run: stop a model call in flight. */
    private readonly onBudgetEnded: () => void,
  ) {}

  /** Arms a wake-up for every timer not fired yet and not armed, and for the wall-time budget. */
  arm(s: SessionProjection, now: number): void {
    if (this.stopped) return;
    for (const t of s.timers.values()) {
      if (t.fired || this.armed.has(t.timer_id)) continue;
      this.armTimer(t.timer_id, Date.parse(t.due_at) - now);
    }
    const deadline = wallDeadline(s);
    if (deadline !== null && this.budget === null && now < deadline) {
      // Ten ms past the deadline, so the budget is exhausted when the callback looks.
      this.budget = this.fns.setTimeout(() => this.onBudget(deadline), Math.min(Math.ceil(deadline - now) + 10, MAX_TIMER_MS));
    }
  }

  /**
   * Commits that timer `timerId` fired (and its observation), once: a second call while the first
   * commits shares its outcome. Does nothing for a fired or unknown timer, an ended run, or a
   * stopping harness; re-arms a timer that is not due yet.
   */
  fire(timerId: string): Promise<void> {
    const inFlight = this.firing.get(timerId);
    if (inFlight !== undefined) return inFlight;
    const p = this.fireOnce(timerId).finally(() => this.firing.delete(timerId));
    this.firing.set(timerId, p);
    return p;
  }

  /** Disarms everything; nothing fires after. */
  stop(): void {
    this.stopped = true;
    for (const h of this.armed.values()) this.fns.clearTimeout(h);
    this.armed.clear();
    if (this.budget !== null) this.fns.clearTimeout(this.budget);
    this.budget = null;
  }

  private armTimer(timerId: string, delay: number): void {
    // The handle stays in `armed` after it fires: a timer is armed once per driver.
    const handle = this.fns.setTimeout(() => {
      this.fire(timerId)
        .catch((err) => {
          if (!this.ctx.core.stopping()) this.ctx.core.logger.error({ session: this.ctx.id, err, timer: timerId }, "could not record a fired timer");
        })
        .finally(() => this.ctx.wake());
    }, Math.min(Math.max(0, delay), MAX_TIMER_MS));
    this.armed.set(timerId, handle);
  }

  private async fireOnce(timerId: string): Promise<void> {
    const { core } = this.ctx;
    const s = this.ctx.session();
    const t = s.timers.get(timerId);
    if (t === undefined || t.fired || core.stopping() || s.terminal !== null) return;
    const now = core.world.clock.now();
    const due = Date.parse(t.due_at);
    if (now < due) {
      // Not due yet (setTimeout caps delays): arm the rest.
      if (!this.stopped) this.armTimer(timerId, due - now);
      return;
    }
    const events = timerFiredEvents(s, t, now, core.nowIso());
    await core.commit(events);
    core.metrics?.timerFired(Math.max(0, now - due) / 1000);
  }

  private onBudget(deadline: number): void {
    this.budget = null;
    const { core } = this.ctx;
    if (core.stopping() || this.stopped) return;
    if (core.world.clock.now() < deadline) return this.ctx.wake(); // the driver re-arms the rest
    const max = this.ctx.session().budgets.max_wall_seconds;
    void this.ctx
      .endRun("failure", `the wall-time budget of ${max} s is exhausted`)
      .then(() => this.onBudgetEnded())
      .catch((err) => core.logger.error({ session: this.ctx.id, err }, "could not end the run at its wall-time budget"));
  }
}

/** A timer request from a cell (`cairn timer`): the run and cell are the caller's, never named here. */
export const TimerRequest = z.strictObject({
  timer_id: z.string().min(1).max(200).regex(/^[A-Za-z0-9._:-]+$/, "timer_id may use letters, digits and . _ : -"),
  delay_seconds: z.number().nonnegative().max(10 * 365 * 86400).optional(),
  due_at: z.iso.datetime().optional(),
  note: z.string().max(2000).optional(),
  /** Accepted for older clients; ignored: the token says who asks. */
  session: z.string().optional(),
  cell: z.number().int().positive().nullable().optional(),
});
export type TimerRequest = z.infer<typeof TimerRequest>;

/**
 * Registers a timer for `caller`'s run: committed before the reply. The same timer id again answers
 * the registration that holds.
 */
export async function registerTimer(core: HarnessCore, raw: Record<string, unknown>, caller: CellCaller): Promise<CellReply> {
  const parsed = TimerRequest.safeParse(raw);
  if (!parsed.success) return { ok: false, error: `bad timer request: ${parsed.error.issues.map((i) => `${i.path.join(".") || "request"}: ${i.message}`).join("; ")}` };
  const req = parsed.data;
  if ((req.delay_seconds === undefined) === (req.due_at === undefined)) return { ok: false, error: "give exactly one of delay_seconds or due_at" };
  const session = caller.session;
  const s = core.session(session);
  if (s === undefined) return { ok: false, error: `session "${session}" does not exist` };
  if (s.terminal !== null) return { ok: false, error: `session ${session} has ended; it takes no timers` };
  const existing = s.timers.get(req.timer_id);
  if (existing !== undefined) return { ok: true, timer_id: existing.timer_id, due_at: existing.due_at };
  const now = core.world.clock.now();
  const due = req.due_at !== undefined ? Date.parse(req.due_at) : now + (req.delay_seconds ?? 0) * 1000;
  const dueAt = new Date(due).toISOString();
  await core.commit([
    event("timer_registered", session, identity.timer(session, req.timer_id), core.nowIso(), {
      timer_id: req.timer_id,
      cell_id: caller.cell,
      due_at: dueAt,
      note: req.note ?? null,
    }),
  ]);
  return { ok: true, timer_id: req.timer_id, due_at: dueAt };
}
/** Sleeps that end early (false) when the harness stops: the model round's back-off. */
export class Sleeper {
  private readonly sleepers = new Set<() => void>();

  constructor(
    private readonly fns: TimerFunctions,
    private readonly open: () => boolean,
  ) {}

  /** Resolves after `ms` with true, or at once with false when the harness stops. */
  sleep(ms: number): Promise<boolean> {
    if (!this.open()) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = () => {
        this.fns.clearTimeout(t);
        this.sleepers.delete(done);
        resolve(this.open());
      };
      const t = this.fns.setTimeout(done, ms);
      this.sleepers.add(done);
    });
  }

  /** Ends every sleep now. */
  wakeAll(): void {
    for (const wake of [...this.sleepers]) wake();
    this.sleepers.clear();
  }
}

/**
 * A harness's timers outside the log: the cell socket `cairn timer` and `cairn effect` reach from
 * inside a cell (started at open), and the sleeps of the model round's back-off. `close` ends both.
 */
export class TimerHousekeeping {
  readonly sleeper: Sleeper;
  private socket: CellSocket | null = null;

  constructor(fns: TimerFunctions, open: () => boolean) {
    this.sleeper = new Sleeper(fns, open);
  }

  /** Starts the cell socket at `path`; timer and effect requests commit through `core`. */
  async listen(path: string, core: HarnessCore): Promise<void> {
    const effects = new EffectRequests(core);
    const socket = new CellSocket(async (op, req, caller) => {
      if (op === "timer") return registerTimer(core, req, caller);
      if (op === "effect_begin" || op === "effect_end" || op === "effect_key") return effects.handle(op, req, caller);
      return { ok: false, code: "usage", error: `unknown request "${op.slice(0, 40)}": this harness answers "timer", "effect_begin", "effect_end" and "effect_key"` };
    });
    await socket.listen(path);
    this.socket = socket;
  }

  /** A token for a launch of `cell` in `session` (CAIRN_CELL_TOKEN), or null when the socket is not open. */
  issue(session: string, cell: number): string | null {
    return this.socket?.issue(session, cell) ?? null;
  }

  revoke(token: string): void {
    this.socket?.revoke(token);
  }

  async close(): Promise<void> {
    this.sleeper.wakeAll();
    await this.socket?.close().catch(() => undefined);
    this.socket = null;
  }
}
