/**
 * Runs the CLI from source (tests spawn it with `node --import tsx src/cli/entry.ts ...`).
 * The installed `cairn` binary runs the compiled equivalent through bin/cairn.js.
 */
import { exitBackstop, main } from "./main.js";

process.exitCode = await main(process.argv.slice(2));
exitBackstop();
