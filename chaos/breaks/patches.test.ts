/**
 * The deliberate breaks (breaks.ts, run by `npm run chaos:breaks`, minutes each, not part of this
 * suite) must not rot: every patch applies cleanly to the tree as it is, changes only the files it
 * names, and really changes them (applied to a scratch copy, each named file differs afterwards).
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { applyPatch, BREAKS, breakNamed, patchPath, removeScratch, REPO, scratchCopy } from "./breaks.js";

describe("chaos/breaks patches", () => {
  const scratches: string[] = [];
  after(() => {
    for (const d of scratches) removeScratch(d);
  });

  it("names four breaks, a to d, each with a profile and the checks it expects", () => {
    assert.deepEqual(
      BREAKS.map((b) => b.id),
      ["a", "b", "c", "d"],
    );
    for (const b of BREAKS) {
      assert.ok(b.profile.length > 0 && b.expect.length > 0, `break ${b.id} needs a profile and expected checks`);
      assert.ok(!b.profile.includes("--seed") && !b.profile.includes("--keep"), `break ${b.id}: the runner adds --seed and --keep itself`);
    }
    assert.throws(() => breakNamed("z"), /no break named "z"; the breaks are a, b, c, d/);
  });

  for (const b of BREAKS) {
    it(`${b.id} (${b.name}): ${b.patch} applies cleanly to the current tree`, () => {
      applyPatch(REPO, patchPath(b), true);
    });
  }

  it("each patch, applied to a scratch copy, changes the harness files it names (none of the nemesis)", () => {
    for (const b of BREAKS) {
      const text = readFileSync(patchPath(b), "utf8");
      const files = [...text.matchAll(/^\+\+\+ b\/(\S+)$/gm)].map((m) => m[1]!);
      assert.ok(files.length > 0, `${b.patch} names no file`);
      for (const f of files) assert.ok(!f.startsWith("chaos/"), `${b.patch} must break the harness, not the nemesis (it touches ${f})`);
      const dir = scratchCopy();
      scratches.push(dir);
      applyPatch(dir, patchPath(b));
      for (const f of files) {
        const patched = readFileSync(join(dir, f), "utf8");
        assert.notEqual(patched, readFileSync(join(REPO, f), "utf8"), `${b.patch} left ${f} unchanged`);
        assert.match(patched, /BREAK \([a-d]\)/, `${f} should carry the BREAK marker comment`);
      }
      removeScratch(dir);
      scratches.pop();
    }
  });

  it("a patch that does not apply is refused with git's reason", () => {
    const dir = scratchCopy();
    scratches.push(dir);
    const p = patchPath(breakNamed("a"));
    applyPatch(dir, p);
    assert.throws(() => applyPatch(dir, p, true), /does not apply to .*patch failed|does not apply to .*does not apply/);
  });
});
