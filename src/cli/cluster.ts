/**
 * `cairn cluster up|down|status`: a local three-zone etcd cluster for development and tests.
 * PLACEHOLDER until the replicated adapter's dev cluster lands.
 */
import { UsageError } from "./args.js";
import type { Io } from "./main.js";

export async function clusterCommand(_argv: readonly string[], _io: Io): Promise<number> {
  throw new UsageError("cairn cluster: not wired yet (the dev cluster is being written).");
}
