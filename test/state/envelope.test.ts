/**
 * parseNewEvent checks a plainly valid envelope by hand instead of with zod (a speed-up on every
 * commit). This property holds it to the schema: for envelopes built to sit on and around every
 * rule's edge (lengths at the limits, a kind that is not one, a key missing, an extra key, a key
 * inherited through the prototype, a null prototype, a class instance, an array), parseNewEvent
 * accepts exactly what Envelope + the body schema accept, and returns the same event.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { Envelope, EventBodies, EVENT_KINDS, parseNewEvent, type EventKind } from "../../src/state/events.js";

/** The zod-only reference: what parseNewEvent did before the hand check. */
function reference(raw: unknown): { ok: true; value: unknown } | { ok: false } {
  const env = Envelope.safeParse(raw);
  if (!env.success) return { ok: false };
  const body = EventBodies[env.data.kind].safeParse(env.data.body);
  if (!body.success) return { ok: false };
  return { ok: true, value: { ...env.data, body: body.data } };
}

function actual(raw: unknown): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: parseNewEvent(raw) };
  } catch {
    return { ok: false };
  }
}

const edgeString = (max: number) =>
  fc.oneof(fc.constant(""), fc.string({ minLength: 1, maxLength: 3 }), fc.constant("x".repeat(max)), fc.constant("x".repeat(max + 1)), fc.constant("é".repeat(max)));
const value = fc.oneof(fc.string(), fc.integer(), fc.constant(null), fc.constant(undefined), fc.boolean(), fc.constant(["a"]), fc.constant({}));
const body = fc.oneof(
  fc.constant({ observation: { id: "o1", source: "external", kind: "note", at: "t", payload: { a: 1 } } }),
  fc.constant({ turn: "s1:t1", attempt: 1 }),
  fc.constant({ cell_id: 1, kind: "cmd" }),
  fc.constant({}),
  value,
);

/** Valid events of three kinds, each then changed in zero to three ways. */
const valid = [
  { identity: "inbox:s1:o1", kind: "inbox_received", session: "s1", at: "2025-01-01T00:00:00.000Z", body: { observation: { id: "o1", source: "external", kind: "note", at: "t", payload: { a: 1 } } } },
  { identity: "attempt:s1:t1:1", kind: "model_attempt", session: "s1", at: "t", body: { turn: "s1:t1", attempt: 1 } },
  { identity: "queued:s1:1", kind: "execution_queued", session: "s1", at: "t", body: { cell_id: 1, kind: "cmd" } },
];
const field = fc.constantFrom("identity", "kind", "session", "at", "body");
const change = fc.oneof(
  fc.record({ set: field, to: fc.oneof({ arbitrary: edgeString(512), weight: 3 }, { arbitrary: edgeString(200), weight: 3 }, edgeString(1), value, body, fc.constantFrom(...(EVENT_KINDS as readonly EventKind[])), fc.constant("no_such_kind")) }),
  fc.record({ drop: field }),
  fc.record({ extra: fc.constantFrom("seq", "x", "__proto__") }),
);
const envelope = fc
  .record({
    base: fc.constantFrom(...valid),
    changes: fc.array(change, { minLength: 0, maxLength: 3, size: "max" }),
    shape: fc.constantFrom("plain", "plain", "plain", "plain", "null-proto", "class", "inherited"),
  })
  .map(({ base, changes, shape }) => {
    const o: Record<string, unknown> = { ...base };
    let dropped: [string, unknown] | undefined;
    for (const c of changes) {
      if ("set" in c) o[c.set] = c.to;
      else if ("drop" in c) {
        dropped = [c.drop, o[c.drop]];
        delete o[c.drop];
      } else Object.defineProperty(o, c.extra, { value: 1, enumerable: true, configurable: true, writable: true });
    }
    if (shape === "null-proto") return Object.assign(Object.create(null) as object, o);
    if (shape === "class") return Object.assign(new (class Ev {})(), o);
    // a dropped key inherited instead of own: a strict reader must not take it
    if (shape === "inherited" && dropped !== undefined) return Object.assign(Object.create({ [dropped[0]]: dropped[1] }) as object, o);
    return o;
  });

describe("the event envelope's hand check", () => {
  it("accepts exactly what the zod schemas accept, and returns the same event", () => {
    let accepted = 0;
    fc.assert(
      fc.property(fc.oneof({ arbitrary: envelope, weight: 8 }, value, fc.constant([1, 2, 3, 4, 5])), (raw) => {
        const want = reference(raw);
        const got = actual(raw);
        assert.equal(got.ok, want.ok, `parseNewEvent ${got.ok ? "accepted" : "refused"} what the schemas ${want.ok ? "accept" : "refuse"}: ${String(JSON.stringify(raw))}`);
        if (got.ok && want.ok) {
          accepted++;
          assert.deepEqual(got.value, want.value);
        }
      }),
      { numRuns: 5000 },
    );
    assert.ok(accepted > 100, `only ${accepted} of 5000 envelopes were valid: the generator misses the accepted side`);
  });

  it("refuses a bad envelope with the zod error that names the field", () => {
    assert.throws(() => parseNewEvent({ identity: "", kind: "model_attempt", session: "s", at: "t", body: { turn: "s:t1", attempt: 1 } }), /identity/);
    assert.throws(() => parseNewEvent({ identity: "i", kind: "nope", session: "s", at: "t", body: {} }), /kind/);
  });
});
