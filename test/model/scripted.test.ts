/**
 * The scripted model: round by revision, past the end, bad files, a simulated lost response, estimated usage.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { ModelError } from "../../src/model/contract.js";
import { createModel } from "../../src/model/providers.js";
import { ScriptedModel } from "../../src/model/scripted.js";
import { initialState, type State } from "../../src/state/schema.js";

const dir = mkdtempSync(join(tmpdir(), "cairn-scripted-"));
after(() => rmSync(dir, { recursive: true, force: true }));

function write(name: string, content: unknown): string {
  const file = join(dir, name);
  writeFileSync(file, typeof content === "string" ? content : JSON.stringify(content));
  return file;
}
function at(revision: number): State {
  return { ...initialState("s1", "goal"), revision };
}
const round = (r: number, text: string) => ({
  patch: [
    { op: "test", path: "/revision", value: r },
    { op: "add", path: "/cells/-", value: { id: r + 1, previous_id: null, kind: "note", text } },
  ],
});
function modelError(fn: () => unknown): ModelError {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ModelError, String(err));
    return err;
  }
  assert.fail("expected a ModelError");
}

describe("scripted model", () => {
  const file = write("script.json", { rounds: [round(0, "first"), { ...round(1, "second"), note: "lost once", fail_first_attempt: true }, round(2, "third")] });

  test("the round is chosen by State revision, so a restarted run continues where it was", async () => {
    const m = createModel(`scripted:${file}`);
    assert.equal(m.name, `scripted:${file}`);
    const r0 = await m.step({ state: at(0), turn: "s1:t1", attempt: 1 });
    assert.deepEqual(r0.patch, round(0, "first").patch);
    // A fresh instance (a restart) at revision 2 answers round 2, without replaying 0 and 1.
    const again = createModel(`scripted:${file}`);
    const r2 = await again.step({ state: at(2), turn: "s1:t9", attempt: 1 });
    assert.deepEqual(r2.patch, round(2, "third").patch);
    // The same revision answers the same round again (a refused patch does not move the revision).
    assert.deepEqual((await m.step({ state: at(0), turn: "s1:t1", attempt: 2 })).patch, r0.patch);
  });

  test("usage is an estimate: characters / 4", async () => {
    const m = createModel(`scripted:${file}`);
    const r = await m.step({ state: at(0), turn: "s1:t1", attempt: 1 });
    assert.ok(r.usage !== null);
    assert.equal(r.usage.output_tokens, Math.ceil(JSON.stringify(round(0, "first").patch).length / 4));
    assert.ok(r.usage.input_tokens > JSON.stringify(at(0)).length / 4, "input covers the State and the system prompt");
  });

  test("the returned patch is a copy: mutating it does not change the script", async () => {
    const m = createModel(`scripted:${file}`);
    const r = await m.step({ state: at(0), turn: "s1:t1", attempt: 1 });
    (r.patch as unknown[]).length = 0;
    assert.deepEqual((await m.step({ state: at(0), turn: "s1:t1", attempt: 1 })).patch, round(0, "first").patch);
  });

  test("fail_first_attempt: attempt 1 fails with a retryable transport error, attempt 2 succeeds", async () => {
    const m = createModel(`scripted:${file}`);
    await assert.rejects(m.step({ state: at(1), turn: "s1:t2", attempt: 1 }), (err: unknown) => {
      assert.ok(err instanceof ModelError);
      assert.deepEqual([err.kind, err.retryable, err.usage], ["transport", true, null]);
      return true;
    });
    const r = await m.step({ state: at(1), turn: "s1:t2", attempt: 2 });
    assert.deepEqual(r.patch, round(1, "second").patch);
  });

  test("past the end: not retryable, names the round", async () => {
    const m = createModel(`scripted:${file}`);
    await assert.rejects(m.step({ state: at(3), turn: "s1:t4", attempt: 1 }), (err: unknown) => {
      assert.ok(err instanceof ModelError);
      assert.equal(err.retryable, false);
      assert.match(err.message, /the scripted model has no round 3/);
      return true;
    });
  });

  test("a missing file, bad JSON and a wrong shape are clear config errors naming the file", () => {
    const missing = join(dir, "nope.json");
    const e1 = modelError(() => createModel(`scripted:${missing}`));
    assert.deepEqual([e1.kind, e1.retryable], ["config", false]);
    assert.ok(e1.message.includes(missing) && e1.message.includes("cannot read"), e1.message);

    const badJson = write("bad.json", "{ rounds: [");
    const e2 = modelError(() => createModel(`scripted:${badJson}`));
    assert.equal(e2.kind, "config");
    assert.ok(e2.message.includes(badJson) && e2.message.includes("not valid JSON"), e2.message);

    const wrong = write("wrong.json", { rounds: [round(0, "ok"), { patch: "not an array" }, { patch: [], extra: 1 }] });
    const e3 = modelError(() => ScriptedModel.fromFile(wrong));
    assert.equal(e3.kind, "config");
    assert.ok(e3.message.includes(wrong), e3.message);
    assert.ok(e3.message.includes("rounds.1.patch"), e3.message);
    assert.ok(e3.message.includes("extra"), e3.message);
  });
});
