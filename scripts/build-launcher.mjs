#!/usr/bin/env node
// Builds build/cairn-launcher from native/launcher.c with the system C compiler ($CC, else cc).
// Run by `npm install` (postinstall) and by `npm test` when the binary is missing or older than its
// source. Without a compiler Cairn still works: it starts cells with Node's own spawn, which costs
// the harness a fork of itself per cell (slower, equally safe). So a failed build warns and exits 0,
// unless --strict is given.
import { mkdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const source = join(root, "native", "launcher.c");
const target = join(root, "build", "cairn-launcher");
const strict = process.argv.includes("--strict");
const ifStale = process.argv.includes("--if-stale");

const mtime = (p) => {
  try {
    return statSync(p).mtimeMs;
  } catch {
    return null;
  }
};

if (process.platform !== "linux") {
  console.warn(`cairn: the cell launcher is built for Linux only (this is ${process.platform}); this machine can read and serve databases but not run cells`);
  process.exit(0);
}
if (mtime(source) === null) process.exit(0); // an install without the native source: nothing to build
if (ifStale) {
  const built = mtime(target);
  if (built !== null && built >= mtime(source)) process.exit(0);
}
mkdirSync(dirname(target), { recursive: true });
const cc = process.env.CC || "cc";
export const HARDENING = ["-fstack-protector-strong", "-D_FORTIFY_SOURCE=2", "-fPIE", "-pie", "-Wl,-z,relro,-z,now"];
const args = ["-O2", "-Wall", "-Wextra", "-std=c11", ...HARDENING, "-o", target, source];
const r = spawnSync(cc, args, { stdio: ["ignore", "inherit", "inherit"] });
if (r.status !== 0) {
  const why = r.error ? `${cc} could not be run (${r.error.message})` : `${cc} ${args.join(" ")} failed`;
  const msg = `cairn: building the cell launcher failed: ${why}. Without it no cell can run; install a C compiler (Debian: apt-get install gcc libc6-dev) and run \`node scripts/build-launcher.mjs\` to build it.`;
  if (strict) {
    console.error(msg);
    process.exit(1);
  }
  console.warn(msg);
}
