/**
 * `npm run bench`: every benchmark, one after the other, each printing ratios measured in one run.
 * Never a test: nothing here asserts on time. Pass names to run some: `npm run bench -- sqlite etcd`.
 */
import { runSqliteBench } from "./sqlite.js";
import { runDispatchBench } from "./dispatch.js";
import { runLaunchBench } from "./launch.js";
import { runRecoveryBench } from "./recovery.js";
import { runEtcdBench } from "./etcd.js";
import { runIdleBench, runReplicatedIdleBench } from "./idle.js";
import { runSilentBench } from "./silent.js";
import { runRoundsBench } from "./rounds.js";
import { runDurableStreamsBench } from "./durable-streams.js";

const all: Record<string, () => Promise<void>> = {
  sqlite: () => runSqliteBench(),
  dispatch: () => runDispatchBench(),
  launch: () => runLaunchBench(),
  recovery: () => runRecoveryBench(),
  etcd: () => runEtcdBench(),
  "durable-streams": () => runDurableStreamsBench(),
  idle: async () => {
    await runIdleBench({ seconds: 30 });
    await runReplicatedIdleBench({ seconds: 30 });
  },
  silent: () => runSilentBench(),
  rounds: () => runRoundsBench(),
};
const wanted = process.argv.slice(2);
for (const name of wanted) if (!(name in all)) throw new Error(`unknown benchmark "${name}"; choose from ${Object.keys(all).join(", ")}`);
for (const [name, run] of Object.entries(all)) {
  if (wanted.length > 0 && !wanted.includes(name)) continue;
  console.log(`\n=== ${name} ===`);
  await run();
}
