/**
 * The `cairn` command on `--storage durable-streams --url URL` (and CAIRN_DS_URL), against the
 * reference server: a run end to end, `cairn log` (text and --json exactly as stored) without taking
 * ownership, `cairn log --follow` in another process printing a live run's events as they commit,
 * `cairn post --wait` delivered by a live owner woken by its mailbox watch (a long-poll), the
 * timeline page's stream (a snapshot, then updates), and the usage errors.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { cmdPatch, concludePatch, writeScript } from "../../chaos/support/patches.js";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import { createTimelineHandler } from "../../src/ui/server.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { killAll, spawnCairn } from "../ui/scenario.js";
import { until } from "../support/wait.js";
import { cairnIn } from "../cli/support.js";
import { devServer } from "./helpers.js";
import type { ChildProcess } from "node:child_process";

/** A model that concludes once `release()` is called: the run stays open (and drains its mailbox) meanwhile. */
function heldModel(): Model & { release(): void; calls: number } {
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const m = {
    name: "scripted:held",
    calls: 0,
    release: () => open(),
    async step(req: ModelRequest): Promise<ModelReply> {
      m.calls++;
      await gate;
      const id = req.state.runtime.next_cell_id;
      return { patch: [{ op: "test", path: "/revision", value: req.state.revision }, { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "done" } }], usage: { input_tokens: 1, output_tokens: 1 } } as ModelReply;
    },
  };
  return m;
}

/** The number of claim records in database `name`'s log stream (each open appends one). */
async function claims(url: string, name: string): Promise<number> {
  const records = (await (await fetch(`${url}/${name}/log?offset=-1`)).json()) as { t: string }[];
  return records.filter((r) => r.t === "claim").length;
}

describe("cairn on --storage durable-streams", { timeout: 600_000 }, () => {
  const children: ChildProcess[] = [];
  after(() => killAll(children));

  it("runs, shows the log (text, and --json exactly as stored) and reads without taking ownership; CAIRN_DS_URL works too", async () => {
    const server = await devServer("cli");
    const work = join(server.root, "work");
    mkdirSync(work, { recursive: true });
    const model = join(server.root, "model.json");
    writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "echo hello from the streams"]), concludePatch(1, 2, "success", "said hello")]);
    const flags = ["--db", "clirun", "--storage", "durable-streams", "--url", server.url, "--data-dir", join(server.root, "data")];
    const run = await cairnIn(["run", "say hello", ...flags, "--model", `scripted:${model}`, "--cwd", work]);
    assert.equal(run.code, 0, run.stderr + run.stdout);

    const before = await claims(server.url, "clirun");
    const text = await cairnIn(["log", ...flags]);
    assert.equal(text.code, 0, text.stderr);
    for (const re of [/run\s+s1 started .*"say hello"/, /round 1\s+accepted: revision 1/, /│ hello from the streams/, /cell 1\s+success exit 0/, /end\s+run s1 success/]) assert.match(text.stdout, re);
    const json = await cairnIn(["log", "--db", "clirun", "--storage", "durable-streams", "--data-dir", join(server.root, "data"), "--json"], { env: { CAIRN_DS_URL: server.url } });
    assert.equal(json.code, 0, json.stderr);
    const storage = createDurableStreamsStorage({ url: server.url });
    try {
      const stored = await (await storage.reader("clirun")).read(0);
      assert.deepEqual(
        json.stdout.trimEnd().split("\n").map((l) => JSON.parse(l) as unknown),
        JSON.parse(JSON.stringify(stored)),
      );
      assert.ok((await storage.list()).includes("clirun"));
    } finally {
      await storage.close();
    }
    assert.equal(await claims(server.url, "clirun"), before, "reading the log claims nothing");
  });

  it("refuses --storage durable-streams without a URL, and a URL that is not one, as usage errors", async () => {
    const missing = await cairnIn(["log", "--db", "x", "--storage", "durable-streams"], { env: { CAIRN_DS_URL: "" } });
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /--url/);
    const bad = await cairnIn(["log", "--db", "x", "--storage", "durable-streams", "--url", "not a url"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /not a URL/);
  });

  it("follows a live run from another process, delivers `post --wait` through the owner's mailbox watch, and streams the timeline", async () => {
    const server = await devServer("live");
    const storage = createDurableStreamsStorage({ url: server.url });
    const model = heldModel();
    const h = await Harness.open({ storage, name: "live", model, workDir: join(server.root, "work") });
    const page = createTimelineHandler({ storage, databases: async () => ["live"], pollMs: 50 });
    const http = createServer((req, res) => {
      void page.handle(req, res);
    });
    await new Promise<void>((r) => http.listen(0, "127.0.0.1", () => r()));
    const pageUrl = `http://127.0.0.1:${(http.address() as { port: number }).port}`;
    try {
      const s = await h.start({ goal: "wait for posts", cwd: server.root });
      await until("the round to ask the model", () => model.calls >= 1);
      const flags = ["--db", "live", "--storage", "durable-streams", "--url", server.url, "--data-dir", join(server.root, "data")];
      const follow = spawnCairn(["log", ...flags, "--follow", "--json", "--poll-ms", "50"], children);
      await until("--follow to print the history so far", () => follow.out().includes('"turn_prepared"'));

      // The timeline's stream: its snapshot now, an update once the post lands.
      const ac = new AbortController();
      const streamed: string[] = [];
      const reading = (async () => {
        const res = await fetch(`${pageUrl}/api/stream?db=live`, { signal: ac.signal });
        assert.equal(res.status, 200);
        const decoder = new TextDecoder();
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) streamed.push(decoder.decode(chunk, { stream: true }));
      })().catch(() => undefined);
      await until("the timeline stream's snapshot", () => streamed.join("").includes("event: snapshot"));

      const posted = await cairnIn(["post", ...flags, "--session", s, "--kind", "ci", "--id", "ci-green", "--payload", '{"green":true}', "--wait"]);
      assert.equal(posted.code, 0, posted.stderr);
      assert.match(posted.stdout, /delivered ci-green to the inbox of s1/);
      assert.ok(h.session(s)!.observations.has("ci-green"), "the owner's projection holds it");
      await until("--follow to print the delivered message", () => follow.out().includes("ci-green"));
      await until("the timeline stream to send an update", () => streamed.join("").includes("event: update"));

      model.release();
      const ended = await h.wait(s);
      const logged = await until("--follow to print the end of the run", () => {
        if (follow.child.exitCode !== null) throw new Error(`cairn log --follow exited ${follow.child.exitCode}: ${follow.err()}`);
        return follow.out().includes('"run_ended"') || (h.status !== "open" ? `the owner stopped (${h.status}) after the run's wait answered ${JSON.stringify(ended)}` : false);
      });
      assert.equal(logged, true, String(logged));
      ac.abort();
      await reading;
      follow.child.kill("SIGINT");
      await follow.exit;
    } finally {
      model.release();
      await h.close();
      await page.close();
      await new Promise<void>((r) => http.close(() => r()));
      await storage.close();
    }
  });
});
