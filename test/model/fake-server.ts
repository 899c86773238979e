/**
 * A local HTTP server that plays a model provider for tests: each test sets what the next request
 * gets (a JSON body with a status, a destroyed socket, or silence), and every request is recorded.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface RecordedRequest {
  readonly method: string;
  readonly url: string;
  readonly headers: IncomingMessage["headers"];
  readonly body: unknown;
}

export type Reply =
  | { readonly kind: "json"; readonly status: number; readonly body: unknown }
  | { readonly kind: "reset" }
  | { readonly kind: "hang" };

export interface FakeServer {
  readonly url: string;
  readonly requests: RecordedRequest[];
  /** What every following request gets until changed. */
  reply(r: Reply): void;
  close(): Promise<void>;
}

/** Starts the server on 127.0.0.1 with an ephemeral port. Close it in `after`. */
export async function startFakeServer(): Promise<FakeServer> {
  const requests: RecordedRequest[] = [];
  let next: Reply = { kind: "json", status: 500, body: { error: "no reply configured" } };
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      let body: unknown = text;
      try {
        body = JSON.parse(text);
      } catch {
        // keep the raw text
      }
      requests.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      const r = next;
      if (r.kind === "reset") {
        req.socket.destroy();
        return;
      }
      if (r.kind === "hang") return;
      const payload = JSON.stringify(r.body);
      res.writeHead(r.status, { "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
      res.end(payload);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    reply(r) {
      next = r;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
