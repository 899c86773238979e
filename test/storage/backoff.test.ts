/**
 * The shared retry back-off (src/storage/backoff.ts): the delay doubles from its base to its cap, an
 * attempt below 1 counts as the first, the exponent cannot overflow, and full jitter stays within
 * [0, the delay) for every draw.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { backoffDelay, jitteredDelay } from "../../src/storage/backoff.js";

describe("retry back-off", () => {
  const policy = { baseMs: 1000, maxMs: 60_000 };

  it("doubles from the base to the cap", () => {
    assert.deepEqual([1, 2, 3, 4, 5, 6, 7, 8].map((n) => backoffDelay(policy, n)), [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]);
  });

  it("counts an attempt below 1 as the first, and stays finite for any attempt", () => {
    assert.equal(backoffDelay(policy, 0), 1000);
    assert.equal(backoffDelay(policy, -5), 1000);
    assert.equal(backoffDelay({ baseMs: 0, maxMs: 10 }, 5000), 0);
    assert.equal(backoffDelay({ baseMs: 1, maxMs: Number.MAX_SAFE_INTEGER }, 5000), 2 ** 30);
  });

  it("full jitter draws within [0, the delay), the draw decides", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 10_000 }), fc.integer({ min: 1, max: 100_000 }), fc.integer({ min: -3, max: 100 }), fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }), (baseMs, maxMs, attempt, draw) => {
        const ceiling = backoffDelay({ baseMs, maxMs }, attempt);
        const d = jitteredDelay({ baseMs, maxMs }, attempt, () => draw);
        assert.ok(d >= 0 && (d < ceiling || (ceiling === 0 && d === 0)), `${d} outside [0, ${ceiling})`);
        assert.equal(d, Math.floor(draw * ceiling));
      }),
      { seed: 41, numRuns: 2000 },
    );
  });
});
