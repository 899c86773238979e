/**
 * A plain HTTP server for the timeline page alone (`cairn ui`): the access gate (Host, then token:
 * ../observability/access.ts), the page's handler, 404 for the rest.
 */
import { createServer } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "pino";
import { createGate, LOOPBACK_ONLY, parseAllowHosts, requestTarget, type AccessPolicy, type Gate } from "../observability/access.js";
import { parseListen } from "../observability/server.js";
import type { TimelineHandler } from "./server.js";

export interface PageServer {
  readonly url: string;
  readonly port: number;
  /** Stops listening, ends the page's streams and drops open connections. Idempotent. */
  close(): Promise<void>;
}

export interface PageServerOptions {
  readonly logger?: Logger;
  /** Extra Host names and the token (default: loopback names only, no token). */
  readonly access?: AccessPolicy;
}

/**
 * Listens on `listen` ("HOST:PORT", port 0 picks a free one) and serves `handler` behind the access
 * gate. Rejects with a ConfigError for a bad address or --allow-host entry and with the socket error
 * when it cannot bind.
 */
export async function startPageServer(listen: string, handler: TimelineHandler, opts: PageServerOptions = {}): Promise<PageServer> {
  const { host, port } = parseListen(listen);
  const access = opts.access ?? LOOPBACK_ONLY;
  parseAllowHosts(access.allowHosts);
  const logger = opts.logger;
  // Built once the port is bound: the Host check compares against the port actually served.
  let gate: Gate | null = null;
  const server = createServer((req, res) => {
    const target = requestTarget(req);
    if (target === null) {
      res.writeHead(400, { "content-type": "text/plain; charset=utf-8" }).end("bad request target\n");
      return;
    }
    if (gate === null || !gate.check(req, res, target.pathname).allowed) {
      if (!res.headersSent) res.writeHead(503).end("starting\n");
      return;
    }
    handler
      .handle(req, res)
      .then((served) => {
        if (!served) {
          res.writeHead(404, { "content-type": "text/plain; charset=utf-8" });
          res.end("not found: the timeline is at /\n");
        }
      })
      .catch((err: unknown) => {
        logger?.error({ err }, "timeline request failed");
        if (!res.headersSent) res.writeHead(500).end("internal error\n");
        else res.destroy();
      });
  });
  const sockets = new Set<Socket>();
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const bound = (server.address() as AddressInfo).port;
  gate = createGate(access, host, bound);
  let closing: Promise<void> | undefined;
  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${bound}`,
    port: bound,
    close() {
      closing ??= (async () => {
        await handler.close();
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          for (const s of sockets) s.destroy();
        });
      })();
      return closing;
    },
  };
}
