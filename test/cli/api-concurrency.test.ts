/**
 * The HTTP API of a real `cairn serve` (sqlite) under concurrent requests and at shutdown:
 * concurrent pauses with one Idempotency-Key apply once; HEAD on the event stream ends; SIGTERM with
 * event streams open still stops the worker, exit 0, and ends the streams.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { request } from "node:http";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";
import { call, cmdRound, concludeRound, eventsOf, GATED, killAll, readSse, runOf, startServe, TOKEN, writeModel } from "./api-support.js";

const t = tempDir("cairn-api-conc-");
after(() => {
  killAll();
  t.cleanup();
});

describe("the HTTP API of a serve under concurrent requests and at shutdown", () => {
  it("applies concurrent pauses with one Idempotency-Key once, answers HEAD on the stream, and exits 0 on SIGTERM with streams open", async () => {
    const work = join(t.dir, "work");
    mkdirSync(work, { recursive: true });
    const model = writeModel(join(t.dir, "model.json"), [cmdRound(0, 1, GATED), concludeRound(1, 2, "done")]);
    const serve = await startServe(["--db", "conc", "--create", "--data-dir", join(t.dir, "data"), "--cwd", work, "--model", `scripted:${model}`]);
    const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => call(serve.url, method, `/api/v1${path}`, body, headers);
    const effect = () => (existsSync(join(work, "effect.txt")) ? readFileSync(join(work, "effect.txt"), "utf8").split("\n").filter(Boolean).length : 0);

    assert.equal((await api("POST", "/runs", { goal: "hold", session: "c1" })).status, 201);
    await until("cell 1 to run", async () => ((await runOf(serve, "c1")).executions?.[0]?.phase === "started" && effect() === 1 ? true : undefined));

    const pauses = await Promise.all([0, 1, 2, 3].map(() => api("POST", "/runs/c1/pause", { reason: "hold" }, { "idempotency-key": "same-pause" })));
    for (const p of pauses) {
      assert.equal(p.status, 200, JSON.stringify(p.json));
      assert.ok(["applied", "already"].includes(p.json.status), JSON.stringify(p.json));
    }
    const log = await eventsOf(serve, "c1");
    assert.equal(log.filter((e) => e.kind === "run_paused").length, 1, "one pause in the log");
    assert.equal(log.filter((e) => e.kind === "post_refused").length, 0, "no copy refused in the log either");

    const head = await new Promise<number>((resolve, reject) => {
      const q = request(`${serve.url}/api/v1/runs/c1/events/stream`, { method: "HEAD", headers: { authorization: `Bearer ${TOKEN}` } }, (res) => {
        res.resume().on("end", () => resolve(res.statusCode ?? 0));
      });
      q.on("error", reject);
      q.end();
      setTimeout(() => {
        q.destroy();
        reject(new Error("the HEAD's answer did not end (hang guard 60 s)"));
      }, 60_000).unref();
    });
    assert.equal(head, 200);

    const streams = [0, 1, 2].map(() => readSse(`${serve.url}/api/v1/runs/c1/events/stream`));
    for (const s of streams) assert.equal(await s.status, 200);
    await until("the streams to deliver the pause", () => streams.every((s) => s.events.some((e) => JSON.parse(e.data).kind === "run_paused")));
    const ended = streams.map((s) => s.done.then(() => "ended", (err: Error) => `cut: ${err.message}`));
    serve.child.kill("SIGTERM");
    // Hang guard: a serve held by its open streams would never exit.
    const guard = setTimeout(() => serve.child.kill("SIGKILL"), 60_000);
    assert.deepEqual(await serve.exited, { code: 0, signal: null }, serve.stderr());
    clearTimeout(guard);
    assert.deepEqual(await Promise.all(ended), ["ended", "ended", "ended"], "each stream ended cleanly, not cut");
  });
});
