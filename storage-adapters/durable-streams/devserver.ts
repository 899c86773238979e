/**
 * A development Durable Streams server: the reference server (`@durable-streams/server`, a development
 * dependency) run by reference-server.mjs as a child process, file-backed in a directory, on a free
 * port of 127.0.0.1. Tests and benchmarks start it, kill it (SIGKILL: a crash) and start it again on
 * the same directory and port. Not for production: one node, no quorum (docs/durable-streams.md).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, existsSync, mkdirSync, readFileSync, type WriteStream } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** Where streams live on the reference server (any path works; this one is the protocol's example). */
export const STREAM_PREFIX = "/v1/stream";

export interface DevServerOptions {
  /** The data directory (created when missing). */
  readonly dir: string;
  /** The port (default: a free one, kept across restarts). */
  readonly port?: number;
  /** The server's long-poll timeout in ms (default 30 000). */
  readonly longPollMs?: number;
  /** Where the server's own log goes (default `<dir>/server.log`, appended across restarts). */
  readonly logFile?: string;
}

export interface DevServer {
  /** The base URL to give the adapter: `http://127.0.0.1:PORT/v1/stream`. */
  readonly url: string;
  readonly port: number;
  readonly dir: string;
  readonly logFile: string;
  /** The running server's pid (changes on restart). */
  pid(): number;
  /** SIGKILL, and waits for the exit: a crash. */
  kill(): Promise<void>;
  /** Starts it again on the same directory and port (after `kill` or `stop`). */
  restart(): Promise<void>;
  /** SIGTERM (a clean stop), SIGKILL after 5 s; idempotent. */
  stop(): Promise<void>;
}

/** The server script, next to this file when running from source, else in the repository beside dist/. */
function script(): string {
  const here = fileURLToPath(new URL("./reference-server.mjs", import.meta.url));
  if (existsSync(here)) return here;
  const fromDist = fileURLToPath(new URL("../../../storage-adapters/durable-streams/reference-server.mjs", import.meta.url));
  if (existsSync(fromDist)) return fromDist;
  throw new Error("reference-server.mjs not found next to devserver (run from the repository)");
}

/** A free TCP port on 127.0.0.1. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

/** Starts the reference server; resolves once it accepts connections. */
export async function startDevServer(options: DevServerOptions): Promise<DevServer> {
  mkdirSync(options.dir, { recursive: true });
  const port = options.port ?? (await freePort());
  const logFile = options.logFile ?? join(options.dir, "server.log");
  let log: WriteStream = createWriteStream(logFile, { flags: "a" });
  let child: ChildProcess | null = null;
  let exited: Promise<void> = Promise.resolve();

  const launch = async (): Promise<void> => {
    if (log.writableEnded) log = createWriteStream(logFile, { flags: "a" });
    const deadline = Date.now() + 30_000;
    for (;;) {
      const proc = spawn(process.execPath, [script(), "--dir", options.dir, "--port", String(port), "--long-poll-ms", String(options.longPollMs ?? 30_000)], { stdio: ["ignore", "pipe", "pipe"] });
      const gone = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
      const ok = await new Promise<boolean>((resolve) => {
        let out = "";
        proc.stdout!.on("data", (chunk: Buffer) => {
          log.write(chunk);
          out += chunk.toString();
          if (out.includes("CAIRN_DS_LISTENING")) resolve(true);
        });
        proc.stderr!.on("data", (chunk: Buffer) => log.write(chunk));
        proc.once("exit", () => resolve(false));
      });
      if (ok) {
        child = proc;
        exited = gone;
        return;
      }
      // The port may still be held by the process just killed: try again shortly.
      if (Date.now() > deadline) {
        const tail = existsSync(logFile) ? readFileSync(logFile, "utf8").slice(-2000) : "";
        throw new Error(`the reference server did not start on port ${port} within 30 s; the end of ${logFile}:\n${tail}`);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  };

  await launch();
  const signalled = async (signal: NodeJS.Signals, graceMs?: number): Promise<void> => {
    const proc = child;
    if (proc === null || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill(signal);
    const timer = graceMs === undefined ? undefined : setTimeout(() => proc.kill("SIGKILL"), graceMs);
    await exited;
    if (timer !== undefined) clearTimeout(timer);
  };
  return {
    url: `http://127.0.0.1:${port}${STREAM_PREFIX}`,
    port,
    dir: options.dir,
    logFile,
    pid: () => child?.pid ?? -1,
    kill: () => signalled("SIGKILL"),
    async restart() {
      await signalled("SIGKILL");
      await launch();
    },
    async stop() {
      await signalled("SIGTERM", 5000);
      await new Promise<void>((resolve) => log.end(() => resolve()));
    },
  };
}
