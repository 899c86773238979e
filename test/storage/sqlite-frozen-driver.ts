/**
 * The owner of sqlite-frozen.test.ts: opens DATA_DIR/NAME and commits big batches (the write lock is
 * held for most of its time, so a SIGSTOP from the test lands inside it quickly). Prints
 * `{"t":"opened","epoch":E,"pid":P}` once, then `{"t":"ok","n":N}` after each commit.
 */
import { ev } from "../replicated/helpers.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";

const [dataDir, name] = process.argv.slice(2) as [string, string];
const storage = createSqliteStorage({ dataDir });
const db = await storage.open(name);
process.stdout.write(`${JSON.stringify({ t: "opened", epoch: db.epoch, pid: process.pid })}\n`);
for (let n = 0; ; n++) {
  const batch = Array.from({ length: 400 }, (_, k) => ev(`b${n}-${k}`));
  await db.commit(batch);
  process.stdout.write(`${JSON.stringify({ t: "ok", n })}\n`);
}
