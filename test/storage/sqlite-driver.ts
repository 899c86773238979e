/**
 * A child process for the two-process sqlite tests: opens database NAME in DATA_DIR (taking
 * ownership), commits BATCHES batches, printing one JSON line per resolved receipt, then obeys
 * commands on stdin, one per line:
 *   watch   start watching; every signal is printed as {"signal": ...}
 *   commit  commit one more event; prints {"receipt": ...} or {"error": {...}}
 *   exit    close and exit 0
 *
 * Usage: node --import tsx test/storage/sqlite-driver.ts DATA_DIR NAME BATCHES POLL_MS
 */
import { createInterface } from "node:readline";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { inbox, sessionCreated } from "../conformance/fixtures.js";

const [dataDir, name, batchesArg, pollArg] = process.argv.slice(2);
if (dataDir === undefined || name === undefined) {
  console.error("usage: sqlite-driver.ts DATA_DIR NAME BATCHES POLL_MS");
  process.exit(2);
}
const say = (line: unknown) => console.log(JSON.stringify(line));
const storage = createSqliteStorage({ dataDir, fencePollMs: Number(pollArg ?? 100) });
const db = await storage.open(name);
say({ opened: db.epoch });

for (let i = 0; i < Number(batchesArg ?? 0); i++) {
  const events = i === 0 ? [sessionCreated("child"), inbox("child", `c${i}`)] : [inbox("child", `c${i}-a`), inbox("child", `c${i}-b`)];
  const receipt = await db.commit(events);
  say({ receipt, identities: events.map((e) => e.identity) });
}
say({ ready: true });

let late = 0;
for await (const line of createInterface({ input: process.stdin })) {
  const command = line.trim();
  if (command === "watch") {
    db.watch((signal) => say({ signal }));
    say({ watching: true });
  } else if (command === "commit") {
    try {
      const receipt = await db.commit([inbox("child", `late-${late++}`)]);
      say({ receipt });
    } catch (err) {
      const e = err as { name?: string; code?: string; action?: string; reason?: string; message?: string };
      say({ error: { name: e.name, code: e.code, action: e.action, reason: e.reason, message: e.message } });
    }
  } else if (command === "exit") {
    break;
  }
}
await db.close();
await storage.close();
process.exit(0);
