/**
 * The conformance suite (src/storage/conformance/) against the sqlite adapter, each case in its own
 * temporary directory; the two-process cases start a second node process on the same directory.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { FaultHook, Storage } from "../../src/storage/contract.js";
import { conformance } from "../../src/storage/conformance/index.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";

const MODULE = fileURLToPath(new URL("../../storage-adapters/sqlite/index.ts", import.meta.url));

conformance(
  "sqlite",
  async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "cairn-conf-sqlite-"));
    const created: Storage[] = [];
    const make = (faults?: FaultHook) => {
      const storage = createSqliteStorage({ dataDir, faults, fencePollMs: 25 });
      created.push(storage);
      return storage;
    };
    return {
      storage: make(),
      reopenStorage: async () => make(),
      storageWithFaults: async (faults) => make(faults),
      otherProcess: { module: MODULE, exportName: "createSqliteStorage", config: { dataDir, fencePollMs: 25 } },
      cleanup: async () => {
        for (const s of created) await s.close();
        rmSync(dataDir, { recursive: true, force: true });
      },
    };
  },
  { persists: true },
);
