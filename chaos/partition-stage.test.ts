/**
 * The staging of the partition test's owner (chaos/partition/stage.ts): the staged copy holds the
 * owner's import graph and packages, world-readable, and nothing else of the checkout; a destination
 * the other user cannot reach is refused with one sentence saying why, before anything is copied.
 */
import assert from "node:assert/strict";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { after, describe, it } from "node:test";
import { stageOwner } from "./partition/owner-process.js";

describe("partition: staging the owner for another user", () => {
  const root = mkdtempSync(join(tmpdir(), "cairn-stage-"));
  after(() => rmSync(root, { recursive: true, force: true }));

  it("refuses a destination below a private directory, in one sentence, copying nothing", () => {
    const locked = join(root, "locked");
    mkdirSync(locked, { mode: 0o700 });
    chmodSync(locked, 0o700);
    assert.throws(
      () => stageOwner(join(locked, "app")),
      (err: Error) => {
        assert.match(err.message, /^the owner runs as another user, who cannot reach .*\/locked\/app because .*\/locked is mode 700; set TMPDIR to a directory every user can traverse\.$/);
        return true;
      },
    );
    assert.equal(existsSync(join(locked, "app")), false);
  });

  it("copies the owner's sources, package.json, tsconfig.json, node_modules and the cell launcher, every file world-readable and every directory traversable", () => {
    chmodSync(root, 0o711);
    const staged = stageOwner(join(root, "app"));
    assert.equal(relative(staged.root, staged.entry), join("chaos", "partition", "owner.ts"));
    const top = readdirSync(staged.root).sort();
    assert.deepEqual(top, ["build", "chaos", "node_modules", "package.json", "src", "storage-adapters", "tsconfig.json"]);
    assert.equal(statSync(join(staged.root, "build", "cairn-launcher")).mode & 0o777, 0o755, "the cell launcher, executable by the other user");
    assert.deepEqual(readdirSync(join(staged.root, "chaos")), ["partition"], "only the owner's part of chaos/");
    assert.ok(!existsSync(join(staged.root, "src", "harness")), "nothing the owner does not import");
    for (const pkg of ["tsx", "etcd3", "better-sqlite3", "zod"]) assert.ok(existsSync(join(staged.root, "node_modules", pkg, "package.json")), pkg);
    const walk = (dir: string): void => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        const path = join(dir, entry.name);
        const mode = statSync(path).mode;
        if (entry.isDirectory()) {
          assert.equal(mode & 0o005, 0o005, `${path} is traversable by others`);
          walk(path);
        } else assert.equal(mode & 0o004, 0o004, `${path} is readable by others`);
      }
    };
    walk(staged.root);
  });
});
