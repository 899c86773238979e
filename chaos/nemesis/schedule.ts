/**
 * The nemesis schedule: drawn entirely from the seed before the run starts, so the same seed replays
 * the same faults at the same offsets on the same targets (targets are indexes: a database, a member,
 * "the leader", resolved when the fault fires). Faults overlap freely.
 */
import { between, pick, rng } from "./rng.js";

export const FAULT_KINDS = [
  "kill-worker",
  "pause-worker",
  "stall-takeover",
  "race-opener",
  "lost-ack",
  "commit-fail",
  "kill-member",
  "pause-member",
  "kill-leader",
  "pause-leader",
  "kill-two-members",
  "pause-two-members",
  "isolate-member",
  "isolate-owner",
  "disk-full",
] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface Fault {
  readonly n: number;
  /** Offset from the start of the fault phase, in ms. */
  readonly atMs: number;
  readonly kind: FaultKind;
  /** Database index (worker faults), member index (member faults), or how many members (isolate-owner). */
  readonly target: number;
  /** How long the fault lasts (pauses, partitions, a dead member, a full disk), in ms. */
  readonly durationMs: number;
  /** For lost-ack / commit-fail: which commit of the next life fails. */
  readonly nth: number;
}

export interface ScheduleOptions {
  readonly seed: number;
  readonly faults: number;
  readonly spanMs: number;
  /** Databases on each adapter (worker faults pick among them). */
  readonly dbs: number;
  /** Which kinds may be drawn (e.g. without etcd or iptables), with weights. */
  readonly weights: Partial<Record<FaultKind, number>>;
}

export function schedule(o: ScheduleOptions): Fault[] {
  const r = rng(o.seed);
  const kinds = FAULT_KINDS.filter((k) => (o.weights[k] ?? 0) > 0);
  const total = kinds.reduce((s, k) => s + o.weights[k]!, 0);
  const out: Fault[] = [];
  for (let n = 0; n < o.faults; n++) {
    let x = r() * total;
    let kind: FaultKind = kinds[0]!;
    for (const k of kinds) {
      x -= o.weights[k]!;
      if (x <= 0) {
        kind = k;
        break;
      }
    }
    const atMs = Math.floor(r() * o.spanMs);
    const target = kind === "isolate-owner" ? between(r, 1, 3) : kind.includes("member") || kind.includes("leader") ? between(r, 0, 2) : between(r, 0, o.dbs - 1);
    const drawn = pick(r, [150, 300, 600, 1200, 2500]);
    // A stalled owner stays frozen past its lease (3 s) and a new worker's first launch.
    const durationMs = kind === "stall-takeover" ? 3000 + 2 * drawn : drawn;
    const nth = between(r, 1, 6);
    out.push({ n, atMs, kind, target, durationMs, nth });
  }
  out.sort((a, b) => a.atMs - b.atMs || a.n - b.n);
  return out.map((f, n) => ({ ...f, n: n + 1 }));
}
