/**
 * The shared Storage conformance suite against the replicated adapter, on one real three-member
 * etcd cluster for the whole file. Each case gets fresh local data directories; a Storage from
 * `reopenStorage()` uses another directory, as another machine would (its local copy is rebuilt).
 */
import { after, before } from "node:test";
import type { FaultHook, Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { conformance } from "../conformance/suite.js";
import { devCluster, tempDir } from "./helpers.js";

let dc: Awaited<ReturnType<typeof devCluster>> | null = null;
before(async () => {
  dc = await devCluster();
});
after(async () => {
  await dc?.stop();
});

conformance("replicated", async () => {
  const { dir, remove } = tempDir("conf-replicated");
  const created: Storage[] = [];
  const make = (faults?: FaultHook) => {
    const storage = createReplicatedStorage({ endpoints: dc!.cluster.endpoints, dataDir: `${dir}/machine-${created.length}`, faults, commitTimeoutMs: 3000 });
    created.push(storage);
    return storage;
  };
  return {
    storage: make(),
    reopenStorage: async () => make(),
    storageWithFaults: async (faults) => make(faults),
    cleanup: async () => {
      for (const s of created) await s.close();
      remove();
    },
  };
});
