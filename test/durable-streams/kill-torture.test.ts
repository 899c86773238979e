/**
 * The kill torture on the Durable Streams adapter: an owner process commits batches of two events as
 * fast as it can and is SIGKILLed at a random moment (seeded: CAIRN_SEED=<n> re-runs a schedule),
 * mid-commit most of the time; a new owner process opens the same database and goes on; again and
 * again. After every kill, in this process: every batch any owner was told was committed is in the
 * log at the seqs it was told, the seqs are gap-free, identities are unique, and no batch is half
 * there. A variant also kills the server under every second owner's commits (so commits fall in the
 * server's crash window too) and restarts it; that owner rides the outage out, then is killed.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import type { LogEvent } from "../../src/state/events.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { assertReceipted, assertWellFormed, devServer, reconciled, withServerLog } from "./helpers.js";

const seed = process.env["CAIRN_SEED"] !== undefined ? Number(process.env["CAIRN_SEED"]) : Date.now() % 100_000;
function random(n: number): () => number {
  let x = n || 1;
  return () => {
    x = (x * 48271) % 2147483647;
    return x / 2147483647;
  };
}

interface Receipt {
  readonly firstSeq: number;
  readonly lastSeq: number;
  readonly identities: string[];
}

/** The owner process: opens, prints {opened}, then commits pairs forever, printing each receipt. */
function writeOwnerScript(path: string): void {
  const adapter = fileURLToPath(new URL("../../storage-adapters/durable-streams/index.ts", import.meta.url));
  const fixtures = fileURLToPath(new URL("../../src/storage/conformance/fixtures.ts", import.meta.url));
  writeFileSync(
    path,
    `import { createDurableStreamsStorage } from ${JSON.stringify(adapter)};
import { inbox, sessionCreated } from ${JSON.stringify(fixtures)};
const [url, name] = process.argv.slice(2);
const storage = createDurableStreamsStorage({ url });
const db = await storage.open(name);
process.stdout.write(JSON.stringify({ opened: db.epoch }) + "\\n");
if ((await db.head()) === 0) {
  const r = await db.commit([sessionCreated("s1")]);
  process.stdout.write(JSON.stringify({ ...r, identities: [sessionCreated("s1").identity] }) + "\\n");
}
for (let i = 0; ; i++) {
  const events = [inbox("s1", \`e\${db.epoch}-\${i}-a\`), inbox("s1", \`e\${db.epoch}-\${i}-b\`, { pad: "x".repeat((i * 397) % 3000) })];
  const r = await db.commit(events);
  process.stdout.write(JSON.stringify({ ...r, identities: events.map((e) => e.identity) }) + "\\n");
}
`,
  );
}

function startOwner(script: string, url: string, name: string): { child: ChildProcess; receipts: Receipt[]; opened: () => number | null; stderr: () => string; exited: Promise<void> } {
  const child = spawn(process.execPath, ["--import", "tsx", script, url, name], { stdio: ["ignore", "pipe", "pipe"] });
  const receipts: Receipt[] = [];
  let opened: number | null = null;
  let buf = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => {
    buf += d;
    for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
      const line = JSON.parse(buf.slice(0, nl)) as { opened?: number } & Receipt;
      buf = buf.slice(nl + 1);
      if (typeof line.opened === "number") opened = line.opened;
      else receipts.push(line);
    }
  });
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err = (err + d).slice(-4000)));
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  return { child, receipts, opened: () => opened, stderr: () => err, exited };
}

async function readLog(url: string, name: string): Promise<LogEvent[]> {
  const s = createDurableStreamsStorage({ url });
  try {
    return await (await s.reader(name)).read(0);
  } finally {
    await s.close();
  }
}

/** Every loop batch is whole: its two events, a then b, next to each other. */
function assertWhole(log: readonly LogEvent[]): void {
  const pairs = log.filter((e) => /:e\d+-\d+-[ab]$/.test(e.identity));
  assert.equal(pairs.length % 2, 0, "no batch is half there");
  for (let i = 0; i < pairs.length; i += 2) {
    assert.ok(pairs[i]!.identity.endsWith("-a") && pairs[i + 1]!.identity === pairs[i]!.identity.replace(/-a$/, "-b") && pairs[i + 1]!.seq === pairs[i]!.seq + 1, `batch at seq ${pairs[i]!.seq} is whole`);
  }
}

async function torture(options: { owners: number; killServerEvery: number }): Promise<void> {
  const server = await devServer(options.killServerEvery > 0 ? "torture-server" : "torture");
  const script = join(server.root, "owner.mts");
  writeOwnerScript(script);
  const rand = random(seed);
  const all: Receipt[] = [];
  const epochs: number[] = [];
  try {
    await withServerLog(server, async () => {
      for (let k = 0; k < options.owners; k++) {
        const owner = startOwner(script, server.url, "torture");
        try {
          const want = 1 + Math.floor(rand() * 12);
          const deadline = Date.now() + 120_000;
          while (owner.receipts.length < want) {
            assert.ok(Date.now() < deadline && owner.child.exitCode === null, `owner ${k} committed ${want} batches (stderr: ${owner.stderr()})`);
            await new Promise((r) => setTimeout(r, 5));
          }
          if (options.killServerEvery > 0 && k % options.killServerEvery === options.killServerEvery - 1) {
            // The server dies under this owner's commits and comes back; the owner rides it out, then dies too.
            await new Promise((r) => setTimeout(r, Math.floor(rand() * 15)));
            await server.kill();
            await new Promise((r) => setTimeout(r, Math.floor(rand() * 300)));
            await server.restart();
            const more = owner.receipts.length + 2;
            while (owner.receipts.length < more) {
              assert.ok(Date.now() < deadline && owner.child.exitCode === null, `owner ${k} went on after the server restarted (stderr: ${owner.stderr()})`);
              await new Promise((r) => setTimeout(r, 5));
            }
          }
          // Mid-commit: the owner sends its next batch right after printing a receipt.
          await new Promise((r) => setTimeout(r, Math.floor(rand() * 15)));
          owner.child.kill("SIGKILL");
          await owner.exited;
        } finally {
          if (owner.child.exitCode === null && owner.child.signalCode === null) owner.child.kill("SIGKILL");
        }
        all.push(...owner.receipts);
        epochs.push(owner.opened()!);
        const log = await readLog(server.url, "torture");
        assertWellFormed(log, `after owner ${k} was killed`);
        assertReceipted(log, all, `after owner ${k} was killed`);
        assertWhole(log);
      }
      assert.deepEqual(epochs, [...epochs].sort((a, b) => a - b), "each owner's epoch is above the one before");
      assert.equal(new Set(epochs).size, epochs.length);
      assert.ok(all.length >= options.owners, `owners committed (${all.length} receipts) so the run means something`);
      const log = await readLog(server.url, "torture");
      console.log(`# kill torture (seed ${seed}): ${options.owners} owners SIGKILLed, ${all.length} receipted batches, ${log.length} events in the log; server restarts finding an unrecorded record: ${reconciled(server)}`);
    });
  } catch (err) {
    (err as Error).message += ` (seed ${seed})`;
    throw err;
  }
}

describe("durable-streams: the kill torture", { timeout: 900_000 }, () => {
  it(`an owner SIGKILLed mid-commit, 20 times, each followed by a new owner: no receipted batch lost, none half there (seed ${seed})`, async () => {
    await torture({ owners: 20, killServerEvery: 0 });
  });

  it(`the same with the server SIGKILLed under every second owner's commits and restarted (seed ${seed})`, async () => {
    await torture({ owners: 12, killServerEvery: 2 });
  });
});
