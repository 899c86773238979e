#!/usr/bin/env node
// The `cairn` command. Runs the compiled CLI (npm ci builds it through the `prepare` script).
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const compiled = join(here, "..", "dist", "src", "cli", "main.js");
if (!existsSync(compiled)) {
  process.stderr.write("cairn: the compiled CLI is missing (dist/). Run `npm ci` or `npm run build` in the repository first.\n");
  process.exit(2);
}
const { main, exitBackstop } = await import(compiled);
process.exitCode = await main(process.argv.slice(2));
exitBackstop();
