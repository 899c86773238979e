/**
 * Taking a database the way a job scheduler needs it (README "Operations"): a process becomes the
 * owner only by taking the database's owner lease first, so a worker restarted by a restart-always
 * policy waits in standby while a live owner renews its lease, and never fences it on its own. An
 * explicit takeover (`cairn resume`, `cairn serve --takeover`) takes the lease regardless. Safety is
 * still the epoch: whoever opens last fences every earlier owner; the lease only decides who tries.
 */
import { hostname } from "node:os";
import type { Logger } from "pino";
import type { HeldLease, LeaseTicket, LeaseView, OwnerInfo, Storage } from "../storage/contract.js";
import type { Harness } from "../harness/harness.js";
import { hasCode } from "../errors.js";
import type { Parsed } from "./args.js";
import { UsageError } from "./args.js";

export type Role = "serve" | "run" | "resume";

export function ownerInfo(role: Role): OwnerInfo {
  return { host: hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role };
}

/** One sentence naming a lease's holder. */
export function describeHolder(view: LeaseView): string {
  const o = view.owner;
  return `owned by ${o.host} since ${o.since} (pid ${o.pid}, ${o.role}${o.epoch !== null ? `, epoch ${o.epoch}` : ""})`;
}

export interface WaitOptions {
  readonly storage: Storage;
  readonly name: string;
  readonly role: Role;
  /** Take the lease even from a live holder (an explicit operator takeover). */
  readonly force: boolean;
  /** Called whenever this process waits for a live holder (with who holds it). */
  readonly onStandby?: (view: LeaseView | null) => void | Promise<void>;
  /** Stop waiting (SIGTERM; the awaited run ended). */
  readonly stopped?: () => boolean;
  /** Wakes a sleeping wait early (a signal). */
  readonly wake?: (resume: () => void) => void;
  readonly logger?: Logger;
}

/**
 * Waits until this process holds the owner lease. Returns "no-leases" when the adapter has none (the
 * memory adapter), the held lease, or null when `stopped()` said to give up. Storage errors (an
 * outage) are retried while waiting; configuration errors are thrown.
 */
export async function takeLease(o: WaitOptions): Promise<HeldLease | "no-leases" | null> {
  const leases = o.storage.leases;
  if (leases === undefined) return "no-leases";
  const pollMs = Math.min(1000, Math.max(100, Math.floor(leases.ttlMs / 5)));
  let force = o.force;
  const info = ownerInfo(o.role);
  // Queued after the first refusal: a lease that falls free goes to the oldest live waiter, so a
  // worker restarted by its scheduler does not overtake the standby that has waited longer.
  let ticket: LeaseTicket | undefined;
  try {
    for (;;) {
      if (o.stopped?.() === true) return null;
      try {
        const held = await leases.acquire(o.name, ownerInfo(o.role), { force, ...(ticket ? { ticket } : {}) });
        if (held !== null) {
          ticket = undefined; // taking the lease withdrew it
          return held;
        }
        force = false;
        ticket ??= await leases.enqueue(o.name, info);
        await o.onStandby?.(await leases.read(o.name));
      } catch (err) {
        if (hasCode(err, "config") || hasCode(err, "usage") || hasCode(err, "not_found")) throw err;
        o.logger?.warn({ err: (err as Error).message }, "could not reach the owner lease; retrying");
        await o.onStandby?.(null);
      }
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, pollMs);
        o.wake?.(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  } finally {
    await ticket?.withdraw().catch(() => undefined);
  }
}

/** The live holder of `name`'s lease, or null (none, expired, or no leases on this adapter). */
export async function liveHolder(storage: Storage, name: string): Promise<LeaseView | null> {
  const view = await storage.leases?.read(name);
  return view !== undefined && view !== null && view.live ? view : null;
}

const TRUE = new Set(["1", "true", "yes", "on"]);
const FALSE = new Set(["", "0", "false", "no", "off"]);

/**
 * Fills flags missing from the command line from the environment (`--data-dir` from CAIRN_DATA_DIR:
 * CAIRN_ + the flag name in upper case, dashes as underscores). The command line wins.
 */
export function fillFromEnv(p: Parsed, command: string, env: NodeJS.ProcessEnv, flags: Record<string, { type: "string" | "boolean" }>): void {
  for (const [name, spec] of Object.entries(flags)) {
    if (p.values[name] !== undefined || name === "help") continue;
    const key = envName(name);
    const v = env[key];
    if (v === undefined) continue;
    if (spec.type === "boolean") {
      const t = v.trim().toLowerCase();
      if (TRUE.has(t)) p.values[name] = true;
      else if (!FALSE.has(t)) throw new UsageError(`cairn ${command}: ${key} expects true or false, got "${v}".`);
    } else if (v !== "") {
      p.values[name] = v;
    }
  }
}

/** The environment variable of a flag: `--etcd` reads CAIRN_ETCD_ENDPOINTS, `--url` CAIRN_DS_URL, the rest CAIRN_<FLAG>. */
export function envName(flag: string): string {
  if (flag === "etcd") return "CAIRN_ETCD_ENDPOINTS";
  if (flag === "url") return "CAIRN_DS_URL";
  return `CAIRN_${flag.toUpperCase().replace(/-/g, "_")}`;
}

/**
 * Closes an owner's harness, then releases its owner lease. A harness that already stopped (fenced,
 * or its liveness lease lost while cut off) has stopped its cells: the two then go at once, so that a
 * cut-off owner does not spend the owner lease's bounded release after the harness's close before it
 * can exit.
 */
export async function closeOwner(h: { readonly status: string; close(): Promise<void> } | null, lease: HeldLease | "no-leases" | null): Promise<void> {
  const release = async () => {
    if (lease !== null && lease !== "no-leases") await lease.release();
  };
  if (h === null) return release();
  if (h.status === "open") {
    await h.close();
    await release();
  } else {
    await Promise.all([h.close(), release()]);
  }
}

/** How many times an owner claims again after an opener that raced it (and lost the lease) fenced it. */
export const MAX_REOPENS = 2;

/**
 * The owner lease of a process that opened its database under it. Its loss stops the harness: as
 * fenced when the storage shows another owner (a takeover, a thawed process), as unreachable
 * otherwise (exit 4: an outage that outlived the lease); never a plain close, so that a run waiting
 * on the harness learns which of the two it was.
 *
 * Two openers that both take the lease by force (a takeover race) may claim in the other order than
 * they took it: the one that took the lease first claims last. `raced` tells the lease's holder, once
 * fenced, that it should claim again: the lease is still its own and the fence came within a lease
 * length of its claim. The other one then finds itself fenced (exit 3), never both gone.
 */
export class OwnerLease {
  private lost: string | null = null;
  private harness: Pick<Harness, "epoch" | "name" | "ownerLeaseLost"> | null = null;
  private openedAt = 0;

  constructor(
    readonly held: HeldLease,
    private readonly ttlMs: number,
    private readonly logger: Logger,
  ) {
    held.onLost((why) => {
      this.lost = why;
      this.stop(why);
    });
  }

  /** `h` was opened under this lease (its claim is the newest, as far as this process knows). */
  attach(h: Pick<Harness, "epoch" | "name" | "ownerLeaseLost">, openedAt: number): void {
    this.harness = h;
    this.openedAt = openedAt;
    if (this.lost !== null) return this.stop(this.lost);
    // Shown to standbys; never relied on.
    this.held.update(h.epoch).catch((err: unknown) => this.logger.warn({ db: h.name, err: (err as Error).message }, "could not record the epoch in the owner lease"));
  }

  private stop(why: string): void {
    const h = this.harness;
    if (h === null) return;
    this.logger.error({ db: h.name, why }, "lost the owner lease: stopping; asking the storage whether another process owns the database");
    h.ownerLeaseLost(why, Math.max(3000, this.ttlMs));
  }

  /**
   * Whether a fence that ended the open started at `openedAt` came from an opener that raced this
   * one for the lease: within a lease length of that open, and the lease is still this process's
   * (asked of the storage: writing the epoch to it fails once another process took it).
   */
  async raced(epoch: number, openedAt: number): Promise<boolean> {
    if (this.lost !== null || performance.now() - openedAt > this.ttlMs) return false;
    try {
      await this.held.update(epoch);
    } catch {
      return false;
    }
    return this.lost === null;
  }
}

/** Whether `err` says another process claimed the database (a ResetError "fenced"). */
export function isFence(err: unknown): boolean {
  return hasCode(err, "reset") && (err as { reason?: unknown }).reason === "fenced";
}

/** What a process says when another one owns its database now (exit 3): whether it lost a race to open, or was taken over later. */
export function fencedLine(name: string): string {
  return `cairn: fenced: another process owns database "${name}" now; this one stopped its cells and exits. Do not restart it here unless the other owner is gone.`;
}
