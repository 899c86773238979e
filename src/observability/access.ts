/**
 * Who may talk to Cairn's HTTP servers (`cairn serve`'s /metrics port and `cairn ui`'s page).
 *
 * Two checks, in this order, on every request except the probes (/healthz, /readyz):
 *
 * - **Host.** The `Host` header must name this server: `localhost`, `127.0.0.1` or `[::1]` with the
 *   bound port, the bound address itself, every address of this machine's interfaces when bound to
 *   all of them (`0.0.0.0`, `::`: a scheduler's probe or a scraper uses the pod's address), and the
 *   names given with `--allow-host`. A web page that rebinds its own name to this address (DNS
 *   rebinding) sends its own name, and is refused with 421 before anything is read.
 * - **Token.** When a token is in force, the request must carry it: `Authorization: Bearer TOKEN`,
 *   `?token=TOKEN` (the response then sets an HttpOnly, SameSite=Strict cookie, so the page's own
 *   requests carry it) or that cookie; the HTTP API (`/api/v1/`) takes the header only. The compare
 *   is on SHA-256 digests with `timingSafeEqual`.
 *
 * The probes stay open to every Host and without a token: a scheduler probes whatever address it
 * chose and cannot be given a secret everywhere; they answer only "alive" and the readiness sentence.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { isIP } from "node:net";
import { networkInterfaces } from "node:os";
import { ConfigError } from "../errors.js";

/** What a server enforces: extra Host names (NAME or NAME:PORT) and the token (null: none). */
export interface AccessPolicy {
  readonly allowHosts: readonly string[];
  readonly token: string | null;
}

/** The default of a library caller that passes no policy: the Host check, no token. */
export const LOOPBACK_ONLY: AccessPolicy = { allowHosts: [], token: null };

/** The shortest token accepted: shorter ones can be guessed by a patient client. */
export const MIN_TOKEN_LENGTH = 16;

/** The paths answered to anyone: liveness and readiness probes. */
export const PROBE_PATHS: ReadonlySet<string> = new Set(["/healthz", "/readyz"]);

const LOOPBACK_NAMES = ["localhost", "127.0.0.1", "[::1]"];

/** True for an address only this machine can reach: `localhost`, 127.0.0.0/8, `::1`. */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "");
  if (h === "localhost" || h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  return isIP(h) === 4 && h.startsWith("127.");
}

function isWildcard(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "");
  return h === "0.0.0.0" || h === "::" || h === "0:0:0:0:0:0:0:0";
}

/** A Host header (or an --allow-host value) as the WHATWG URL parser canonicalizes it. */
interface HostName {
  readonly name: string;
  /** null: no port written (80 for a Host header; any port for an --allow-host entry). */
  readonly port: number | null;
}

function parseHost(value: string): HostName | null {
  if (value === "" || /[\s/?#@\\]/.test(value)) return null;
  let url: URL;
  try {
    url = new URL(`http://${value}`);
  } catch {
    return null;
  }
  if (url.hostname === "") return null;
  // A trailing dot names the same host; canonicalize it away so "localhost." is not a separate name.
  const name = url.hostname.replace(/\.$/, "");
  const written = /:(\d+)$/.test(value) && !/^\[[^\]]*\]$/.test(value);
  return { name, port: url.port !== "" ? Number(url.port) : written ? 80 : null };
}

/** Canonical form of an address for the Host compare: IPv6 in brackets, names lower case. */
function canonicalAddress(address: string): string | null {
  return parseHost(isIP(address) === 6 ? `[${address}]` : address)?.name ?? null;
}

/**
 * Checks `--allow-host` values (NAME or NAME:PORT; IPv6 in brackets) and returns them. Throws a
 * ConfigError naming the bad value.
 */
export function parseAllowHosts(values: readonly string[]): string[] {
  const out: string[] = [];
  for (const raw of values.flatMap((v) => v.split(","))) {
    const v = raw.trim();
    if (v === "") continue;
    if (parseHost(v) === null) throw new ConfigError(`--allow-host expects a host name, optionally with :PORT (IPv6 in brackets), got ${JSON.stringify(v)}`);
    out.push(v);
  }
  return out;
}

/**
 * The path and query of a request target, or null when it does not parse (an absolute-form target
 * with a bad host, `//[`...): such a request is refused, never allowed to throw in a handler.
 */
export function requestTarget(req: IncomingMessage): URL | null {
  try {
    return new URL(req.url ?? "/", "http://localhost");
  } catch {
    return null;
  }
}

/** A request's verdict: refused (the response was sent) or allowed, with how the token came. */
export type Verdict = { readonly allowed: false } | { readonly allowed: true; readonly tokenFromQuery: boolean };

/** Answers requests before any route sees them. */
export interface Gate {
  /**
   * Checks `req`: refuses it with 421 (a Host that is not this server) or 401 (the token missing or
   * wrong), sending the response, or lets it through. A token taken from `?token=` sets the cookie on
   * `res` before anything is written. Probe paths are always let through.
   */
  check(req: IncomingMessage, res: ServerResponse, path: string): Verdict;
}

function digest(s: string): Buffer {
  return createHash("sha256").update(s).digest();
}

function refuse(res: ServerResponse, status: number, body: string, extra: Record<string, string> = {}, path = ""): void {
  // A program calling the HTTP API (`cairn serve`'s /api/v1/) reads refusals as JSON, as its own.
  if (path === "/api/v1" || path.startsWith("/api/v1/")) {
    res.writeHead(status, { "content-type": "application/json; charset=utf-8", "cache-control": "no-store", "x-content-type-options": "nosniff", ...extra });
    res.end(`${JSON.stringify({ error: { code: status === 401 ? "token_required" : "host_refused", message: body.trim() } })}\n`);
    return;
  }
  res.writeHead(status, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store", "x-content-type-options": "nosniff", ...extra });
  res.end(body);
}

/**
 * Builds the gate of a server bound to `bindHost:port` (the port actually bound). `interfaces` lists
 * this machine's addresses, asked on every request to a wildcard bind (tests pass their own).
 */
export function createGate(policy: AccessPolicy, bindHost: string, port: number, interfaces: () => string[] = interfaceAddresses): Gate {
  const fixed = new Set<string>();
  const anyPort = new Set<string>();
  for (const n of LOOPBACK_NAMES) fixed.add(`${parseHost(n)!.name}:${port}`);
  const bound = isWildcard(bindHost) ? null : canonicalAddress(bindHost);
  if (bound !== null) fixed.add(`${bound}:${port}`);
  for (const entry of policy.allowHosts) {
    const h = parseHost(entry);
    if (h === null) throw new ConfigError(`--allow-host expects a host name, optionally with :PORT, got ${JSON.stringify(entry)}`);
    if (h.port === null) anyPort.add(h.name);
    else fixed.add(`${h.name}:${h.port}`);
  }
  const served = [...fixed, ...[...anyPort].map((n) => `${n}:*`)].join(", ");
  const tokenDigest = policy.token !== null && policy.token !== "" ? digest(policy.token) : null;

  const hostAllowed = (header: string | undefined): boolean => {
    if (header === undefined) return false;
    const h = parseHost(header.trim());
    if (h === null) return false;
    const p = h.port ?? 80;
    if (anyPort.has(h.name) || fixed.has(`${h.name}:${p}`)) return true;
    if (bound === null && p === port) return interfaces().some((a) => canonicalAddress(a) === h.name);
    return false;
  };

  const match = (given: string | null | undefined): boolean => given !== null && given !== undefined && given !== "" && tokenDigest !== null && timingSafeEqual(digest(given), tokenDigest);

  return {
    check(req, res, path) {
      if (PROBE_PATHS.has(path)) return { allowed: true, tokenFromQuery: false };
      if (!hostAllowed(req.headers.host)) {
        refuse(
          res,
          421,
          `refused: this server does not answer to Host ${JSON.stringify(req.headers.host ?? "")}; it serves ${served}` +
            `${bound === null ? " and this machine's own addresses on that port" : ""}. Add a name with --allow-host NAME (CAIRN_ALLOW_HOST).\n`,
          {},
          path,
        );
        return { allowed: false };
      }
      if (tokenDigest === null) return { allowed: true, tokenFromQuery: false };
      const auth = req.headers.authorization;
      const bearer = auth !== undefined && /^Bearer /i.test(auth) && match(auth.slice(7).trim());
      // The HTTP API takes the header only: a query string ends up in logs and proxies' records, and a
      // cookie is sent by the browser for any page of this host (another port is the same site), so
      // either would let a request the token's holder did not make act as them.
      if (path === "/api/v1" || path.startsWith("/api/v1/")) {
        if (bearer) return { allowed: true, tokenFromQuery: false };
        refuse(res, 401, 'a token is required: send it as "Authorization: Bearer TOKEN" (the token this server was started with: CAIRN_UI_TOKEN or --token-file); the API does not take it from ?token= or a cookie.\n', { "www-authenticate": 'Bearer realm="cairn"' }, path);
        return { allowed: false };
      }
      const query = requestTarget(req)?.searchParams.get("token");
      if (match(query)) {
        res.setHeader("set-cookie", `cairn_token=${encodeURIComponent(query!)}; HttpOnly; SameSite=Strict; Path=/`);
        return { allowed: true, tokenFromQuery: true };
      }
      if (bearer) return { allowed: true, tokenFromQuery: false };
      const cookie = /(?:^|;\s*)cairn_token=([^;]+)/.exec(req.headers.cookie ?? "");
      let fromCookie: string | null = null;
      try {
        fromCookie = cookie ? decodeURIComponent(cookie[1]!) : null;
      } catch {
        fromCookie = null;
      }
      if (match(fromCookie)) return { allowed: true, tokenFromQuery: false };
      refuse(
        res,
        401,
        "a token is required: send \"Authorization: Bearer TOKEN\", or open the page as /?token=TOKEN (the token this server was started with: CAIRN_UI_TOKEN or --token-file).\n",
        { "www-authenticate": 'Bearer realm="cairn"' },
        path,
      );
      return { allowed: false };
    },
  };
}

/** This machine's interface addresses (IPv4 and IPv6, loopback included). */
export function interfaceAddresses(): string[] {
  return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address));
}

/** The flags and environment that decide a server's access, as the CLI read them. */
export interface AccessRequest {
  /** The address bound (from --listen). */
  readonly bindHost: string;
  /** The token given (CAIRN_UI_TOKEN or the contents of --token-file), or undefined. */
  readonly token: string | undefined;
  readonly noAuth: boolean;
  readonly allowHosts: readonly string[];
  /** What the server exposes beyond the probes, for the --no-auth warning ("/metrics", ...). */
  readonly exposes: string;
  /** Makes a fresh token (default: 32 random bytes, base64url). */
  readonly generate?: () => string;
}

/** The policy to enforce, and at most one line for the operator (a generated token, a warning). */
export interface AccessDecision {
  readonly policy: AccessPolicy;
  readonly generated: boolean;
  readonly notice: string | null;
}

/**
 * Decides a server's access: a given token is enforced wherever the server binds; a bind to an
 * address other than loopback without one gets a generated token (announced once in `notice`), unless
 * `noAuth`, which leaves it open and says so in `notice`. Throws a ConfigError for a token shorter
 * than {@link MIN_TOKEN_LENGTH}, or for a token together with `noAuth`.
 */
export function decideAccess(req: AccessRequest): AccessDecision {
  const allowHosts = parseAllowHosts(req.allowHosts);
  const token = req.token === undefined || req.token === "" ? undefined : req.token;
  if (token !== undefined && req.noAuth) throw new ConfigError("--no-auth contradicts the token given (CAIRN_UI_TOKEN or --token-file): drop one of them");
  if (token !== undefined) {
    if (token.length < MIN_TOKEN_LENGTH || /\s/.test(token)) {
      throw new ConfigError(`the token (CAIRN_UI_TOKEN or --token-file) must be at least ${MIN_TOKEN_LENGTH} characters without spaces; e.g. \`openssl rand -hex 32\``);
    }
    return { policy: { allowHosts, token }, generated: false, notice: null };
  }
  if (isLoopback(req.bindHost)) return { policy: { allowHosts, token: null }, generated: false, notice: null };
  if (req.noAuth) {
    return {
      policy: { allowHosts, token: null },
      generated: false,
      notice: `cairn: warning: --no-auth: ${req.exposes} on ${req.bindHost} answer anyone who can reach this address, without a token.`,
    };
  }
  const fresh = (req.generate ?? (() => randomBytes(32).toString("base64url")))();
  return {
    policy: { allowHosts, token: fresh },
    generated: true,
    notice:
      `cairn: ${req.bindHost} is not a loopback address and no token was given, so this process made one (shown once, nowhere else): ${fresh}\n` +
      `cairn: send it as "Authorization: Bearer TOKEN" or open the page with ?token=TOKEN; set CAIRN_UI_TOKEN or --token-file to choose it, or pass --no-auth to serve without one.`,
  };
}
