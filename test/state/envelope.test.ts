/**
 * parseNewEvent checks a plainly valid envelope by hand instead of with zod (a speed-up on every
 * commit). It must accept exactly what Envelope + the body schema accept, return an equal value, and
 * never return (or alias) the caller's object.
 *
 * The property holds it to the schema for envelopes built to sit on and around every rule's edge
 * (lengths at the limits, a kind that is not one, a key missing, an extra key, a key inherited through
 * the prototype, a null prototype, a class instance, an array). The cases after it aim at what such a
 * generator does not build: getters, non-enumerable and Symbol keys, Proxies, frozen objects, objects
 * from another realm, a polluted Object.prototype, arrays, lone surrogates, wrapper objects.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import vm from "node:vm";
import fc from "fast-check";
import { Envelope, EventBodies, EVENT_KINDS, parseNewEvent, type EventKind } from "../../src/state/events.js";

/** The zod-only reference: Envelope and the kind's body schema, which the hand check must equal. */
function reference(raw: unknown): { ok: true; value: unknown } | { ok: false; error: unknown } {
  const env = Envelope.safeParse(raw);
  if (!env.success) return { ok: false, error: env.error };
  const body = EventBodies[env.data.kind].safeParse(env.data.body);
  if (!body.success) return { ok: false, error: body.error };
  return { ok: true, value: { ...env.data, body: body.data } };
}

function actual(raw: unknown): { ok: true; value: unknown } | { ok: false; error: unknown } {
  try {
    return { ok: true, value: parseNewEvent(raw) };
  } catch (error) {
    return { ok: false, error };
  }
}

/** Asserts parseNewEvent and the reference agree on `raw` (accepted with equal values, or both refused). */
function agree(raw: unknown, what: string): "accepted" | "refused" {
  const want = reference(raw);
  const got = actual(raw);
  assert.equal(got.ok, want.ok, `${what}: parseNewEvent ${got.ok ? "accepted" : `refused (${String(got.error)})`} what the schemas ${want.ok ? "accept" : "refuse"}`);
  if (got.ok && want.ok) {
    assert.deepEqual(got.value, want.value, `${what}: a different value`);
    assert.notEqual(got.value, raw, `${what}: returned the caller's object`);
    return "accepted";
  }
  return "refused";
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

const BODY = { observation: { id: "o1", source: "external", kind: "note", at: "t", payload: { a: 1 } } };
const base = () => ({ identity: "inbox:s1:o1", kind: "inbox_received", session: "s1", at: "2025-01-01T00:00:00.000Z", body: structuredClone(BODY) });

describe("the event envelope's hand check, on objects no generator builds", () => {
  it("a plain valid envelope: accepted, equal, a fresh object that does not alias the input", () => {
    const raw = base();
    assert.equal(agree(raw, "plain"), "accepted");
    const got = parseNewEvent(raw) as unknown as Record<string, unknown>;
    got.identity = "changed";
    assert.equal(raw.identity, "inbox:s1:o1", "writing the result changed the input envelope");
  });

  it("a frozen envelope (and a frozen body) is accepted, equal, and the result is not frozen-aliased", () => {
    const raw = base();
    Object.freeze(raw.body.observation);
    Object.freeze(raw.body);
    Object.freeze(raw);
    assert.equal(agree(raw, "frozen"), "accepted");
    const got = parseNewEvent(raw);
    assert.notEqual(got, raw);
    assert.equal(Object.isFrozen(got), false);
  });

  it("stable getters (own, enumerable) for every field: accepted and equal", () => {
    const raw = {};
    for (const [k, v] of Object.entries(base())) Object.defineProperty(raw, k, { get: () => v, enumerable: true, configurable: true });
    assert.equal(agree(raw, "getters"), "accepted");
  });

  it("a getter that throws: refused by both, with the getter's error", () => {
    const raw: Record<string, unknown> = base();
    Object.defineProperty(raw, "session", { get: () => { throw new Error("getter boom"); }, enumerable: true });
    assert.throws(() => parseNewEvent(raw), /getter boom/);
    assert.throws(() => Envelope.parse(raw), /getter boom/);
  });

  // zod reads each key once and returns its copy, so the hand check must build its result from the
  // values it checked: a getter (or Proxy) that answers differently on a second read must not get an
  // unchecked value through (here an identity of 600 characters, over Envelope's 512, and a kind
  // other than the one checked).
  it("a getter answering differently on a later read: the returned event holds only checked values", () => {
    /** A valid envelope whose `key` getter answers `first` on its first read and `later` after. */
    const flipping = (key: string, first: unknown, later: unknown) => {
      const raw: Record<string, unknown> = base();
      let reads = 0;
      Object.defineProperty(raw, key, { get: () => (reads++ === 0 ? first : later), enumerable: true, configurable: true });
      return raw;
    };
    const longId = () => flipping("identity", "inbox:s1:o1", "x".repeat(600));
    assert.ok(reference(longId()).ok, "zod reads each key once: it accepts with the first value");
    const got = actual(longId());
    assert.ok(got.ok);
    const id = (got.value as { identity: string }).identity;
    assert.ok(id.length <= 512, `returned an identity of ${id.length} chars, which Envelope refuses`);
    const otherKind = () => flipping("kind", "inbox_received", "model_attempt");
    assert.ok(reference(otherKind()).ok);
    const got2 = actual(otherKind());
    assert.ok(got2.ok, `refused: ${got2.ok ? "" : String(got2.error)}`);
    assert.equal((got2.value as { kind: string }).kind, "inbox_received", "returned a kind whose body was never checked against it");
  });

  it("non-enumerable extra key: both ignore it (for-in and Object.keys skip it)", () => {
    const raw = base();
    Object.defineProperty(raw, "seq", { value: 7, enumerable: false });
    assert.equal(agree(raw, "non-enumerable extra"), "accepted");
  });

  it("a non-enumerable envelope field and no extra key: both accept (zod reads the field by name)", () => {
    const raw: Record<string, unknown> = base();
    Object.defineProperty(raw, "identity", { value: "inbox:s1:o1", enumerable: false });
    agree(raw, "non-enumerable identity");
  });

  // Counting five enumerable own keys and then finding the five names with Object.hasOwn (which also
  // sees non-enumerable keys) would let through an object whose `identity` is own but non-enumerable
  // and which has one extra enumerable key ("x"). Envelope (strictObject, for-in) refuses it for "x".
  it("a non-enumerable envelope field plus an extra enumerable key: refused, as Envelope refuses it", () => {
    const raw: Record<string, unknown> = base();
    Object.defineProperty(raw, "identity", { value: "inbox:s1:o1", enumerable: false });
    raw.x = 1;
    assert.equal(reference(raw).ok, false, "Envelope refuses the extra key");
    assert.equal(agree(raw, "non-enumerable identity + extra x"), "refused");
  });

  it("Symbol keys: ignored by both", () => {
    const raw = base() as Record<string | symbol, unknown>;
    raw[Symbol("extra")] = 1;
    assert.equal(agree(raw, "symbol key"), "accepted");
  });

  it("a transparent Proxy over a valid envelope: accepted and equal; a Proxy that hides a key: both refuse", () => {
    assert.equal(agree(new Proxy(base(), {}), "proxy"), "accepted");
    const hidden = new Proxy(base(), {
      ownKeys: (t) => Reflect.ownKeys(t).filter((k) => k !== "at"),
      getOwnPropertyDescriptor: (t, k) => (k === "at" ? undefined : Reflect.getOwnPropertyDescriptor(t, k)),
      has: (t, k) => k !== "at" && Reflect.has(t, k),
      get: (t, k, r) => (k === "at" ? undefined : Reflect.get(t, k, r)),
    });
    assert.equal(agree(hidden, "proxy hiding at"), "refused");
  });

  it("an envelope from another realm (vm context): both agree (zod accepts it; the hand check falls back)", () => {
    const raw = vm.runInNewContext(`({ identity: "inbox:s1:o1", kind: "inbox_received", session: "s1", at: "t", body: { observation: { id: "o1", source: "external", kind: "note", at: "t", payload: { a: 1 } } } })`) as unknown;
    assert.notEqual(Object.getPrototypeOf(raw), Object.prototype);
    agree(raw, "other realm");
    const bad = vm.runInNewContext(`({ identity: "", kind: "inbox_received", session: "s1", at: "t", body: {} })`) as unknown;
    assert.equal(agree(bad, "other realm, bad"), "refused");
  });

  it("Object.prototype.identity set: a full own envelope is accepted with its own identity; a missing identity is treated alike by both", () => {
    const proto = Object.prototype as Record<string, unknown>;
    try {
      Object.defineProperty(Object.prototype, "identity", { value: "polluted", enumerable: false, configurable: true, writable: true });
      assert.equal(agree(base(), "pollution, full"), "accepted");
      assert.equal((parseNewEvent(base()) as { identity: string }).identity, "inbox:s1:o1");
      const missing: Record<string, unknown> = base();
      delete missing.identity;
      agree(missing, "pollution, identity missing");
    } finally {
      delete proto.identity;
    }
    assert.equal("identity" in {}, false, "the pollution was removed");
  });

  // zod's strict key check iterates for-in (which sees inherited enumerable keys): both must still agree.
  it("an enumerable key added to Object.prototype: both agree", () => {
    const proto = Object.prototype as Record<string, unknown>;
    let want: boolean;
    let got: boolean;
    try {
      proto.pollutedTestKey = 1;
      want = reference(base()).ok;
      got = actual(base()).ok;
    } finally {
      delete proto.pollutedTestKey;
    }
    assert.equal("pollutedTestKey" in {}, false, "the pollution was removed");
    assert.equal(got, want, `parseNewEvent ${got ? "accepted" : "refused"} while Envelope ${want ? "accepts" : "refuses"}`);
  });

  it("arrays (also with the five keys as extra props) are refused by both", () => {
    const arr = Object.assign([1, 2], base());
    assert.equal(agree(arr, "array with props"), "refused");
    assert.equal(agree([], "empty array"), "refused");
  });

  it("lone surrogates and astral characters: lengths counted in UTF-16 units by both", () => {
    const cases: [string, string][] = [
      ["identity", "\uD800"],
      ["identity", "\uDC00".repeat(512)],
      ["identity", "\uDC00".repeat(513)],
      ["identity", "😀".repeat(256)], // 512 code units
      ["identity", "😀".repeat(257)], // 514 code units
      ["session", "\uD800".repeat(200)],
      ["session", "😀".repeat(101)],
      ["at", "\uDFFF"],
    ];
    for (const [k, v] of cases) agree({ ...base(), [k]: v }, `${k} = ${v.length} units`);
  });

  it("wrapper objects (new String, new Number) as fields are refused by both", () => {
    for (const k of ["identity", "session", "at", "kind"]) {
      const raw: Record<string, unknown> = base();
      raw[k] = new String(raw[k] as string);
      assert.equal(agree(raw, `String wrapper ${k}`), "refused");
    }
    assert.equal(agree({ ...base(), identity: new Number(1) }, "Number wrapper"), "refused");
  });

  it("kind names that are Object.prototype members or inherited are refused by both", () => {
    for (const kind of ["constructor", "toString", "__proto__", "hasOwnProperty", "valueOf"]) {
      assert.equal(agree({ ...base(), kind }, `kind ${kind}`), "refused");
    }
  });

  it("an own __proto__ key (JSON.parse) is refused by both", () => {
    const raw = JSON.parse(`{"identity":"inbox:s1:o1","kind":"inbox_received","session":"s1","at":"t","body":${JSON.stringify(BODY)},"__proto__":{"x":1}}`) as unknown;
    assert.equal(agree(raw, "own __proto__"), "refused");
  });

  it("an object with Object.prototype replaced by setPrototypeOf to itself or to a subclass-free clone: falls back and agrees", () => {
    const raw = Object.setPrototypeOf(base(), Object.create(Object.prototype) as object) as unknown;
    agree(raw, "one extra prototype level");
  });
});
