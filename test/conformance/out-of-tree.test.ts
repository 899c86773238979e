/**
 * An adapter written outside storage-adapters/ (./out-of-tree/tiny-adapter.ts) runs the conformance
 * suite imported by the package's name, as a project depending on cairn would:
 * `import { conformance } from "cairn/storage/conformance"`.
 *
 * How the name resolves: a project depending on cairn gets package.json "exports" (the compiled
 * dist/, built by `npm ci` through "prepare"). Inside this repository, tsconfig.json "paths" maps the
 * same two names to their sources (tsx and tsc both read it), so the tests run the current code with
 * or without a build. The last test checks that both resolve to the same module.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { CASES, conformance, selectCases } from "cairn/storage/conformance";
import { createTinyStorage } from "./out-of-tree/tiny-adapter.js";

conformance("tiny (out of tree)", async () => {
  const storage = createTinyStorage();
  return {
    storage,
    reopenStorage: async () => storage,
    storageWithFaults: async (faults) => createTinyStorage(faults),
    cleanup: async () => storage.close(),
  };
});

const root = new URL("../../", import.meta.url);
const read = (path: string) => readFileSync(new URL(path, root), "utf8");

describe("the suite as a package entry", () => {
  it("package.json exports cairn/storage and cairn/storage/conformance as the compiled form of the sources tsconfig paths name", () => {
    const pkg = JSON.parse(read("package.json")) as { name: string; exports: Record<string, { types: string; default: string }>; files: string[] };
    const tsconfig = JSON.parse(read("tsconfig.json")) as { compilerOptions: { outDir: string; rootDir: string; paths: Record<string, string[]> } };
    assert.equal(pkg.name, "cairn");
    assert.ok(pkg.files.includes(tsconfig.compilerOptions.outDir), "the compiled files are published");
    for (const entry of ["cairn/storage", "cairn/storage/conformance"]) {
      const [source] = tsconfig.compilerOptions.paths[entry] ?? [];
      assert.ok(source !== undefined && source.endsWith(".ts"), `tsconfig paths maps ${entry}`);
      read(source);
      const compiled = `./${tsconfig.compilerOptions.outDir}/${source.replace(/^\.\//, "").replace(/\.ts$/, "")}`;
      const exported = pkg.exports[`.${entry.slice("cairn".length)}`];
      assert.deepEqual(exported, { types: `${compiled}.d.ts`, default: `${compiled}.js` }, `package.json exports ${entry}`);
    }
  });

  it("the out-of-tree adapter imports only the package and node, never a file of this repository", () => {
    const source = read("test/conformance/out-of-tree/tiny-adapter.ts");
    const specifiers = [...source.matchAll(/from\s+"([^"]+)"/g)].map((m) => m[1]!);
    assert.ok(specifiers.length > 0);
    for (const s of specifiers) assert.ok(s === "cairn/storage" || s.startsWith("node:"), `tiny-adapter.ts imports ${s}`);
  });

  it("filters select cases by id or name; a filter that selects nothing is a clear error", () => {
    assert.deepEqual(selectCases({ include: ["mailbox."] }).map((c) => c.id), ["mailbox.post-drain-ack", "mailbox.watch", "mailbox.invalid", "mailbox.full"]);
    assert.deepEqual(selectCases({ include: [/^processes\./], persists: true }).length, 4);
    assert.equal(selectCases({ include: [/^processes\./, "log.empty-batch"] }).length, 1, "two-process cases only for adapters that persist");
    assert.equal(selectCases({ exclude: ["log."] }).some((c) => c.id.startsWith("log.")), false);
    assert.equal(selectCases().length, CASES.filter((c) => c.persistsOnly !== true).length);
    assert.throws(() => selectCases({ include: ["no-such-case"] }), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "config");
      assert.match((err as Error).message, /no case matches.*the case ids are log\.seq-order/);
      return true;
    });
  });
});
