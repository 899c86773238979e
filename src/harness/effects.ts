/**
 * The effect ledger as a running cell reaches it (`cairn effect`, the Python helper): requests on the
 * cell socket, answered for the run and cell the caller's token was issued to, never for a run the
 * request names. The decisions are src/state/effects.ts's; this file commits and derives keys.
 *
 * Rules, each kept here:
 * - a begin answered `proceed` was committed first, and the commit resolved (durable as the adapter
 *   promises) before the answer is sent; a begin that cannot commit (fenced, poisoned, closing, an
 *   uncertain commit) is refused, never answered `proceed`;
 * - `done` comes from a committed end, so it is true for any owner that folded it, a fenced one too;
 * - requests for one name of one run are answered one at a time (two begins at once: one proceeds,
 *   the other is told it is uncertain).
 *
 * Keys. Every run has 128 random bits drawn at its creation (`effect_seed`, in its `session_created`;
 * a fork keeps its parent's). The key of effect NAME is HMAC-SHA256(seed, "cairn effect key/1\n" +
 * "name\n" + NAME), the launch key of cell N is the same with "launch\n" + N; the first 16 bytes are
 * written as a UUID (version 8, RFC 9562), which APIs that take idempotency keys accept. The same
 * NAME gives the same key in every cell of the run and its forks, and a different one in any other
 * run, on any database. A run created before the ledger existed has no seed: its keys derive from
 * sha256 of the database name, the run id and its creation time.
 */
import { createHash, createHmac } from "node:crypto";
import { z } from "zod";
import { decideBegin, EffectName, type EffectRecord, MAX_EFFECT_RESULT_CHARS } from "../state/effects.js";
import { event, identity } from "../state/events.js";
import type { SessionProjection } from "../state/projection.js";
import { canonicalEqual, isJsonValue } from "../state/canonical.js";
import type { CellCaller, CellReply } from "./cell-socket.js";
import type { HarnessCore } from "./core.js";

const KEY_CONTEXT = "cairn effect key/1\n";

/** The secret a run's keys derive from: its seed, or for a run older than the ledger a hash of what identifies it. */
export function effectScope(db: string, s: Pick<SessionProjection, "id" | "created_at" | "effect_seed">): Buffer {
  if (s.effect_seed !== null) return Buffer.from(s.effect_seed, "hex");
  return createHash("sha256").update(`${db}\n${s.id}\n${s.created_at}`).digest();
}

function uuid8(bytes: Buffer): string {
  const b = Buffer.from(bytes.subarray(0, 16));
  b[6] = (b[6]! & 0x0f) | 0x80; // version 8: custom
  b[8] = (b[8]! & 0x3f) | 0x80; // variant 10
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** The run-wide idempotency key of effect `name` (see the module comment). */
export function effectKey(scope: Buffer, name: string): string {
  return uuid8(createHmac("sha256", scope).update(`${KEY_CONTEXT}name\n${name}`).digest());
}

/** The key of one launch of cell `cell` (CAIRN_EFFECT_KEY): a cell version launches at most once. */
export function launchKey(scope: Buffer, cell: number): string {
  return uuid8(createHmac("sha256", scope).update(`${KEY_CONTEXT}launch\n${cell}`).digest());
}

const Begin = z.strictObject({ name: EffectName, retry: z.boolean().optional() });
const End = z.strictObject({ name: EffectName, result: z.unknown().optional() });
const Key = z.strictObject({ name: EffectName });

function bad(op: string, error: z.ZodError): CellReply {
  return { ok: false, code: "usage", error: `bad ${op} request: ${error.issues.map((i) => `${i.path.join(".") || "request"}: ${i.message}`).join("; ")}` };
}

/** What a caller is told about an effect the ledger holds as begun and not ended. */
function known(s: SessionProjection, r: EffectRecord): Record<string, unknown> {
  return {
    attempts: r.attempts.map((a) => {
      const ex = s.executions.get(a.cell_id);
      return {
        attempt: a.attempt,
        cell: a.cell_id,
        at: a.at,
        evidence: `event:${a.seq}`,
        ...(ex === undefined ? {} : { cell_phase: ex.phase, ...(ex.result !== null ? { cell_result: ex.result } : {}) }),
      };
    }),
  };
}

/** The cell socket's effect requests (`effect_begin`, `effect_end`, `effect_key`) for one harness. */
export class EffectRequests {
  /** The tail of the queue of requests per `session\0name`: one at a time. */
  private readonly queues = new Map<string, Promise<unknown>>();

  constructor(private readonly core: HarnessCore) {}

  /** Answers `op` (one of the three) with `raw`'s fields, for `caller`. Never throws. */
  handle(op: string, raw: Record<string, unknown>, caller: CellCaller): Promise<CellReply> {
    const name = typeof raw.name === "string" ? raw.name : "";
    const key = `${caller.session}\u0000${name}`;
    const run = async (): Promise<CellReply> => {
      try {
        return await this.answer(op, raw, caller);
      } catch (err) {
        const code = (err as { code?: unknown }).code;
        const why = err instanceof Error ? err.message : String(err);
        return { ok: false, code: typeof code === "string" ? code : "internal", error: `not recorded: ${why}` };
      }
    };
    const p = (this.queues.get(key) ?? Promise.resolve()).then(run);
    this.queues.set(key, p);
    void p.finally(() => {
      if (this.queues.get(key) === p) this.queues.delete(key);
    });
    return p;
  }

  private session(caller: CellCaller): SessionProjection {
    const s = this.core.session(caller.session);
    if (s === undefined) throw Object.assign(new Error(`run ${caller.session} does not exist`), { code: "not_found" });
    return s;
  }

  private keyOf(s: SessionProjection, name: string): string {
    return effectKey(effectScope(this.core.name, s), name);
  }

  private async answer(op: string, raw: Record<string, unknown>, caller: CellCaller): Promise<CellReply> {
    const { core } = this;
    if (op === "effect_key") {
      const req = Key.safeParse(raw);
      if (!req.success) return bad(op, req.error);
      return { ok: true, key: this.keyOf(this.session(caller), req.data.name) };
    }
    if (op === "effect_begin") {
      const req = Begin.safeParse(raw);
      if (!req.success) return bad(op, req.error);
      const { name } = req.data;
      const s = this.session(caller);
      const key = this.keyOf(s, name);
      const d = decideBegin(s.effects, name, req.data.retry === true);
      if (d.answer === "done") return { ok: true, answer: "done", key, result: d.record.ended!.result, ended_by: d.record.ended!.cell_id };
      if (d.answer === "uncertain") return { ok: true, answer: "uncertain", key, known: known(s, d.record) };
      if (d.answer === "refused") return { ok: false, code: "limit", error: d.reason };
      if (s.terminal !== null) return { ok: false, code: "ended", error: `run ${s.id} has ended; it begins no effect` };
      if (core.stopping()) return { ok: false, code: "stopping", error: "this worker is stopping (closed, fenced or cut off): it begins no effect" };
      await core.commit([event("effect_begun", s.id, identity.effectBegun(s.id, name, d.attempt), core.nowIso(), { name, cell_id: caller.cell, attempt: d.attempt })]);
      await core.faults?.("effect:begun-committed", { session: s.id, cell: caller.cell });
      return { ok: true, answer: "proceed", key, attempt: d.attempt };
    }
    if (op === "effect_end") {
      const req = End.safeParse(raw);
      if (!req.success) return bad(op, req.error);
      const { name } = req.data;
      const result = req.data.result === undefined ? null : req.data.result;
      if (!isJsonValue(result)) return { ok: false, code: "usage", error: "the result must be plain JSON" };
      const text = JSON.stringify(result);
      if (text.length > MAX_EFFECT_RESULT_CHARS) {
        return { ok: false, code: "usage", error: `the result is ${text.length} characters of JSON; at most ${MAX_EFFECT_RESULT_CHARS}: record an id or a URL, and keep large output in a file` };
      }
      const s = this.session(caller);
      const record = s.effects.get(name);
      if (record === undefined) return { ok: false, code: "usage", error: `effect ${name} was never begun in this run: begin it first (cairn effect begin ${name})` };
      if (record.ended !== null) {
        if (canonicalEqual(record.ended.result, result)) return { ok: true, answer: "done", key: this.keyOf(s, name), result: record.ended.result, already: true };
        return { ok: false, code: "conflict", error: `effect ${name} was already ended by cell ${record.ended.cell_id} with result ${JSON.stringify(record.ended.result).slice(0, 300)}; a result is recorded once` };
      }
      await core.commit([event("effect_ended", s.id, identity.effectEnded(s.id, name), core.nowIso(), { name, cell_id: caller.cell, result })]);
      await core.faults?.("effect:ended-committed", { session: s.id, cell: caller.cell });
      return { ok: true, answer: "done", key: this.keyOf(s, name), result };
    }
    return { ok: false, code: "usage", error: `unknown request "${op.slice(0, 40)}"` };
  }
}
