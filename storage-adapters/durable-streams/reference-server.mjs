#!/usr/bin/env node
// The Durable Streams reference server (@durable-streams/server, a development dependency), file-backed,
// as a process of its own so that it can be killed (SIGKILL) and restarted on the same data directory.
// Streams live under any path; point Cairn at http://HOST:PORT/v1/stream.
//
//   node storage-adapters/durable-streams/reference-server.mjs --dir DIR [--port 4437] [--host 127.0.0.1]
//        [--long-poll-ms 30000]
//
// Prints "CAIRN_DS_LISTENING <url>" on stdout once it accepts connections; the server's own log follows.
// SIGTERM stops it cleanly; SIGKILL is a crash.
import { parseArgs } from "node:util";
import { DurableStreamTestServer } from "@durable-streams/server";

const { values } = parseArgs({
  options: { dir: { type: "string" }, port: { type: "string" }, host: { type: "string" }, "long-poll-ms": { type: "string" } },
});
if (values.dir === undefined || values.dir === "") {
  process.stderr.write("reference-server: --dir DIR is required (the data directory; created when missing)\n");
  process.exit(2);
}
const server = new DurableStreamTestServer({
  dataDir: values.dir,
  port: Number(values.port ?? "4437"),
  host: values.host ?? "127.0.0.1",
  longPollTimeout: Number(values["long-poll-ms"] ?? "30000"),
});
const url = await server.start();
process.stdout.write(`CAIRN_DS_LISTENING ${url}\n`);
process.on("SIGTERM", () => {
  server.stop().then(
    () => process.exit(0),
    () => process.exit(1),
  );
});
