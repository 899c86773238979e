/**
 * Issue 9 with real processes (sqlite):
 *
 * 1. A `cairn run` SIGKILLed while its cell's `sleep 30` runs; then `cairn run` of a new goal on the
 *    same database: the old process group is stopped before the new run's first cell starts (the new
 *    cell checks from inside), and the old cell is UnknownExecution with worker_stopped.
 * 2. `cairn submit` and `cairn run` to a database owned by a live `cairn serve`: the runs start and end
 *    there, the serve is never fenced (same epoch, still ready, still running); `--session` twice is one run.
 * 3. An owner frozen with SIGSTOP stops renewing its lease: the standby takes over (it never waits
 *    forever on a live process that does not renew), and the thawed owner finds itself fenced (exit 3).
 */
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import BetterSqlite3 from "better-sqlite3";
import { main } from "../src/cli/main.js";
import { cleanupProcesses, describe as said, runCairn, startCairn, type CliProcess } from "./support/cli.js";
import { readLog, ofKind } from "./support/log.js";
import { cmdPatch, concludePatch, writeScript } from "./support/patches.js";
import { alive, groupMembers, processesRunning, stat, track, until } from "./support/procs.js";

const root = mkdtempSync(join(tmpdir(), "cairn-chaos-sched-"));
after(() => {
  cleanupProcesses();
  rmSync(root, { recursive: true, force: true });
});

function dirs(name: string) {
  const dir = join(root, name);
  const data = join(dir, "data");
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  return { dir, data, work };
}

function epochOf(data: string, db: string): number {
  const conn = new BetterSqlite3(join(data, `${db}.db`), { readonly: true });
  try {
    return (conn.prepare("SELECT epoch FROM owner WHERE id = 1").get() as { epoch: number }).epoch;
  } finally {
    conn.close();
  }
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

async function readyz(port: number): Promise<{ status: number; text: string } | undefined> {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/readyz`);
    return { status: r.status, text: await r.text() };
  } catch {
    return undefined;
  }
}

/** Polls until `/readyz` on `port` answers with `status` (a hang guard, never a speed assertion). */
async function readyzIs(port: number, status: number, limitMs = 60_000): Promise<string> {
  const end = Date.now() + limitMs;
  for (;;) {
    const r = await readyz(port);
    if (r?.status === status) return r.text;
    if (Date.now() > end) throw new Error(`/readyz on ${port} never answered ${status} (last: ${JSON.stringify(r)})`);
    await new Promise((res) => setTimeout(res, 150));
  }
}

describe("owners, survivors and submitted runs with real processes", () => {
  test("the survivors of a SIGKILLed `cairn run` are stopped before the next `cairn run` launches its first cell", async () => {
    const { dir, data, work } = dirs("survivor");
    const work2 = join(dir, "work2");
    mkdirSync(work2);
    const first = join(dir, "first.json");
    // A sleep of its own length, so this host's pid of it can be found (the cell's own pids are its sandbox's).
    const sleepArgv = ["sleep", `30.${process.pid}`];
    writeScript(first, [cmdPatch(0, 1, ["sh", "-c", `${sleepArgv.join(" ")} & touch sleep.started; wait`])]);
    const proc = startCairn(["run", "leave a survivor", "--db", "w", "--data-dir", data, "--cwd", work, "--model", `scripted:${first}`]);
    const sleepPid = await until("the cell's sleep to start", () => (existsSync(join(work, "sleep.started")) ? processesRunning(sleepArgv)[0] : undefined), 60_000);
    track(sleepPid);
    const sleepStart = stat(sleepPid)!.startTime;
    proc.child.kill("SIGKILL");
    assert.equal((await proc.result).signal, "SIGKILL");
    const started = ofKind(await readLog(data, "w"), "execution_started")[0]!;
    const pgid = started.body.pgid;
    assert.ok(alive(sleepPid, sleepStart), "the sleep survived its harness");

    // The new run's first cell reports whether any member of the old group is alive when it runs.
    const probe = `alive=gone; for f in /proc/[0-9]*/stat; do set -- $(sed 's/.*) //' "$f" 2>/dev/null); [ "$3" = "${pgid}" ] && [ "$1" != Z ] && alive=alive; done; echo $alive >> probe.txt`;
    const second = join(dir, "second.json");
    writeScript(second, [cmdPatch(0, 1, ["sh", "-c", probe]), concludePatch(1, 2, "failure", "the probe has run")]);
    // Without a sandbox: the probe cell must see this host's /proc (a sandboxed one sees only its own).
    const r = await runCairn(["run", "a new goal", "--db", "w", "--data-dir", data, "--cwd", work2, "--model", `scripted:${second}`, "--sandbox", "none"]);
    assert.ok(r.code === 0 || r.code === 1, said(r));
    assert.match(r.stdout, /continuing 1 unfinished run\(s\) of the last owner: s1; 1 interrupted cell/);
    assert.equal(readFileSync(join(work2, "probe.txt"), "utf8"), "gone\n", "the new run's first cell ran after the old group was stopped");
    assert.deepEqual(groupMembers(pgid), []);
    assert.ok(!alive(sleepPid, sleepStart));
    const log = await readLog(data, "w");
    const unknown = ofKind(log, "execution_finished").find((e) => e.session === "s1" && e.body.cell_id === 1)!;
    assert.equal(unknown.body.result, "UnknownExecution");
    const s2start = ofKind(log, "execution_started").find((e) => e.session === "s2")!;
    assert.ok(unknown.seq < s2start.seq, "recovery is committed before the new run's first launch");
    const s2created = ofKind(log, "session_created").find((e) => e.session === "s2")!;
    assert.ok(unknown.seq < s2created.seq, "every unfinished run is recovered before a new one is even created");
  });

  test("runs submitted to a live `cairn serve` start and end there; nothing is fenced; --session twice is one run", async () => {
    const { dir, data, work } = dirs("submit");
    const model = join(dir, "model.json");
    writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "echo worked >> effect.txt"]), concludePatch(1, 2, "success", "done")]);
    const port = await freePort();
    const serve = startCairn(["serve", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--cwd", work, "--listen", `127.0.0.1:${port}`, "--create"], {}, 180_000);
    await readyzIs(port, 200);
    const epoch = epochOf(data, "w");

    const sub = await runCairn(["submit", "job one", "--db", "w", "--data-dir", data, "--session", "job-1"]);
    assert.equal(sub.code, 0, said(sub));
    assert.equal(sub.stdout.trim(), "job-1");
    const again = await runCairn(["submit", "job one", "--db", "w", "--data-dir", data, "--session", "job-1"]);
    assert.equal(again.code, 0, said(again));

    // `cairn run` hands its run to the live worker and follows it to the end.
    const run = await runCairn(["run", "job two", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--session", "job-2"], {}, 120_000);
    assert.equal(run.code, 0, said(run));
    assert.match(run.stdout, /handed run job-2 to it \(no takeover\)/);
    assert.match(run.stdout, /run job-2 succeeded/);
    const rerun = await runCairn(["run", "job two", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--session", "job-2"]);
    assert.equal(rerun.code, 0, said(rerun));
    assert.match(rerun.stdout, /already ended: success/);

    await poll("job-1 to end", async () => (await readStatus(data)).sessions.find((s) => s.id === "job-1" && s.status === "success"));
    const st = await readStatus(data);
    assert.deepEqual(st.sessions.map((s) => s.id).sort(), ["job-1", "job-2"], "one run per --session, however many times it was sent");
    assert.equal(st.owner?.live, true);
    assert.equal(epochOf(data, "w"), epoch, "the serving worker was never fenced");
    assert.equal((await readyz(port))?.status, 200);
    assert.equal(serve.child.exitCode, null, "the serve still runs");
    assert.equal(readFileSync(join(work, "effect.txt"), "utf8"), "worked\nworked\n", "each run's cell ran once, in the worker's --cwd");
    serve.child.kill("SIGTERM");
    const end = await serve.result;
    assert.equal(end.code, 0, said(end));
  });

  test("an owner frozen by SIGSTOP loses its lease: the standby takes over, and the thawed owner stops, fenced (exit 3, whichever lease it finds lost first)", async () => {
    const { dir, data, work } = dirs("frozen");
    const model = join(dir, "model.json");
    writeScript(model, [concludePatch(0, 1, "success", "done")]);
    const [pa, pb] = [await freePort(), await freePort()];
    const args = (port: number) => ["serve", "--db", "w", "--data-dir", data, "--model", `scripted:${model}`, "--cwd", work, "--listen", `127.0.0.1:${port}`, "--create", "--lease", "2s", "--fenced-linger", "1s"];
    const a = startCairn(args(pa), {}, 180_000);
    await readyzIs(pa, 200);
    const b = startCairn(args(pb), {}, 180_000);
    const standby = await readyzIs(pb, 503);
    assert.match(standby, /^standby: owned by .* since .*pid \d+, serve/);
    const epoch = epochOf(data, "w");
    const procs: CliProcess[] = [a, b];
    try {
      process.kill(a.pid, "SIGSTOP");
      await readyzIs(pb, 200, 90_000);
      assert.equal(epochOf(data, "w"), epoch + 1);
      process.kill(a.pid, "SIGCONT");
      const ra = await a.result;
      // Thawed, it finds the fence, or first that one of its leases ran out while it was stopped: then
      // it asks the storage, which shows the new owner, so it says it was fenced. Rarely the freeze lands
      // inside a renewal's write to the owner-lease file: the standby then ends it with SIGKILL once
      // its lease expired (storage-adapters/sqlite/lease.ts, and says so on stderr).
      if (ra.signal === "SIGKILL") {
        assert.equal((await readyz(pb))?.status, 200, "the new owner keeps the database");
        assert.equal(epochOf(data, "w"), epoch + 1, "one change of owner");
        b.child.kill("SIGTERM");
        assert.match((await b.result).stderr, /CairnFrozenLeaseHolder/, said(ra));
        return;
      }
      assert.equal(ra.code, 3, said(ra));
      assert.match(ra.stderr, /cairn: fenced: another process owns database "w" now/, said(ra));
      assert.equal((await readyz(pb))?.status, 200, "the new owner keeps the database");
      assert.equal(epochOf(data, "w"), epoch + 1, "one change of owner");
    } finally {
      for (const p of procs) {
        try {
          process.kill(p.pid, "SIGCONT");
        } catch {
          // gone
        }
      }
      b.child.kill("SIGTERM");
      await b.result;
    }
  });
});

interface StatusDoc {
  owner: { live: boolean } | null;
  sessions: { id: string; status: string }[];
}

/** `cairn status --json`, run in this process (a reader: it never disturbs the owner). */
async function readStatus(data: string): Promise<StatusDoc> {
  const out: string[] = [];
  const code = await main(["status", "--db", "w", "--data-dir", data, "--json"], { out: (l) => out.push(l), err: () => {}, env: {} });
  assert.equal(code, 0);
  return JSON.parse(out.join("\n")) as StatusDoc;
}

async function poll<T>(what: string, check: () => Promise<T | undefined>, limitMs = 60_000): Promise<T> {
  const end = Date.now() + limitMs;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
