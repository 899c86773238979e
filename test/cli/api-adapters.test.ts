/**
 * The HTTP API of `cairn serve` on the memory adapter (the database lives in the serve process) and
 * on Durable Streams (the reference server, file-backed, started here): one run submitted under an
 * approval rule, paused while its first cell runs, unpaused, its gated cell approved, then forked
 * after round 1 and the fork cancelled, all through the API. The first cell appends a line to a file:
 * one line at the end means neither the pause, the approval nor the fork ran it twice.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";
import { startDevServer, type DevServer } from "../../storage-adapters/durable-streams/devserver.js";
import { call, cmdRound, concludeRound, GATED, killAll, runOf, startServe, writeModel } from "./api-support.js";

const t = tempDir("cairn-api-adapters-");
let server: DevServer | null = null;
after(async () => {
  killAll();
  await server?.stop();
  t.cleanup();
});

async function scenario(name: string, storage: (dir: string) => Promise<string[]>): Promise<void> {
  const dir = join(t.dir, name);
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  const model = writeModel(join(dir, "model.json"), [cmdRound(0, 1, GATED), cmdRound(1, 2, ["touch", "touched"]), concludeRound(2, 3, "done")]);
  const effect = () => (existsSync(join(work, "effect.txt")) ? readFileSync(join(work, "effect.txt"), "utf8").split("\n").filter(Boolean).length : 0);
  const serve = await startServe(["--db", `api-${name}`, "--create", ...(await storage(dir)), "--cwd", work, "--model", `scripted:${model}`]);
  const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => call(serve.url, method, `/api/v1${path}`, body, headers);

  const sub = await api("POST", "/runs", { goal: "touch, approved", session: "r1", require_approval: ["argv:touch"] });
  assert.equal(sub.status, 201, JSON.stringify(sub.json));
  await until("cell 1 to run", async () => ((await runOf(serve, "r1")).executions?.[0]?.phase === "started" && effect() === 1 ? true : undefined));
  const pause = await api("POST", "/runs/r1/pause", { reason: "look first" });
  assert.equal(pause.status, 200, JSON.stringify(pause.json));
  assert.equal(pause.json.status, "applied");
  writeFileSync(join(work, "release"), "");
  await until("cell 1 to finish while paused", async () => ((await runOf(serve, "r1")).executions?.[0]?.phase === "finished" ? true : undefined));
  assert.equal((await runOf(serve, "r1")).status, "paused");
  const unpause = await api("POST", "/runs/r1/unpause", {});
  assert.equal(unpause.status, 200, JSON.stringify(unpause.json));
  await until("cell 2 to wait for approval", async () => ((await runOf(serve, "r1")).status === "awaiting_approval" ? true : undefined));
  const approve = await api("POST", "/runs/r1/cells/2/approve", { reason: "fine" });
  assert.equal(approve.status, 200, JSON.stringify(approve.json));
  await until("r1 to end", async () => ((await runOf(serve, "r1")).status === "success" ? true : undefined));
  assert.equal(existsSync(join(work, "touched")), true, "the approved cell ran");

  const fork = await api("POST", "/runs/r1/fork", { at_round: 1, new_session: "r1-fork" });
  assert.equal(fork.status, 200, JSON.stringify(fork.json));
  const f = await until("the fork to wait for its own approval", async () => {
    const r = await runOf(serve, "r1-fork");
    return r?.status === "awaiting_approval" ? r : undefined;
  });
  assert.deepEqual(f.fork_of, { session: "r1", round: 1 });
  const cancel = await api("POST", "/runs/r1-fork/cancel", { reason: "enough" });
  assert.equal(cancel.status, 200, JSON.stringify(cancel.json));
  await until("the fork to end cancelled", async () => ((await runOf(serve, "r1-fork")).status === "cancelled" ? true : undefined));
  assert.equal(effect(), 1, "cell 1 ran once: not again after the pause, nor in the fork");
  assert.equal((await runOf(serve, "r1")).status, "success", "the origin is untouched");
}

describe("the HTTP API on the memory and Durable Streams adapters", () => {
  it("memory: submit, pause, unpause, approve, fork, cancel", async () => {
    await scenario("memory", async () => ["--storage", "memory"]);
  });
  it("durable-streams: submit, pause, unpause, approve, fork, cancel", async () => {
    await scenario("ds", async (dir) => {
      server = await startDevServer({ dir: join(dir, "server") });
      return ["--storage", "durable-streams", "--url", server.url, "--data-dir", join(dir, "data")];
    });
  });
});
