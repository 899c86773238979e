/**
 * Ends a test file's process once its tests are done, if it does not end by itself. A gRPC channel to
 * an etcd member that was paused or cut off can stay open after every client was closed (the CLI has
 * the same backstop: src/cli/main.ts exitBackstop); the tests' results are already reported by then,
 * but the runner would wait for the process until its file timeout (10 minutes).
 * Says on stderr what was still open, so a real leak stays visible. Call it at the end of the file,
 * so that its hook comes after the file's other `after` hooks (they stop servers and clusters).
 */
import { after } from "node:test";

export function exitAfterTests(file: string, graceMs = 30_000): void {
  after(() => {
    setTimeout(() => {
      const open = process.getActiveResourcesInfo().filter((r) => r !== "Timeout");
      process.stderr.write(`${file}: ending the test process ${graceMs / 1000} s after its tests; still open: ${open.join(", ") || "timers"}\n`);
      process.exit();
    }, graceMs).unref();
  });
}
