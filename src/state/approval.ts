/**
 * Approval gates: which executable cells wait for a person's approval before they may be launched.
 *
 * A rule is one of: `all` (every executable cell), `script` (every script cell), `argv` (a cmd cell
 * whose argv starts with the given words) or `glob` (a cmd cell whose command line, its argv joined
 * by single spaces, matches the pattern: `*` any run of characters, `?` one character, `\` quotes the
 * next one). A run carries its rules in `session_created`; a worker may add its own for every run it
 * drives. Whether a cell waits is decided when it is next to be launched, and recorded in the log
 * (`approval_requested`) before anything else happens to it: from then on it waits on every worker.
 *
 * Pure: no I/O, no clock.
 */
import { z } from "zod";
import type { ExecutableCell } from "./schema.js";

export const ApprovalRule = z.discriminatedUnion("kind", [
  z.strictObject({ kind: z.literal("all") }),
  z.strictObject({ kind: z.literal("script") }),
  z.strictObject({ kind: z.literal("argv"), prefix: z.array(z.string().min(1).max(4096)).min(1).max(64) }),
  z.strictObject({ kind: z.literal("glob"), pattern: z.string().min(1).max(4096) }),
]);
export type ApprovalRule = z.infer<typeof ApprovalRule>;

/** The rules of a run or a worker (at most this many). */
export const ApprovalRules = z.array(ApprovalRule).max(32);

/** A rule in the words the CLI takes and prints: `all`, `script`, `argv:WORDS`, `glob:PATTERN`. */
export function describeRule(rule: ApprovalRule): string {
  switch (rule.kind) {
    case "all":
      return "all";
    case "script":
      return "script";
    case "argv":
      return `argv:${rule.prefix.join(" ")}`;
    case "glob":
      return `glob:${rule.pattern}`;
  }
}

/**
 * Parses a rule from its words (see describeRule). `argv:` splits on whitespace. Returns the rule,
 * or a sentence saying what is wrong.
 */
export function parseRule(text: string): ApprovalRule | string {
  const t = text.trim();
  if (t === "all") return { kind: "all" };
  if (t === "script") return { kind: "script" };
  if (t.startsWith("argv:")) {
    const prefix = t.slice(5).trim().split(/\s+/).filter((w) => w !== "");
    if (prefix.length === 0) return `"${text}": argv: needs the command's first words, e.g. argv:git push`;
    const parsed = ApprovalRule.safeParse({ kind: "argv", prefix });
    return parsed.success ? parsed.data : `"${text}": ${parsed.error.issues[0]?.message ?? "not a valid argv prefix"}`;
  }
  if (t.startsWith("glob:")) {
    const pattern = t.slice(5);
    if (pattern.trim() === "") return `"${text}": glob: needs a pattern, e.g. glob:rm *`;
    const parsed = ApprovalRule.safeParse({ kind: "glob", pattern });
    return parsed.success ? parsed.data : `"${text}": ${parsed.error.issues[0]?.message ?? "not a valid pattern"}`;
  }
  return `"${text}" is not an approval rule; use all, script, argv:WORDS (a command's first words) or glob:PATTERN (on the command line)`;
}

/** True when `text` matches the glob `pattern` as a whole (`*`, `?`, `\` escapes). Linear-time: no backtracking blow-up. */
export function globMatch(pattern: string, text: string): boolean {
  // Tokens: literal characters and wildcards; matched with the classic two-pointer algorithm.
  const tokens: ({ t: "lit"; c: string } | { t: "any" } | { t: "one" })[] = [];
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "\\" && i + 1 < pattern.length) tokens.push({ t: "lit", c: pattern[++i]! });
    else if (c === "*") tokens.push({ t: "any" });
    else if (c === "?") tokens.push({ t: "one" });
    else tokens.push({ t: "lit", c });
  }
  let p = 0;
  let s = 0;
  let star = -1;
  let mark = 0;
  while (s < text.length) {
    const tok = tokens[p];
    if (tok !== undefined && (tok.t === "one" || (tok.t === "lit" && tok.c === text[s]))) {
      p++;
      s++;
    } else if (tok !== undefined && tok.t === "any") {
      star = p++;
      mark = s;
    } else if (star >= 0) {
      p = star + 1;
      s = ++mark;
    } else return false;
  }
  while (tokens[p]?.t === "any") p++;
  return p === tokens.length;
}

/** True when `rule` asks for approval of `cell`. */
export function ruleMatches(rule: ApprovalRule, cell: ExecutableCell): boolean {
  switch (rule.kind) {
    case "all":
      return true;
    case "script":
      return cell.kind === "script";
    case "argv":
      return cell.kind === "cmd" && rule.prefix.length <= cell.argv.length && rule.prefix.every((w, i) => cell.argv[i] === w);
    case "glob":
      return cell.kind === "cmd" && globMatch(rule.pattern, cell.argv.join(" "));
  }
}

/** The first rule (the run's, then the worker's) that asks for approval of `cell`, or null. */
export function gateOf(cell: ExecutableCell, ...ruleSets: readonly (readonly ApprovalRule[] | undefined)[]): ApprovalRule | null {
  for (const rules of ruleSets) for (const r of rules ?? []) if (ruleMatches(r, cell)) return r;
  return null;
}
