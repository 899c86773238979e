/**
 * The conformance suite (src/storage/conformance/) against the memory adapter, the reference semantics.
 */
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { conformance } from "../../src/storage/conformance/index.js";

conformance("memory", async () => {
  const storage = createMemoryStorage();
  return {
    storage,
    reopenStorage: async () => storage,
    storageWithFaults: async (faults) => createMemoryStorage({ faults }),
    cleanup: async () => storage.close(),
  };
});
