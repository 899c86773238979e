#!/usr/bin/env node
// Runs the test suite on Node's built-in runner: every *.test.ts under test/, chaos/ and
// storage-adapters/ (Node 20's --test does not expand globs itself). Arguments narrow the run to
// files whose path contains one of them: `npm test -- conformance chaos`.
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { spawnSync } from "node:child_process";

const roots = ["test", "chaos", "storage-adapters"];
const filters = process.argv.slice(2);
const files = roots
  .flatMap((root) => {
    try {
      return readdirSync(root, { recursive: true }).map((f) => join(root, String(f)));
    } catch {
      return [];
    }
  })
  .filter((f) => f.endsWith(".test.ts"))
  .filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)))
  .sort();
if (files.length === 0) {
  console.error(`no test files match ${filters.join(" ")}`);
  process.exit(1);
}
// The cell launcher (native/launcher.c) is rebuilt when its source changed since it was built, so the
// suite never tests a stale binary.
// (CAIRN_LAUNCHER=node runs the suite with Node's spawn instead, and needs no compiler.)
if (process.env.CAIRN_LAUNCHER !== "node") {
  const built = spawnSync(process.execPath, [join("scripts", "build-launcher.mjs"), "--if-stale", "--strict"], { stdio: "inherit" });
  if (built.status !== 0) process.exit(built.status ?? 1);
}
const concurrency = process.env.CAIRN_TEST_CONCURRENCY ?? "1";
const r = spawnSync(
  process.execPath,
  ["--import", "tsx", "--test", `--test-concurrency=${concurrency}`, "--test-timeout=600000", ...files],
  { stdio: "inherit" },
);
process.exit(r.status ?? 1);
