// Module hooks of test/cli/lazy-load.test.ts: appends the URL of every module the ESM loader loads
// to the file named by CAIRN_TRACE_MODULES.
import { appendFileSync } from "node:fs";

export async function load(url, context, next) {
  appendFileSync(process.env.CAIRN_TRACE_MODULES, `${url}\n`);
  return next(url, context);
}
