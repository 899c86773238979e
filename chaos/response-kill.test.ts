/**
 * Kill after the model response: a real `cairn run` against an OpenAI-compatible server is
 * SIGKILLed right after a complete response is committed (with its verdict in the same commit,
 * before anything it authorizes is done). `cairn resume` must carry on from that committed
 * response WITHOUT calling the provider again for that round (the server counts its requests; the
 * log counts `model_attempt` events), then carry the run to its end.
 * Killed once at round 1 (the response adds a cell) and once at round 2 (the response concludes).
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { readInspection } from "../src/cli/status.js";
import { createSqliteStorage } from "../storage-adapters/sqlite/index.js";
import { cleanupProcesses, describe as said, runCairn } from "./support/cli.js";
import { effectLines, endedByConclusion, observedByModel, oneFinish, oneStart } from "./support/checks.js";
import { startFakeOpenAI, type FakeOpenAI } from "./support/fake-openai.js";
import { brief, ofKind, readLog } from "./support/log.js";
import { cmdPatch, concludePatch } from "./support/patches.js";

const DB = "chaos";
const root = mkdtempSync(join(tmpdir(), "cairn-chaos-response-"));

describe("SIGKILL after the model response is committed", () => {
  let server: FakeOpenAI;
  before(async () => {
    server = await startFakeOpenAI((r) => {
      if (r.revision === 0) return cmdPatch(0, 1, ["sh", "-c", "echo ran >> effect.txt"]);
      if (r.revision === 1) return concludePatch(1, 2, "success", "the line is there");
      return null;
    });
  });
  after(async () => {
    cleanupProcesses();
    await server?.close();
    rmSync(root, { recursive: true, force: true });
  });

  for (const round of [1, 2]) {
    test(`round ${round}: resume carries on from the committed response without asking the provider again`, async () => {
      server.seen.length = 0;
      const turn = `s1:t${round}`;
      const dir = join(root, `round-${round}`);
      const data = join(dir, "data");
      const work = join(dir, "work");
      mkdirSync(work, { recursive: true });
      const common = ["--db", DB, "--data-dir", data, "--model", "openai/fake", "--base-url", server.baseUrl];

      const killed = await runCairn(["run", "append one line to effect.txt", ...common, "--cwd", work], { CAIRN_CHAOS_KILL_AT: `model:response-committed@${round}` });
      assert.equal(killed.signal, "SIGKILL", said(killed));
      let log = await readLog(data, DB);
      const responses = ofKind(log, "model_response").filter((e) => e.body.turn === turn);
      assert.equal(responses.length, 1, `the response of ${turn} is committed before the kill:\n${brief(log)}`);
      // The response is committed together with its verdict (a round at 3 commits; the
      // response alone only when both do not fit one commit): at most that one acceptance so far,
      // of exactly the committed patch.
      const acceptedBefore = ofKind(log, "patch_accepted").filter((e) => e.body.turn === turn);
      assert.ok(acceptedBefore.length <= 1, `at most one acceptance of ${turn} before the kill:\n${brief(log)}`);
      for (const a of acceptedBefore) assert.deepEqual(a.body.patch, responses[0]!.body.patch);
      assert.deepEqual(
        server.seen.map((r) => r.turn),
        Array.from({ length: round }, (_, i) => `s1:t${i + 1}`),
        "one request per round so far",
      );

      const resumed = await runCairn(["resume", ...common]);
      assert.equal(resumed.code, 0, said(resumed));
      log = await readLog(data, DB);

      assert.equal(server.seen.filter((r) => r.turn === turn).length, 1, `the provider saw exactly one request for ${turn}`);
      assert.deepEqual(
        server.seen.map((r) => [r.turn, r.attempt]),
        [
          ["s1:t1", 1],
          ["s1:t2", 1],
        ],
        "exactly one request per round over both processes",
      );
      assert.equal(ofKind(log, "model_attempt").filter((e) => e.body.turn === turn).length, 1, `one model_attempt for ${turn}`);
      const accepted = ofKind(log, "patch_accepted").filter((e) => e.body.turn === turn);
      assert.equal(accepted.length, 1);
      assert.equal(accepted[0]!.body.attempt, 1);
      assert.deepEqual(accepted[0]!.body.patch, responses[0]!.body.patch, "the committed response is what was admitted");
      assert.equal(ofKind(log, "model_response").length, 2, "no second response for any round");
      oneStart(log, 1);
      assert.equal(oneFinish(log, 1).body.result, "success");
      assert.equal(effectLines(join(work, "effect.txt")), 1);
      assert.equal(observedByModel(log, 1), "execution_success");
      endedByConclusion(log, "success");
      const storage = createSqliteStorage({ dataDir: data });
      const inspection = await readInspection(storage, DB).finally(() => storage.close());
      assert.equal(inspection.sessions[0]!.usage.attempts, 2, "two attempts in all: usage counts what was really called");
      assert.equal(inspection.sessions[0]!.usage.input_tokens, 200);
      assert.equal(inspection.sessions[0]!.usage.unknown_usage_attempts, 0);
    });
  }
});
