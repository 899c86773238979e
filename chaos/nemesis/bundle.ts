/**
 * Builds the nemesis worker, the `cairn` CLI (for timer cells) and the cell keeper's program into one
 * ESM file each, with the cell launcher copied beside them, with esbuild (which tsx brings), so that a restarted worker starts in a fraction of a second instead of having
 * tsx compile the sources again: under a loaded machine that difference decides whether a worker ever
 * opens its database between two faults. Packages stay external; the files are written under
 * node_modules/.cache so that Node resolves those packages from the repository.
 */
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { KEEPER_BUNDLE } from "../../src/exec/keeper.js";

const REPO = fileURLToPath(new URL("../../", import.meta.url));

export interface Bundles {
  readonly worker: string;
  readonly cli: string;
}

export async function bundle(): Promise<Bundles> {
  const esbuild = await import("esbuild");
  const dir = join(REPO, "node_modules", ".cache", "cairn-nemesis", `${process.pid}`);
  mkdirSync(dir, { recursive: true });
  const out = { worker: join(dir, "worker.mjs"), cli: join(dir, "cairn.mjs") };
  const common = { bundle: true, platform: "node", format: "esm", target: "node20", packages: "external", logLevel: "error" } as const;
  await esbuild.build({ ...common, entryPoints: [fileURLToPath(new URL("./worker.ts", import.meta.url))], outfile: out.worker });
  await esbuild.build({ ...common, entryPoints: [join(REPO, "src/cli/entry.ts")], outfile: out.cli });
  // The cell keeper's program, which both bundles start beside themselves (src/exec/keeper.ts).
  await esbuild.build({ ...common, entryPoints: [join(REPO, "src/exec/keeper-main.ts")], outfile: join(dir, KEEPER_BUNDLE) });
  // The cell launcher, where a bundle looks for it (build/ beside itself, src/exec/launcher.ts).
  mkdirSync(join(dir, "build"), { recursive: true });
  copyFileSync(join(REPO, "build", "cairn-launcher"), join(dir, "build", "cairn-launcher"));
  return out;
}
