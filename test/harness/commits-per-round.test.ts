/**
 * A round with one cell costs at most 3 commits: (previous result + its observation + the next
 * turn's preparation + attempt), (response + admission + queued execution), (`started`, alone,
 * before the child runs). Counted through a Storage wrapper on the real sqlite adapter, with real
 * `true` processes.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { join } from "node:path";
import type { NewEvent } from "../../src/state/events.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { tagBatches } from "../../chaos/support/tagging.js";
import { LoopModel } from "../../chaos/support/loop-model.js";
import { tempDir } from "./support.js";
import { withHarness } from "../support/harness.js";


test("a round with one `true` cell takes at most 3 commits, and `started` is committed alone", async (t) => {
  const tmp = tempDir("cairn-commits-");
  t.after(() => tmp.cleanup());
  const batches: (readonly NewEvent[])[] = [];
  const storage = tagBatches(createSqliteStorage({ dataDir: join(tmp.dir, "data") }), (events) => batches.push(events));
  const rounds = 12;
  await withHarness({ storage, name: "commits", model: new LoopModel(rounds), workDir: join(tmp.dir, "work") }, async (h) => {
    const id = await h.start({ goal: "loop", cwd: tmp.dir });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
  }).finally(() => storage.close());
  const kinds = batches.map((b) => b.map((e) => e.kind));
  const started = kinds.filter((k) => k.includes("execution_started"));
  assert.equal(started.length, rounds, "one cell per round ran");
  assert.ok(started.every((k) => k.length === 1), "`started` is always a commit of its own");
  // session_created, then `rounds` rounds with a cell, then the concluding round and run_ended.
  const roundCommits = batches.length - 1;
  const perRound = roundCommits / (rounds + 1);
  assert.ok(perRound <= 3, `${roundCommits} commits for ${rounds + 1} rounds: ${perRound.toFixed(2)} per round, more than 3 (${JSON.stringify(kinds.slice(0, 8))})`);
  const combined = kinds.filter((k) => k.includes("execution_finished") && k.includes("turn_prepared") && k.includes("model_attempt"));
  assert.ok(combined.length >= rounds - 1, "a cell's result is committed together with the next round's preparation and attempt");
  assert.ok(kinds.filter((k) => k.includes("model_response") && k.includes("patch_accepted")).length >= rounds, "responses are committed with their verdict");
});
