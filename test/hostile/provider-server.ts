/**
 * A local HTTP server speaking just enough of the Anthropic Messages API for the flaky-provider
 * tests: `decide` answers each request (status, headers, body), and every request is recorded.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface Answer {
  readonly status: number;
  readonly headers?: Record<string, string>;
  readonly body: unknown;
}

export interface ProviderServer {
  readonly url: string;
  readonly requests: { readonly key: string | undefined; readonly body: unknown }[];
  close(): Promise<void>;
}

/** A Messages API reply holding one `step` tool call with `patch`. */
export function stepReply(patch: unknown): Answer {
  return {
    status: 200,
    body: {
      id: "msg_1",
      type: "message",
      role: "assistant",
      model: "claude-test",
      content: [{ type: "tool_use", id: "toolu_1", name: "step", input: { patch } }],
      stop_reason: "tool_use",
      stop_sequence: null,
      usage: { input_tokens: 10, output_tokens: 5 },
    },
  };
}

export function errorReply(status: number, headers: Record<string, string> = {}): Answer {
  return { status, headers, body: { type: "error", error: { type: status === 401 ? "authentication_error" : "rate_limit_error", message: `status ${status}` } } };
}

/** Starts the server on 127.0.0.1 (ephemeral port). */
export async function startProvider(decide: (req: { key: string | undefined; body: { messages?: { content?: unknown }[] } }) => Answer): Promise<ProviderServer> {
  const requests: { key: string | undefined; body: unknown }[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      let body: unknown = null;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        body = null;
      }
      const key = typeof req.headers["x-api-key"] === "string" ? req.headers["x-api-key"] : undefined;
      requests.push({ key, body });
      let a: Answer;
      try {
        a = decide({ key, body: (body ?? {}) as { messages?: { content?: unknown }[] } });
      } catch (err) {
        a = { status: 500, body: { type: "error", error: { type: "api_error", message: String(err) } } };
      }
      const payload = JSON.stringify(a.body);
      res.writeHead(a.status, { "content-type": "application/json", "content-length": Buffer.byteLength(payload), ...a.headers });
      res.end(payload);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The State revision the request's user message shows (the provider renders State as JSON). */
export function revisionOf(body: { messages?: { content?: unknown }[] }): number {
  const m = /\(revision (\d+)\)/.exec(JSON.stringify(body.messages ?? []));
  return m === null ? 0 : Number(m[1]);
}
