/**
 * The observability HTTP endpoint of `cairn serve`: GET /metrics (Prometheus exposition of the
 * harness registry), /healthz (200 while the process is alive) and /readyz (200 when the harness says
 * it is ready, else 503 with the reason), plus any `routes` mounted on it (the timeline page, with
 * `cairn serve --ui`). Nothing else is served: 404 for unknown paths, 405 for other methods on known
 * ones. Every request but the probes passes the access gate first (./access.ts): a Host that is not
 * this server is refused (421), and when a token is in force, /metrics and the routes need it (401).
 * /healthz and /readyz answer anyone: schedulers probe without secrets.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "pino";
import { ConfigError } from "../errors.js";
import { createGate, LOOPBACK_ONLY, parseAllowHosts, requestTarget, type AccessPolicy, type Gate } from "./access.js";
import type { Metrics } from "./metrics.js";

/** What `ready()` answers: `reason` is served as the /readyz body either way. */
export interface Readiness {
  ready: boolean;
  reason: string;
}

/** Options of {@link startObservabilityServer}. */
export interface ObservabilityServerOptions {
  /** "HOST:PORT" (`[::1]:9464` for IPv6); port 0 picks a free one. */
  listen: string;
  metrics: Metrics;
  /** Called on every /readyz request; a throw counts as not ready, with the error message as reason. */
  ready: () => Readiness;
  logger?: Logger;
  /**
   * More routes on the same port (the timeline page): asked first; resolves true when it served the
   * request, false to fall through to /metrics, /healthz and /readyz.
   */
  routes?: { handle(req: IncomingMessage, res: ServerResponse): Promise<boolean> };
  /** Extra Host names and the token (default: loopback names only, no token). */
  access?: AccessPolicy;
}

/** A running endpoint: `url` is `http://HOST:PORT` with the port actually bound. */
export interface ObservabilityServer {
  url: string;
  port: number;
  /** Stops listening and drops open connections (scrapers keep them alive). Idempotent. */
  close(): Promise<void>;
}

/** A parsed `--listen` value. */
export interface ListenAddress {
  host: string;
  port: number;
}

/**
 * Parses "HOST:PORT" (IPv6 hosts in brackets: "[::]:9464"). Port must be an integer in 0..65535.
 * Throws ConfigError "--listen expects HOST:PORT, got ..." otherwise.
 */
export function parseListen(listen: string): ListenAddress {
  const fail = (why: string): never => {
    throw new ConfigError(`--listen expects HOST:PORT (e.g. 0.0.0.0:9464 or [::1]:9464; port 0 picks a free one), got ${JSON.stringify(listen)}: ${why}`);
  };
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]\s]+)):(\d{1,5})$/.exec(listen.trim());
  if (match === null) return fail("not of the form HOST:PORT");
  const host = match[1] ?? match[2];
  const port = Number(match[3]);
  if (host === undefined || host === "") return fail("missing host");
  if (!Number.isInteger(port) || port < 0 || port > 65535) return fail("port must be 0..65535");
  return { host, port };
}

function send(res: ServerResponse, status: number, body: string, contentType = "text/plain; charset=utf-8", extra: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": contentType, "cache-control": "no-store", ...extra });
  res.end(body);
}

/**
 * Starts the endpoint and resolves once it listens. Rejects with ConfigError for a bad `listen` or
 * `access.allowHosts` entry, and with the socket error (EADDRINUSE, EACCES...) when it cannot bind.
 */
export async function startObservabilityServer(opts: ObservabilityServerOptions): Promise<ObservabilityServer> {
  const { host, port } = parseListen(opts.listen);
  parseAllowHosts(opts.access?.allowHosts ?? []);
  const log = opts.logger;

  // Built once the port is bound: the Host check compares against the port actually served.
  let gate: Gate | null = null;

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const target = requestTarget(req);
    if (target === null) return send(res, 400, "bad request target\n");
    const path = target.pathname;
    if (gate === null || !gate.check(req, res, path).allowed) {
      if (!res.headersSent) send(res, 503, "starting\n");
      return;
    }
    if (opts.routes !== undefined && (await opts.routes.handle(req, res))) return;
    const known = path === "/metrics" || path === "/healthz" || path === "/readyz";
    if (!known) return send(res, 404, "not found: try /metrics, /healthz or /readyz\n");
    if (req.method !== "GET" && req.method !== "HEAD") return send(res, 405, "method not allowed\n", undefined, { allow: "GET, HEAD" });
    if (path === "/healthz") return send(res, 200, "ok\n");
    if (path === "/readyz") {
      let readiness: Readiness;
      try {
        readiness = opts.ready();
      } catch (err) {
        readiness = { ready: false, reason: `readiness check failed: ${err instanceof Error ? err.message : String(err)}` };
      }
      return send(res, readiness.ready ? 200 : 503, `${readiness.reason}\n`);
    }
    const registry = opts.metrics.registry;
    try {
      const text = await registry.metrics();
      return send(res, 200, text, registry.contentType);
    } catch (err) {
      log?.error({ err }, "rendering /metrics failed");
      return send(res, 500, "metrics unavailable\n");
    }
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      log?.error({ err }, "observability request failed");
      if (!res.headersSent) send(res, 500, "internal error\n");
      else res.destroy();
    });
  });
  const sockets = new Set<Socket>();
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once("error", onError);
    server.listen(port, host, () => {
      server.off("error", onError);
      resolve();
    });
  });
  server.on("error", (err) => log?.error({ err }, "observability server error"));

  const bound = (server.address() as AddressInfo).port;
  gate = createGate(opts.access ?? LOOPBACK_ONLY, host, bound);
  const url = `http://${host.includes(":") ? `[${host}]` : host}:${bound}`;
  log?.info({ url }, "observability endpoint listening");

  let closing: Promise<void> | undefined;
  return {
    url,
    port: bound,
    close(): Promise<void> {
      closing ??= new Promise<void>((resolve, reject) => {
        server.close((err) => (err === undefined ? resolve() : reject(err)));
        for (const socket of sockets) socket.destroy();
      });
      return closing;
    },
  };
}
