/**
 * The conformance suite (src/storage/conformance/) against the Durable Streams adapter, both modes
 * (plain, and reopen after every commit) and the two-process cases, on the reference server run as a
 * child process, file-backed in a temporary directory. Each case uses databases of its own name.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";
import type { FaultHook, Storage } from "../../src/storage/contract.js";
import { conformance } from "../../src/storage/conformance/index.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { startDevServer, type DevServer } from "../../storage-adapters/durable-streams/devserver.js";

const MODULE = fileURLToPath(new URL("../../storage-adapters/durable-streams/index.ts", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "cairn-conf-ds-"));
let server: DevServer;

before(async () => {
  server = await startDevServer({ dir: join(dir, "server") });
});

after(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

conformance(
  "durable-streams",
  async () => {
    const created: Storage[] = [];
    const make = (faults?: FaultHook) => {
      const storage = createDurableStreamsStorage({ url: server.url, ...(faults ? { faults } : {}) });
      created.push(storage);
      return storage;
    };
    return {
      storage: make(),
      reopenStorage: async () => make(),
      storageWithFaults: async (faults) => make(faults),
      otherProcess: { module: MODULE, exportName: "createDurableStreamsStorage", config: { url: server.url } },
      cleanup: async () => {
        for (const s of created) await s.close();
      },
    };
  },
  { persists: true },
);
