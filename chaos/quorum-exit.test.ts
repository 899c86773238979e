/**
 * An outage longer than the owner's lease gets one honest answer (replicated, a real 3-member etcd):
 * the owner rides it out while its lease lasts, then stops and exits 4 saying the storage could not
 * be reached (with `--on-outage reject`, a commit refused once the outage outlasted its timeout may
 * come first: exit 4 too); never 3 ("fenced": nobody took the database over) and never 5 ("a bug").
 *
 * Two of three members are SIGKILLed (the quorum is lost) and stay down until the owner has exited.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { DevCluster } from "../src/cli/devcluster/index.js";
import { devCluster, tempDir } from "../test/replicated/helpers.js";
import { cleanupProcesses, describe as said, startCairn, type CliResult } from "./support/cli.js";
import { cmdPatch, writeScript } from "./support/patches.js";
import { until } from "./support/procs.js";

const dirs = tempDir("cairn-chaos-quorum-exit");
let dc: Awaited<ReturnType<typeof devCluster>> | undefined;
before(async () => {
  dc = await devCluster();
});
after(async () => {
  cleanupProcesses();
  await dc?.stop();
  dirs.remove();
});

function cluster(): DevCluster {
  if (dc === undefined) throw new Error("the cluster starts in before()");
  return dc.cluster;
}

/** The quorum back (members 1 and 2 restarted), whatever the test did. */
async function restore(): Promise<void> {
  for (const i of [1, 2]) await cluster().restart(i).catch(() => undefined);
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

/**
 * Exit 4 with the sentence of what stopped it first: its lease run out while the storage did not
 * answer, or (`--on-outage reject`) a commit refused because the quorum was lost past the outage
 * timeout. Never fenced, never an internal error.
 */
function checkOutageExit(r: CliResult, rejectToo = false): void {
  assert.equal(r.code, 4, said(r));
  const leaseRanOut = /cairn: lost the ownership lease of database "q\d" \(.*\): the storage could not be reached in time/;
  const refused = /cairn: refused a commit to database "q\d": the etcd quorum has been lost for .* \(--on-outage reject\)/;
  assert.ok(leaseRanOut.test(r.stderr) || (rejectToo && refused.test(r.stderr)), said(r));
  assert.doesNotMatch(r.stderr, /fenced|internal error/, said(r));
}

describe("an outage longer than the lease: exit 4, storage unreachable", () => {
  test("`cairn serve`: two of three members down past its lease", async () => {
    const dir = join(dirs.dir, "serve");
    const work = join(dir, "work");
    mkdirSync(work, { recursive: true });
    const model = join(dir, "model.json");
    writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "sleep 600"])]);
    const serve = startCairn(
      ["serve", "--db", "q1", "--storage", "replicated", "--etcd", cluster().endpoints.join(","), "--data-dir", join(dir, "data"), "--model", `scripted:${model}`, "--cwd", work, "--listen", `127.0.0.1:${await freePort()}`, "--create", "--lease", "2s"],
      {},
      180_000,
    );
    try {
      let heard = "";
      serve.child.stderr?.on("data", (d: string) => (heard += d));
      await until("the serve to own the database", () => /serving database "q1"/.test(heard) || serve.child.exitCode !== null || undefined, 120_000);
      await cluster().kill(1);
      await cluster().kill(2);
      checkOutageExit(await serve.result);
    } finally {
      serve.child.kill("SIGKILL");
      await serve.result;
      await restore();
    }
  });

  test("`cairn run --on-outage reject` with a cell running: two of three members down past its lease", async () => {
    const dir = join(dirs.dir, "run");
    const work = join(dir, "work");
    mkdirSync(work, { recursive: true });
    const model = join(dir, "model.json");
    writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "touch started; sleep 600"])]);
    const run = startCairn(
      ["run", "stay busy", "--db", "q2", "--storage", "replicated", "--etcd", cluster().endpoints.join(","), "--data-dir", join(dir, "data"), "--model", `scripted:${model}`, "--cwd", work, "--on-outage", "reject", "--outage-timeout", "1", "--lease", "2s"],
      {},
      180_000,
    );
    try {
      await until("the run's cell to start", () => existsSync(join(work, "started")) || undefined, 120_000);
      await cluster().kill(1);
      await cluster().kill(2);
      checkOutageExit(await run.result, true);
    } finally {
      run.child.kill("SIGKILL");
      await run.result;
      await restore();
    }
  });
});
