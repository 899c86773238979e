// Preloaded (`--import`) by test/cli/lazy-load.test.ts: records every module the process loads, the
// ESM ones through a load hook and, at exit, the CommonJS ones from the require cache (a package
// required from CommonJS, or through createRequire, never passes the ESM hooks).
import { appendFileSync } from "node:fs";
import { createRequire, register } from "node:module";

register("./hooks.mjs", import.meta.url);
const cache = createRequire(import.meta.url).cache;
process.on("exit", () => {
  appendFileSync(process.env.CAIRN_TRACE_MODULES, Object.keys(cache).map((path) => `file://${path}\n`).join(""));
});
