/**
 * The CLI loads only what a command needs: `cairn --version` loads no storage, harness or schema
 * library, and `cairn status` on a sqlite database loads neither the replicated adapter (etcd3 and
 * gRPC), nor the model SDKs, the metrics library, pino-pretty, the UI, the harness or the process
 * launcher. Checked on the modules a real `cairn` process loaded (recorded by test/cli/trace), not on
 * its duration; the status run must load better-sqlite3, which shows that the recording sees
 * packages at all.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { ENTRY, ROOT } from "./support.js";
import { tempDir } from "../harness/support.js";

const t = tempDir("cairn-lazy-load-");
after(() => t.cleanup());

/** The module URLs `cairn ARGS` loaded (from source, as the other CLI tests run it), and its result. */
function loadedBy(args: string[]): { modules: string[]; code: number | null; stdout: string; stderr: string } {
  const trace = join(t.dir, `trace-${args[0]}.txt`);
  rmSync(trace, { force: true });
  const r = spawnSync(process.execPath, ["--import", "tsx", "--import", join(ROOT, "test/cli/trace/register.mjs"), ENTRY, ...args], {
    cwd: ROOT,
    env: { ...process.env, CAIRN_TRACE_MODULES: trace },
    encoding: "utf8",
    timeout: 120_000,
  });
  return { modules: readFileSync(trace, "utf8").split("\n").filter((l) => l !== ""), code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The loaded modules whose URL contains one of `parts` (a package directory or a source folder). */
const matching = (modules: readonly string[], parts: readonly string[]): string[] => modules.filter((m) => parts.some((p) => m.includes(p)));

const HEAVY = [
  "/node_modules/etcd3/",
  "/node_modules/@grpc/",
  "/node_modules/openai/",
  "/node_modules/@anthropic-ai/",
  "/node_modules/prom-client/",
  "/node_modules/pino-pretty/",
  "/node_modules/execa/",
  "/node_modules/@opentelemetry/",
  "/storage-adapters/replicated/",
  "/src/ui/server.",
  "/src/ui/http.",
  "/src/ui/timeline.",
  "/src/harness/harness.",
  "/src/exec/executor.",
  "/src/exec/launcher.",
  "/src/exec/keeper.",
  "/src/observability/",
  "/src/cli/api.",
];

describe("the CLI loads only what a command needs", () => {
  before(async () => {
    const storage = createSqliteStorage({ dataDir: join(t.dir, "data") });
    await (await storage.open("small", { create: true })).close();
    await storage.post("small", { id: "hello", session: "s1", kind: "note", payload: { text: "waiting in the mailbox" }, at: new Date().toISOString() });
    await storage.close();
  });

  it("cairn --version loads no storage, no schema library and none of the heavy packages", () => {
    const r = loadedBy(["--version"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^\d+\.\d+\.\d+/);
    assert.deepEqual(matching(r.modules, [...HEAVY, "/node_modules/zod/", "/node_modules/better-sqlite3/", "/storage-adapters/", "/src/state/", "/src/storage/"]), []);
    assert.ok(matching(r.modules, ["/src/cli/main."]).length > 0, "the recording saw the CLI's own modules");
  });

  it("cairn status on a sqlite database loads sqlite, and neither etcd3, the model SDKs, prom-client, pino-pretty, the UI nor the harness", () => {
    const r = loadedBy(["status", "--db", "small", "--data-dir", join(t.dir, "data")]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /database small/);
    assert.ok(matching(r.modules, ["/node_modules/better-sqlite3/"]).length > 0, "the recording saw better-sqlite3, which status on sqlite needs");
    assert.deepEqual(matching(r.modules, HEAVY), []);
  });
});
