/**
 * The executor's whole suite again with Node's own spawn (CAIRN_LAUNCHER=node): the fallback when the
 * native launcher is not built must keep every guarantee the native path keeps. The runner gives each
 * test file its own process, so the setting reaches this file (and the processes it starts) only.
 */
process.env["CAIRN_LAUNCHER"] = "node";
const { gateLauncher } = await import("../../src/exec/launcher.js");
if (gateLauncher().kind !== "node") throw new Error("CAIRN_LAUNCHER=node did not select Node's spawn");
await import("./executor.test.js");
