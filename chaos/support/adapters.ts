/**
 * The adapters a chaos test drives real `cairn` processes on, each with the servers it needs: sqlite
 * (a data dir), replicated (a 3-member etcd cluster the file starts) and durable-streams (the
 * reference server, file-backed, the file starts). `adapters(root)` registers the hooks that start
 * the servers before the file's tests and stop them after, whatever the tests did.
 */
import { join } from "node:path";
import { after, before } from "node:test";
import type { Storage } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { startDevServer, type DevServer } from "../../storage-adapters/durable-streams/devserver.js";
import { startDevCluster, type DevCluster } from "../../src/cli/devcluster/index.js";

export interface ChaosAdapter {
  readonly name: "sqlite" | "replicated" | "durable-streams";
  /** Storage flags for a `cairn` process in role `role` (replicated: a data dir of its own per process). */
  flags(dir: string, role: string): string[];
  /** A storage for the test's own reads. */
  storage(dir: string): Storage;
}

/** The three adapters; their servers start in a `before` hook and stop in an `after` hook. */
export function adapters(root: string): { sqlite: ChaosAdapter; replicated: ChaosAdapter; durableStreams: ChaosAdapter } {
  let cluster: DevCluster | null = null;
  let server: DevServer | null = null;
  before(async () => {
    [cluster, server] = await Promise.all([startDevCluster({ dir: join(root, "etcd") }), startDevServer({ dir: join(root, "ds") })]);
  });
  after(async () => {
    await Promise.all([cluster?.stop(), server?.stop()]);
  });
  return {
    sqlite: {
      name: "sqlite",
      flags: (dir) => ["--data-dir", join(dir, "data")],
      storage: (dir) => createSqliteStorage({ dataDir: join(dir, "data") }),
    },
    replicated: {
      name: "replicated",
      flags: (dir, role) => ["--storage", "replicated", "--etcd", cluster!.endpoints.join(","), "--data-dir", join(dir, `data-${role}`)],
      storage: (dir) => createReplicatedStorage({ endpoints: cluster!.endpoints, dataDir: join(dir, `data-check-${Date.now()}`) }),
    },
    durableStreams: {
      name: "durable-streams",
      flags: (dir) => ["--storage", "durable-streams", "--url", server!.url, "--data-dir", join(dir, "data")],
      storage: () => createDurableStreamsStorage({ url: server!.url }),
    },
  };
}
