/**
 * Canonical JSON: key-order-insensitive comparison and safe copies of JSON values.
 *
 * Used by admission to recognize a re-submitted patch (round identity) and to evaluate `test` ops,
 * and by anyone who needs "the same JSON" without caring how an object's keys were ordered.
 *
 * Pure: no I/O, no clock. Imports nothing of ours.
 */

/** How deep a JSON value may nest before it is refused (guards recursion on hostile input). */
export const MAX_JSON_DEPTH = 64;

/**
 * True when `value` is plain JSON: null, a boolean, a finite number, a string, an array of JSON or a
 * plain object (prototype Object.prototype or null) of JSON, acyclic, nested at most `maxDepth`
 * levels. `undefined`, functions, symbols, bigints, NaN, Infinity, class instances (Date, Map) and
 * sparse arrays are not JSON. Never throws.
 */
export function isJsonValue(value: unknown, maxDepth: number = MAX_JSON_DEPTH): boolean {
  return check(value, 0, maxDepth, new Set());
}

function check(v: unknown, depth: number, maxDepth: number, path: Set<object>): boolean {
  if (v === null) return true;
  switch (typeof v) {
    case "boolean":
    case "string":
      return true;
    case "number":
      return Number.isFinite(v);
    case "object":
      break;
    default:
      return false;
  }
  if (depth >= maxDepth) return false;
  const obj = v as object;
  if (path.has(obj)) return false;
  path.add(obj);
  try {
    if (Array.isArray(obj)) {
      for (let i = 0; i < obj.length; i++) {
        if (!Object.hasOwn(obj, i)) return false;
        if (!check(obj[i], depth + 1, maxDepth, path)) return false;
      }
      return true;
    }
    const proto: unknown = Object.getPrototypeOf(obj);
    if (proto !== Object.prototype && proto !== null) return false;
    for (const key of Object.keys(obj)) {
      if (!check((obj as Record<string, unknown>)[key], depth + 1, maxDepth, path)) return false;
    }
    return true;
  } finally {
    path.delete(obj);
  }
}

/**
 * The canonical text of a JSON value: object keys sorted by code unit, no whitespace, numbers as
 * `JSON.stringify` writes them (so `-0` is `0`). Two values are canonically equal when their canonical
 * texts are equal. Throws a TypeError when `value` is not JSON (check with `isJsonValue` first).
 */
export function canonicalJson(value: unknown): string {
  if (!isJsonValue(value)) throw new TypeError("canonicalJson: the value is not plain JSON");
  return write(value);
}

function write(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(write).join(",")}]`;
  const rec = v as Record<string, unknown>;
  const keys = Object.keys(rec).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${write(rec[k])}`).join(",")}}`;
}

/** Key-order-insensitive equality of two values. False (never a throw) when either is not JSON. */
export function canonicalEqual(a: unknown, b: unknown): boolean {
  if (!isJsonValue(a) || !isJsonValue(b)) return false;
  return write(a) === write(b);
}

/**
 * A deep copy of a JSON value that shares nothing with its input. Own keys named `__proto__` stay
 * plain data properties (JSON.parse defines them; it never sets a prototype). Throws a TypeError
 * when `value` is not JSON.
 */
export function jsonClone<T>(value: T): T {
  if (!isJsonValue(value)) throw new TypeError("jsonClone: the value is not plain JSON");
  return JSON.parse(JSON.stringify(value)) as T;
}

/**
 * A deep copy of a value its caller knows to be plain JSON (objects, arrays, strings, numbers,
 * booleans, null; an event validated before its commit), without serialising it: a fraction of
 * structuredClone's cost on Node 20, which goes through the worker message serializer. Equal to
 * JSON.parse(JSON.stringify(value)), so what is folded in memory is what a read of the log gives:
 * -0 becomes 0, and a "__proto__" key stays an own data property (never the copy's prototype).
 */
export function copyJson<T>(value: T): T {
  if (typeof value !== "object" || value === null) return (value === 0 ? 0 : value) as T; // -0 is 0 in JSON
  if (Array.isArray(value)) return value.map(copyJson) as T;
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(value)) {
    const v = copyJson((value as Record<string, unknown>)[key]);
    if (key === "__proto__") Object.defineProperty(out, key, { value: v, enumerable: true, writable: true, configurable: true });
    else out[key] = v;
  }
  return out as T;
}

/** A short JSON rendering for messages: at most `max` characters, marked with an ellipsis when cut. */
export function describeJson(value: unknown, max = 120): string {
  let text: string;
  if (value === undefined) text = "undefined";
  else if (isJsonValue(value)) text = write(value);
  else text = `a non-JSON ${typeof value}`;
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

/**
 * Splits an RFC 6901 JSON pointer into unescaped segments (`~1` is `/`, `~0` is `~`). `""` is the
 * whole document (no segments). Returns null when `pointer` is not a pointer: it does not start with
 * `/`, or a `~` is not followed by `0` or `1`.
 */
export function parsePointer(pointer: string): string[] | null {
  if (pointer === "") return [];
  if (!pointer.startsWith("/")) return null;
  const raw = pointer.slice(1).split("/");
  const out: string[] = [];
  for (const seg of raw) {
    if (/~(?![01])/.test(seg)) return null;
    out.push(seg.replace(/~1/g, "/").replace(/~0/g, "~"));
  }
  return out;
}

/** An array index as RFC 6901 writes it: `0` or a decimal without leading zeros. */
export const ARRAY_INDEX = /^(0|[1-9][0-9]*)$/;

/**
 * The value at `segments` in `doc`, following own properties only (never a prototype's) and array
 * indexes in range. `{found: false, missing}` names the first segment that did not resolve (its
 * pointer prefix). Never throws.
 */
export function resolvePointer(doc: unknown, segments: readonly string[]): { found: true; value: unknown } | { found: false; missing: string } {
  let cur: unknown = doc;
  let at = "";
  for (const seg of segments) {
    at += `/${seg.replace(/~/g, "~0").replace(/\//g, "~1")}`;
    if (Array.isArray(cur)) {
      if (!ARRAY_INDEX.test(seg)) return { found: false, missing: at };
      const i = Number(seg);
      if (i >= cur.length) return { found: false, missing: at };
      cur = cur[i];
    } else if (cur !== null && typeof cur === "object") {
      if (!Object.hasOwn(cur, seg)) return { found: false, missing: at };
      cur = (cur as Record<string, unknown>)[seg];
    } else {
      return { found: false, missing: at };
    }
  }
  return { found: true, value: cur };
}

/** What {@link jsonBounds} found: the value's nesting depth and size, or the first bound it broke. */
export type JsonBounds = { readonly ok: true; readonly depth: number; readonly size: number } | { readonly ok: false; readonly problem: "depth" | "size"; readonly limit: number };

/**
 * Measures a value's nesting depth and approximate JSON size (UTF-16 units of its JSON text, escapes
 * not counted) WITHOUT recursion, stopping as soon as either exceeds its limit. Anything recursive
 * (schema validation, `JSON.stringify`, canonical comparison) can overflow the stack on a value nested
 * thousands of levels deep, so hostile input passes through this first. Never throws (a cycle ends as
 * a `depth` problem); work is bounded by `maxSize` and `maxDepth`, not by the input.
 */
export function jsonBounds(value: unknown, limits: { maxDepth: number; maxSize: number }): JsonBounds {
  const stack: [unknown, number][] = [[value, 0]];
  let size = 0;
  let deepest = 0;
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v !== null && typeof v === "object") {
      if (depth >= limits.maxDepth) return { ok: false, problem: "depth", limit: limits.maxDepth };
      deepest = Math.max(deepest, depth + 1);
      size += 2;
      if (Array.isArray(v)) {
        size += v.length;
        if (size > limits.maxSize) return { ok: false, problem: "size", limit: limits.maxSize };
        for (let i = v.length - 1; i >= 0; i--) stack.push([v[i], depth + 1]);
      } else {
        for (const k of Object.keys(v)) {
          size += k.length + 4;
          if (size > limits.maxSize) return { ok: false, problem: "size", limit: limits.maxSize };
          stack.push([(v as Record<string, unknown>)[k], depth + 1]);
        }
      }
    } else if (typeof v === "string") {
      size += v.length + 2;
    } else {
      size += v === undefined ? 4 : String(v).length;
    }
    if (size > limits.maxSize) return { ok: false, problem: "size", limit: limits.maxSize };
  }
  return { ok: true, depth: deepest, size };
}

/**
 * Cuts `text` to at most `max` UTF-16 units (never inside a surrogate pair), saying how much was cut.
 * Messages that quote their input (a refusal naming the path it refused) stay bounded this way.
 */
export function boundText(text: string, max: number): string {
  if (text.length <= max) return text;
  let end = Math.max(0, max - 40);
  const c = text.charCodeAt(end - 1);
  if (c >= 0xd800 && c <= 0xdbff) end -= 1;
  return `${text.slice(0, end)}… [${text.length - end} characters cut]`;
}
