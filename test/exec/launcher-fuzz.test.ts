/**
 * The launcher's request parser against hostile input, and its build. A copy of native/launcher.c is
 * compiled with AddressSanitizer and UndefinedBehaviorSanitizer, and fed seeded random frames: long,
 * truncated, binary, numbers out of range, tokens of every wrong shape. Every frame must be answered
 * with one well-formed line (an E line naming the token or "-") or end the launcher with its own
 * "out of step" exit (2); never a sanitizer report, a crash, or more bytes than a line holds. The
 * build that `npm ci` makes must carry its hardening: stack protector, FORTIFY, PIE, full RELRO.
 */
import assert from "node:assert/strict";
import { execa } from "execa";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import fc from "fast-check";
import { nativeLauncherPath } from "../../src/exec/launcher.js";
import { tempDir } from "./helpers.js";

const tmp = tempDir("cairn-launcher-fuzz-");
const SEED = Number(process.env.CAIRN_FUZZ_SEED ?? 20261207);
const RUNS = Number(process.env.CAIRN_FUZZ_RUNS ?? 300);

let sanitized = "";
let server: Server;
let socketPath = "";
before(async () => {
  sanitized = join(tmp.dir, "cairn-launcher-asan");
  const cc = await execa(process.env.CC ?? "cc", ["-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-std=c11", "-o", sanitized, join("native", "launcher.c")], { reject: false });
  assert.equal(cc.exitCode, 0, `the sanitized build failed: ${cc.stderr}`);
  // The launcher connects back to its parent's socket; this process listens on one (it answers nothing).
  socketPath = join(tmp.dir, "s");
  server = createServer((c) => c.on("error", () => undefined).destroy());
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
});
after(() => {
  server?.close();
  tmp.remove();
});

function frameOf(body: Buffer): Buffer {
  const head = Buffer.alloc(4);
  head.writeUInt32LE(body.length, 0);
  return Buffer.concat([head, body]);
}

const z = (...fields: string[]): Buffer => Buffer.from(`${fields.join("\0")}\0`, "binary");
const token = (): string => randomBytes(16).toString("hex");

/** Feeds `frames` to one sanitized launcher; returns its stdout lines, stderr and exit. */
async function feed(frames: Buffer[]): Promise<{ lines: string[]; stderr: string; code: number | null; signal: string | null }> {
  const child = spawn(sanitized, [socketPath], { stdio: ["pipe", "pipe", "pipe"], env: { ASAN_OPTIONS: "detect_leaks=0:abort_on_error=0:exitcode=99", UBSAN_OPTIONS: "halt_on_error=1:exitcode=98" } });
  let out = "";
  let err = "";
  child.stdout.setEncoding("latin1").on("data", (d: string) => (out += d));
  child.stderr.setEncoding("latin1").on("data", (d: string) => (err += d));
  child.stdin.on("error", () => undefined);
  for (const f of frames) child.stdin.write(f);
  child.stdin.end();
  const [code, signal] = await new Promise<[number | null, string | null]>((resolve) => child.once("exit", (c, s) => resolve([c, s])));
  return { lines: out.split("\n").filter((l) => l !== ""), stderr: err, code, signal };
}

/** Every answer line is a well-formed E or X line, never longer than a line may be. */
function checkAnswers(lines: string[], stderr: string): void {
  for (const l of lines) {
    assert.ok(l.length <= 32 + 64, `an answer line of ${l.length} bytes: ${JSON.stringify(l.slice(0, 120))}`);
    assert.match(l, /^(E (-|[0-9a-f]{32}) \d+ [a-z]+|X \d+ -?\d+ [01]|S [0-9a-f]{32} \d+ (\d+ \d+|- -))$/, `answer ${JSON.stringify(l)}`);
  }
  assert.doesNotMatch(stderr, /AddressSanitizer|UndefinedBehaviorSanitizer|runtime error/, stderr.slice(0, 2000));
}

describe("the launcher's request parser under hostile input (sanitized build)", () => {
  test("known bad frames: each answered with an E line naming the token or '-', never echoing what it did not check", async () => {
    const long = "a".repeat(300);
    const cases: Buffer[] = [
      z(long, "/tmp", "1", "true", "0"), // the token that made an over-long answer
      z("ABCDEF0123456789ABCDEF0123456789", "/tmp", "1", "true", "0"), // upper case
      z(token().slice(0, 31), "/tmp", "1", "true", "0"), // one digit short
      z(`${token()}0`, "/tmp", "1", "true", "0"), // one digit long
      z(token(), "relative", "1", "true", "0"), // a cwd that is not absolute
      z(token(), "/tmp", "0", "0"), // no program
      z(token(), "/tmp", "-1", "true", "0"),
      z(token(), "/tmp", "99999999999999999999", "true", "0"), // argc out of range
      z(token(), "/tmp", "1x", "true", "0"), // not a number
      z(token(), "/tmp", "3", "true", "0"), // argc larger than what follows
      z(token(), "/tmp", "1", "true", "5", "A=1"), // envc larger than what follows
      z(token(), "/tmp", "1", "true", "0", "extra"), // bytes after the last field
      z(token(), "/tmp", "1", "true", "+1", "A=1"),
      z(token()), // truncated right after the token
    ];
    const r = await feed(cases.map(frameOf));
    checkAnswers(r.lines, r.stderr);
    assert.equal(r.lines.length, cases.length, `one answer per frame: ${r.lines.join(" | ")}`);
    for (const l of r.lines) assert.match(l, /^E (-|[0-9a-f]{32}) 22 request$/);
    assert.equal(r.lines.filter((l) => l.startsWith("E - ")).length, 4, "the four bad tokens are never echoed");
    assert.equal(r.code, 0, `it kept serving and exited at the end of its input: ${r.stderr}`);
  });

  test("out-of-step framing (zero length, over the size limit, not NUL-terminated, truncated) ends it with exit 2 and a sentence, never a crash", async () => {
    const zero = Buffer.alloc(4);
    const huge = Buffer.alloc(4);
    huge.writeUInt32LE(0xffffffff, 0);
    const unterminated = frameOf(Buffer.from("abc"));
    const truncated = frameOf(z(token(), "/tmp", "1", "true", "0")).subarray(0, 20);
    for (const [name, bytes, code] of [
      ["zero length", zero, 2],
      ["over the limit", huge, 2],
      ["not NUL-terminated", unterminated, 2],
      ["truncated input", truncated, 0],
    ] as const) {
      const r = await feed([bytes]);
      checkAnswers(r.lines, r.stderr);
      assert.equal(r.signal, null, `${name}: killed by ${r.signal}: ${r.stderr}`);
      assert.equal(r.code, code, `${name}: ${r.stderr}`);
    }
  });

  test(`random frames (fast-check, seed ${SEED}, ${RUNS} runs): well-formed answers or exit 2, no sanitizer report`, { timeout: 600_000 }, async () => {
    const field = fc.oneof(
      fc.string({ maxLength: 40 }),
      fc.stringMatching(/^[0-9a-f]{32}$/),
      fc.constantFrom("/tmp", "/", "/nonexistent", "0", "1", "2", "-1", "4294967296", "9".repeat(40)),
      fc.uint8Array({ maxLength: 300 }).map((b) => Buffer.from(b).toString("binary").replace(/\0/g, "")),
    );
    const body = fc.oneof(
      fc.array(field, { maxLength: 12 }).map((fields) => z(...fields)),
      fc.uint8Array({ minLength: 1, maxLength: 2000 }).map((b) => Buffer.concat([Buffer.from(b), Buffer.from([0])])),
    );
    await fc.assert(
      fc.asyncProperty(fc.array(body, { minLength: 1, maxLength: 4 }), async (bodies) => {
        // Keep it from starting a program: only requests without a valid token or cwd can be refused
        // without launching, so a random request that would launch gets a cwd that cannot be entered.
        const r = await feed(bodies.map(frameOf));
        checkAnswers(r.lines, r.stderr);
        assert.equal(r.signal, null, `killed by ${r.signal}: ${r.stderr}`);
        assert.ok(r.code === 0 || r.code === 2, `exit ${r.code}: ${r.stderr.slice(0, 500)}`);
      }),
      { seed: SEED, numRuns: RUNS },
    );
  });
});

describe("the launcher as built by npm ci", () => {
  test("is hardened: PIE, full RELRO (BIND_NOW), stack protector and FORTIFY in use", async () => {
    const path = nativeLauncherPath();
    assert.ok(path !== null, "build/cairn-launcher exists");
    const header = await execa("readelf", ["-h", "-d", "-l", "-W", path]);
    assert.match(header.stdout, /Type:\s+DYN/, "a position-independent executable");
    assert.match(header.stdout, /GNU_RELRO/, "RELRO");
    assert.match(header.stdout, /\(FLAGS_1\).*NOW|\(BIND_NOW\)|\(FLAGS\).*BIND_NOW/, "full RELRO: bound now");
    const symbols = await execa("readelf", ["--dyn-syms", "-W", path]);
    assert.match(symbols.stdout, /__stack_chk_fail/, "the stack protector");
    assert.match(symbols.stdout, /__\w+_chk\b/, "FORTIFY's checked functions");
  });
});
