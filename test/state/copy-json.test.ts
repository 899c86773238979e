/**
 * copyJson (src/state/canonical.ts), the committer's copy of the events it folds: for every JSON
 * value it equals JSON.parse(JSON.stringify()) (what a read of the log gives back: -0 is 0), shares
 * no object with its input, and keeps a "__proto__" key as an own property.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { copyJson } from "../../src/state/canonical.js";

test("copyJson equals a JSON round trip for any JSON value, and shares nothing with its input (property)", () => {
  fc.assert(
    fc.property(fc.jsonValue(), (v) => {
      const copy = copyJson(v);
      assert.deepStrictEqual(copy, JSON.parse(JSON.stringify(v)));
      const objects = (x: unknown, out: object[] = []): object[] => {
        if (typeof x === "object" && x !== null) {
          out.push(x);
          for (const y of Object.values(x)) objects(y, out);
        }
        return out;
      };
      const mine = new Set(objects(v));
      for (const o of objects(copy)) assert.ok(!mine.has(o), "an object of the input is shared by the copy");
    }),
    { numRuns: 500 },
  );
});

test('copyJson keeps a "__proto__" key as an own property, as JSON.parse does, and never sets the prototype', () => {
  const input = JSON.parse('{"a":{"__proto__":{"polluted":true},"b":[1,{"__proto__":null}]}}') as { a: Record<string, unknown> };
  const copy = copyJson(input);
  assert.deepStrictEqual(copy, input);
  assert.equal(Object.getPrototypeOf(copy.a), Object.prototype);
  assert.equal((copy.a as { polluted?: boolean }).polluted, undefined);
  assert.ok(Object.hasOwn(copy.a, "__proto__"));
  assert.equal(({} as { polluted?: boolean }).polluted, undefined);
});

test("-0 is copied as 0, as the log stores it", () => {
  assert.ok(Object.is(copyJson({ n: -0 }).n, 0));
  assert.ok(Object.is(copyJson([-0])[0], 0));
});

test("a change to the copy does not reach the original", () => {
  const original = { kind: "k", body: { list: [1, 2, { x: "y" }] } };
  const copy = copyJson(original);
  (copy.body.list[2] as { x: string }).x = "changed";
  copy.body.list.push(4);
  assert.deepStrictEqual(original, { kind: "k", body: { list: [1, 2, { x: "y" }] } });
});
