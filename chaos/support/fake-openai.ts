/**
 * A fake OpenAI-compatible `/v1/chat/completions` server on 127.0.0.1:0 for chaos tests. Each request
 * is answered with one `step` tool call whose patch `answer` chooses from the State revision and the
 * round named in the user message (the provider's prompt says "Round <turn>, attempt <n>. The current
 * State (revision <r>)"), so the server is as stateless as a real model. Every request is counted.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** One request as the server understood it. */
export interface SeenRequest {
  readonly turn: string;
  readonly attempt: number;
  readonly revision: number;
  /** The State the model was shown (parsed from the user message). */
  readonly state: unknown;
}

/** The running server. */
export interface FakeOpenAI {
  /** The base URL to pass as `--base-url` (ends in /v1). */
  readonly baseUrl: string;
  readonly port: number;
  readonly seen: SeenRequest[];
  close(): Promise<void>;
}

/** Starts the server. `answer` returns the patch for a request, or null for an HTTP 400 (not retryable). */
export async function startFakeOpenAI(answer: (req: SeenRequest) => unknown[] | null, host = "127.0.0.1"): Promise<FakeOpenAI> {
  const seen: SeenRequest[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const send = (status: number, body: unknown) => {
        const text = JSON.stringify(body);
        res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
        res.end(text);
      };
      let parsed: { messages?: { role: string; content: string }[] };
      try {
        parsed = JSON.parse(Buffer.concat(chunks).toString("utf8")) as typeof parsed;
      } catch {
        send(400, { error: { message: "not JSON" } });
        return;
      }
      const user = parsed.messages?.find((m) => m.role === "user")?.content ?? "";
      const m = /^Round (\S+), attempt (\d+)\. The current State \(revision (\d+)\)/.exec(user);
      if (req.url !== "/v1/chat/completions" || m === null) {
        send(400, { error: { message: `unexpected request ${req.method} ${req.url}` } });
        return;
      }
      let state: unknown = null;
      try {
        // The user message is "Round ...:\n\n<State as compact JSON>\n\n...".
        state = JSON.parse(user.split("\n\n")[1] ?? "null");
      } catch {
        state = null;
      }
      const r: SeenRequest = { turn: m[1]!, attempt: Number(m[2]), revision: Number(m[3]), state };
      seen.push(r);
      const patch = answer(r);
      if (patch === null) {
        send(400, { error: { message: `no answer for revision ${r.revision}` } });
        return;
      }
      send(200, {
        id: `chatcmpl-${seen.length}`,
        object: "chat.completion",
        created: 1,
        model: "fake",
        choices: [
          {
            index: 0,
            finish_reason: "tool_calls",
            message: { role: "assistant", content: null, tool_calls: [{ id: `call_${seen.length}`, type: "function", function: { name: "step", arguments: JSON.stringify({ patch }) } }] },
          },
        ],
        usage: { prompt_tokens: 100, completion_tokens: 20, total_tokens: 120 },
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    baseUrl: `http://${host === "0.0.0.0" ? "127.0.0.1" : host}:${port}/v1`,
    port,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
