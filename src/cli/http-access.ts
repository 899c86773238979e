/**
 * The access flags shared by `cairn serve` and `cairn ui`, and their reading: which Host names the
 * server answers to, the token it asks for, or an explicit --no-auth.
 */
import { readFileSync } from "node:fs";
import { decideAccess, type AccessDecision } from "../observability/access.js";
import { hasCode } from "../errors.js";
import { list, flag, str, UsageError, type Parsed } from "./args.js";

export const ACCESS_FLAGS = {
  "allow-host": { type: "string", multiple: true },
  "token-file": { type: "string" },
  "no-auth": { type: "boolean" },
} as const;

export const ACCESS_HELP = `  --allow-host NAME[:PORT]  answer to this Host name too (repeatable; CAIRN_ALLOW_HOST, comma-
                          separated). Default: localhost, 127.0.0.1 and [::1] with the port, the
                          --listen address, and this machine's addresses when it is 0.0.0.0 or [::].
                          Any other Host is refused (421): a web page cannot rebind its name here.
  --token-file FILE       the access token, read from FILE (or set CAIRN_UI_TOKEN; at least 16
                          characters). Clients send "Authorization: Bearer TOKEN"; the page takes
                          /?token=TOKEN once and keeps it in an HttpOnly cookie. A --listen address
                          other than loopback without a token gets a generated one, printed once
                          on stderr.
  --no-auth               serve a non-loopback --listen address without a token (prints what that
                          exposes)`;

/**
 * Reads the access flags (already filled from the environment where the command does that) and the
 * token (`--token-file`, else CAIRN_UI_TOKEN) and decides the policy for a server bound to
 * `bindHost`. The decision's notice (a generated token, or the --no-auth warning) is for the caller
 * to print once the server listens. Throws a UsageError naming the flag when a value is bad.
 */
export function accessFromFlags(p: Parsed, command: string, env: NodeJS.ProcessEnv, bindHost: string, exposes: string): AccessDecision {
  let token = env.CAIRN_UI_TOKEN;
  const file = str(p, "token-file");
  if (file !== undefined) {
    try {
      token = readFileSync(file, "utf8").replace(/\r?\n$/, "");
    } catch (err) {
      throw new UsageError(`cairn ${command}: cannot read --token-file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}.`);
    }
    if (token === "") throw new UsageError(`cairn ${command}: --token-file ${file} is empty.`);
  }
  let decision: AccessDecision;
  try {
    decision = decideAccess({ bindHost, token, noAuth: flag(p, "no-auth"), allowHosts: list(p, "allow-host"), exposes });
  } catch (err) {
    if (hasCode(err, "config")) throw new UsageError(`cairn ${command}: ${(err as Error).message}.`);
    throw err;
  }
  return decision;
}
