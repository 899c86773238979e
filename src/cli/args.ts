/**
 * Flag parsing for the `cairn` command: node's parseArgs in strict mode, with every error turned
 * into one sentence that names the flag (exit code 2).
 */
import { parseArgs, type ParseArgsConfig } from "node:util";
import { CairnError } from "../errors.js";

export class UsageError extends CairnError {
  constructor(message: string) {
    super("usage", message);
    this.name = "UsageError";
  }
}

type Options = NonNullable<ParseArgsConfig["options"]>;

export interface Parsed {
  values: Record<string, string | boolean | string[] | undefined>;
  positionals: string[];
}

/** Parses `argv` for `command`; unknown flags and missing values become a UsageError. */
export function parse(command: string, argv: readonly string[], options: Options): Parsed {
  try {
    const r = parseArgs({ args: [...argv], options: { ...options, help: { type: "boolean", short: "h" } }, allowPositionals: true, strict: true });
    return { values: r.values as Parsed["values"], positionals: r.positionals };
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    const unknown = /Unknown option '([^']+)'/.exec(msg);
    if (unknown) throw new UsageError(`cairn ${command}: unknown flag ${unknown[1]}; see \`cairn ${command} --help\`.`);
    const ambiguous = /Option '([^']+)' argument is ambiguous/.exec(msg);
    if (ambiguous) {
      const flagName = ambiguous[1]!.replace(/^-\w, /, "");
      throw new UsageError(`cairn ${command}: the value of ${flagName} starts with a dash; write it as ${flagName}=VALUE (for example ${flagName}=-1).`);
    }
    const missing = /Option '([^']+)' argument missing/.exec(msg);
    if (missing) throw new UsageError(`cairn ${command}: ${missing[1]!.replace(/^-\w, /, "")} needs a value.`);
    throw new UsageError(`cairn ${command}: ${msg.replace(/\. To specify.*$/s, "")}.`);
  }
}

export function str(p: Parsed, name: string): string | undefined {
  const v = p.values[name];
  return typeof v === "string" ? v : undefined;
}

export function required(p: Parsed, command: string, name: string, hint: string): string {
  const v = str(p, name);
  if (v === undefined || v.trim() === "") throw new UsageError(`cairn ${command}: --${name} is required (${hint}).`);
  return v;
}

export function list(p: Parsed, name: string): string[] {
  const v = p.values[name];
  return Array.isArray(v) ? v : typeof v === "string" ? [v] : [];
}

export function flag(p: Parsed, name: string): boolean {
  return p.values[name] === true;
}

/** A positive integer flag, or undefined when absent. */
export function positiveInt(p: Parsed, command: string, name: string): number | undefined {
  const v = str(p, name);
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n <= 0) throw new UsageError(`cairn ${command}: --${name} expects a positive whole number (at most ${Number.MAX_SAFE_INTEGER}), got "${v}".`);
  return n;
}

/** The longest duration a flag takes (100 years): past it, arithmetic on times stops being exact. */
const MAX_DURATION_SECONDS = 100 * 365 * 86_400;

/** A duration like `90`, `90s`, `15m`, `2h` or `1d`, in seconds. */
export function durationSeconds(command: string, name: string, v: string): number {
  const m = /^(\d+(?:\.\d+)?)(s|m|h|d)?$/.exec(v.trim());
  if (!m) throw new UsageError(`cairn ${command}: --${name} expects a duration such as 90s, 15m, 2h or 1d, got "${v}".`);
  const mult = { s: 1, m: 60, h: 3600, d: 86400 }[(m[2] ?? "s") as "s" | "m" | "h" | "d"];
  const seconds = Number(m[1]) * mult;
  if (!(seconds > 0)) throw new UsageError(`cairn ${command}: --${name} must be longer than zero, got "${v}".`);
  if (!(seconds <= MAX_DURATION_SECONDS)) throw new UsageError(`cairn ${command}: --${name} must be at most 100 years, got "${v}".`);
  return seconds;
}

/**
 * Splits a validator command line into argv. Quotes group words ("a b" or 'a b'); there is no shell:
 * no variables, globs, pipes or redirections.
 */
export function splitCommand(command: string, line: string): string[] {
  const out: string[] = [];
  let cur = "";
  let quote: '"' | "'" | null = null;
  let has = false;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i]!;
    if (quote !== null) {
      if (ch === quote) quote = null;
      else if (ch === "\\" && quote === '"' && i + 1 < line.length) cur += line[++i];
      else cur += ch;
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      has = true;
    } else if (/\s/.test(ch)) {
      if (has || cur !== "") out.push(cur);
      cur = "";
      has = false;
    } else {
      cur += ch;
      has = true;
    }
  }
  if (quote !== null) throw new UsageError(`cairn ${command}: unbalanced quote in --validator "${line}".`);
  if (has || cur !== "") out.push(cur);
  if (out.length === 0) throw new UsageError(`cairn ${command}: --validator is empty.`);
  return out;
}
