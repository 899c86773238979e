/**
 * The shared Storage conformance suite (src/storage/conformance/) against the replicated adapter, on
 * one real three-member etcd cluster for the whole file. Each case gets fresh local data directories;
 * a Storage from `reopenStorage()` uses another directory, as another machine would (its local copy is
 * rebuilt), and so does the second OS process of the two-process cases.
 */
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";
import type { FaultHook, Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { conformance } from "../../src/storage/conformance/index.js";
import { devCluster, tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

const MODULE = fileURLToPath(new URL("../../storage-adapters/replicated/index.ts", import.meta.url));

let dc: Awaited<ReturnType<typeof devCluster>> | null = null;
before(async () => {
  dc = await devCluster();
});
after(async () => {
  await dc?.stop();
});

conformance(
  "replicated",
  async () => {
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
      otherProcess: { module: MODULE, exportName: "createReplicatedStorage", config: { endpoints: dc!.cluster.endpoints, dataDir: `${dir}/other-process`, commitTimeoutMs: 3000 } },
      cleanup: async () => {
        for (const s of created) await s.close();
        remove();
      },
    };
  },
  { persists: true },
);

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/conformance.test.ts");
