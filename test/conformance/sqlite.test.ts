/**
 * The conformance suite against the sqlite adapter, each case in its own temporary directory.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Storage } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { conformance } from "./suite.js";

conformance("sqlite", async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "cairn-conf-sqlite-"));
  const created: Storage[] = [];
  const make = (faults?: Parameters<typeof createSqliteStorage>[0]["faults"]) => {
    const storage = createSqliteStorage({ dataDir, faults, fencePollMs: 25 });
    created.push(storage);
    return storage;
  };
  return {
    storage: make(),
    reopenStorage: async () => make(),
    storageWithFaults: async (faults) => make(faults),
    cleanup: async () => {
      for (const s of created) await s.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
});
