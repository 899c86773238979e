/**
 * The native launcher's inline gate (native/launcher.c become_gate,
 * wait_for_go, run_released, over_exec_limits; src/exec/launcher.ts), with real processes: "go"
 * written in pieces, without its newline, with bytes after it; signals to the gate's group while it
 * waits; argv and environment at the kernel's exec limits (one byte under and over); an empty
 * environment; relative program names; what ps and /proc show; the fds the gate and the cell hold.
 *
 * Hang guards only (waitFor deadlines of 120 s); nothing here asserts on wall time. A short pause is
 * used only to give a wrongly released gate the chance to run before checking that it did not.
 */
import assert from "node:assert/strict";
import { execa } from "execa";
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { createExecutor } from "../../src/exec/executor.js";
import { cellEnvironment } from "../../src/exec/environment.js";
import type { GateExit, GateLauncher, GateProcess } from "../../src/exec/gate.js";
import { createNativeLauncher, nativeLauncherPath } from "../../src/exec/launcher.js";
import { readProcStat } from "../../src/exec/procfs.js";
import { comm, killGroupQuietly, tempDir, waitFor } from "./helpers.js";

const tmp = tempDir("cairn-gate-");
const groups: number[] = [];
after(() => {
  for (const g of groups) killGroupQuietly(g);
  tmp.remove();
});

const path = nativeLauncherPath();
const HANG = 120_000;
const PATH = process.env["PATH"] ?? "/usr/bin:/bin";

interface Started {
  readonly gate: GateProcess;
  stdout(): string;
  stderr(): string;
}

async function start(launcher: GateLauncher, argv: string[], env: Record<string, string> = { PATH }, cwd = tmp.dir): Promise<Started> {
  const r = await launcher.start({ argv, cwd, env });
  if (!r.ok) assert.fail(`launch of ${argv[0]?.slice(0, 60)} refused: ${r.error.message}`);
  groups.push(r.gate.pid);
  let out = "";
  let err = "";
  r.gate.stdout.setEncoding("utf8");
  r.gate.stderr.setEncoding("utf8");
  r.gate.stdout.on("data", (c: string) => (out += c));
  r.gate.stderr.on("data", (c: string) => (err += c));
  // The native launcher hands the streams over paused.
  r.gate.stdout.resume();
  r.gate.stderr.resume();
  r.gate.stdin.on("error", () => undefined);
  return { gate: r.gate, stdout: () => out, stderr: () => err };
}

/** The streams are closed once every holder is gone: all of the cell's output was read then. */
async function drained(s: Started): Promise<void> {
  await Promise.all(
    [s.gate.stdout, s.gate.stderr].map((stream) => (stream.closed ? Promise.resolve() : new Promise<void>((resolve) => stream.once("close", () => resolve())))),
  );
}

async function exitOf(s: Started): Promise<GateExit> {
  const e = await s.gate.exited;
  await drained(s);
  return { code: e.code, signal: e.signal };
}

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The fd numbers `pid` holds, sorted. */
function fdsOf(pid: number): number[] {
  return readdirSync(`/proc/${pid}/fd`)
    .map(Number)
    .sort((a, b) => a - b);
}

/** The kernel's room for argv + envp strings and pointers (fs/exec.c bprm_stack_limits), from this process's stack limit (the launcher inherits it). */
function execLimit(): number {
  const line = readFileSync("/proc/self/limits", "utf8")
    .split("\n")
    .find((l) => l.startsWith("Max stack size"));
  const soft = line?.split(/\s+/)[3];
  let limit = 6 * 1024 * 1024; // _STK_LIM / 4 * 3
  if (soft !== undefined && soft !== "unlimited") limit = Math.min(limit, Math.floor(Number(soft) / 4));
  return Math.max(limit, 32 * 4096); // ARG_MAX
}

/**
 * An argv for `program` whose exec takes exactly `total` bytes as the launcher counts them: one
 * pointer per argv and env string, each string with its NUL, and the program name once more (the
 * kernel copies the file name it was asked to exec).
 */
function argvTaking(program: string, total: number, env: Record<string, string>): string[] {
  const envBytes = Object.entries(env).reduce((n, [k, v]) => n + 8 + Buffer.byteLength(`${k}=${v}`) + 1, 0);
  const argv = [program];
  let used = envBytes + 8 + (program.length + 1) + (program.length + 1);
  const chunk = 100_000;
  while (used + 8 + chunk + 1 + 8 + 2 <= total) {
    argv.push("x".repeat(chunk));
    used += 8 + chunk + 1;
  }
  const last = total - used - 8 - 1;
  assert.ok(last >= 1 && last < 128 * 1024);
  argv.push("y".repeat(last));
  return argv;
}

describe("the native launcher's inline gate", { skip: path === null ? "build/cairn-launcher is not built" : false }, () => {
  const launcher = (): GateLauncher => createNativeLauncher(path!);
  const native = path === null ? null : launcher();

  test('"go" written in pieces ("g", then "o\\n") releases only at the newline', async () => {
    const marker = join(tmp.dir, "pieces");
    const s = await start(native!, ["touch", marker]);
    s.gate.stdin.write("g");
    await pause(300);
    assert.equal(existsSync(marker), false, "nothing ran on a lone 'g'");
    assert.equal(comm(s.gate.pid), "cairn-gate", "still the gate");
    s.gate.stdin.write("o");
    await pause(300);
    assert.equal(existsSync(marker), false, "nothing ran on 'go' without its newline");
    s.gate.stdin.write("\n");
    assert.deepEqual(await exitOf(s), { code: 0, signal: null });
    assert.equal(existsSync(marker), true);
  });

  test('"go" without its newline, then end of file: exit 125, nothing ran', async () => {
    const marker = join(tmp.dir, "no-newline");
    const s = await start(native!, ["touch", marker]);
    s.gate.stdin.end("go");
    assert.deepEqual(await exitOf(s), { code: 125, signal: null });
    assert.equal(existsSync(marker), false);
  });

  test("anything else before the newline (empty line, 'go ', 'GO', 'go\\r', a long line, a NUL) or end of file at once: 125, nothing ran", async () => {
    const words = ["\ngo\n", "go \n", "GO\n", "go\r\n", `${"go".repeat(50)}\n`, "g\0o\n", "", "o\n"];
    const runs = await Promise.all(
      words.map(async (w, i) => {
        const marker = join(tmp.dir, `wrong-word-${i}`);
        const s = await start(native!, ["touch", marker]);
        s.gate.stdin.end(w);
        return { w, marker, exit: await exitOf(s) };
      }),
    );
    for (const r of runs) {
      assert.deepEqual(r.exit, { code: 125, signal: null }, JSON.stringify(r.w));
      assert.equal(existsSync(r.marker), false, JSON.stringify(r.w));
    }
  });

  test("bytes written after \"go\\n\" never reach the cell: its stdin is /dev/null; it holds fds 0, 1, 2 and the status connection 3 (the waiting gate held 0, 1, 2)", async () => {
    // `ls` alone, not in a pipeline: while the shell builds a pipeline it holds the pipes' fds itself
    // (seen once as "0 1 2 4": the shell between forking `sort` and `tr`), which are not the cell's.
    const s = await start(native!, ["sh", "-c", 'cat; printf "[%s]" "$(readlink /proc/$$/fd/0)"; ls /proc/$$/fd']);
    assert.deepEqual(fdsOf(s.gate.pid), [0, 1, 2], "the waiting gate holds exactly 0, 1, 2");
    for (const fd of [0, 1, 2]) assert.match(readlinkSync(`/proc/${s.gate.pid}/fd/${fd}`), /^socket:\[\d+\]$/);
    s.gate.stdin.write("go\nEXTRA BYTES IN THE SAME WRITE\n");
    s.gate.stdin.write("and a later write\n");
    assert.deepEqual(await exitOf(s), { code: 0, signal: null });
    assert.equal(s.stdout(), "[/dev/null]0\n1\n2\n3\n", "cat read nothing; fd 0 is /dev/null; fd 3 is the status connection the cell's init closes; no other fd");
  });

  test("a released, running program: fd 0 is /dev/null, 1 and 2 the same sockets the gate held, 3 the gate's former stdin (the status connection), nothing else; ps and /proc show cairn-gate PROGRAM while gated, the argv after", async () => {
    const s = await start(native!, ["sleep", "600"]);
    const pid = s.gate.pid;
    const before = [1, 2, 0].map((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`));
    assert.equal(comm(pid), "cairn-gate");
    assert.match(readFileSync(`/proc/${pid}/cmdline`, "utf8"), /^cairn-gate\0sleep\0*$/, "the launcher's argv area, the program's name in it");
    const ps = await execa("ps", ["-o", "comm=,args=", "-p", String(pid)], { reject: false });
    assert.match(ps.stdout.trim(), /^cairn-gate\s+cairn-gate sleep\s*$/);
    s.gate.stdin.write("go\n");
    await waitFor(() => comm(pid) === "sleep", HANG, "the cell's exec");
    assert.equal(readFileSync(`/proc/${pid}/cmdline`, "utf8"), "sleep\x00600\x00");
    assert.deepEqual(fdsOf(pid), [0, 1, 2, 3]);
    assert.equal(readlinkSync(`/proc/${pid}/fd/0`), "/dev/null");
    assert.deepEqual(
      [1, 2, 3].map((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`)),
      before,
    );
    const stat = readProcStat(pid);
    assert.equal(stat?.pgid, pid);
    assert.equal(stat?.sid, pid);
    killGroupQuietly(pid);
    assert.deepEqual(await exitOf(s), { code: null, signal: "SIGKILL" });
  });

  test("a program name longer than the launcher's argv area is cut in ps, never overflows; on release the full name is in the error line", async () => {
    const long = `/nonexistent/${"p".repeat(400)}`;
    const s = await start(native!, [long, "arg"]);
    assert.equal(comm(s.gate.pid), "cairn-gate");
    const cmdline = readFileSync(`/proc/${s.gate.pid}/cmdline`, "utf8");
    assert.ok(cmdline.startsWith("cairn-gate\0/nonexistent/ppp"), JSON.stringify(cmdline.slice(0, 40)));
    assert.ok(cmdline.endsWith("\0"), "the area still ends with a NUL");
    s.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(s), { code: 127, signal: null });
    assert.equal(s.stderr(), `cairn-gate: ${long}: No such file or directory\n`);
  });

  test("signals to the group while gated: TERM, KILL, HUP, INT end it by that signal, nothing ran; STOP holds it even after \"go\", CONT lets it run", async () => {
    for (const sig of ["SIGTERM", "SIGKILL", "SIGHUP", "SIGINT", "SIGUSR1", "SIGPIPE"] as const) {
      const marker = join(tmp.dir, `signalled-${sig}`);
      const s = await start(native!, ["touch", marker]);
      process.kill(-s.gate.pid, sig);
      const e = await exitOf(s);
      assert.equal(e.code, null, sig);
      assert.equal(e.signal, sig);
      assert.equal(existsSync(marker), false, sig);
    }
    const marker = join(tmp.dir, "stopped-then-continued");
    const s = await start(native!, ["touch", marker]);
    process.kill(-s.gate.pid, "SIGSTOP");
    await waitFor(() => readProcStat(s.gate.pid)?.state === "T", HANG, "the gate stopped");
    s.gate.stdin.write("go\n");
    await pause(300);
    assert.equal(existsSync(marker), false, "a stopped gate does not run");
    assert.equal(comm(s.gate.pid), "cairn-gate");
    process.kill(-s.gate.pid, "SIGCONT");
    assert.deepEqual(await exitOf(s), { code: 0, signal: null });
    assert.equal(existsSync(marker), true);
  });

  test("one argument at the kernel's MAX_ARG_STRLEN (128 KiB with its NUL) runs; one byte more is refused before anything starts; the same for an environment string", async () => {
    const max = 32 * 4096 - 1; // bytes before the NUL
    const ok = await start(native!, ["/bin/sh", "-c", 'printf %s "${#1}"', "sh", "a".repeat(max)]);
    ok.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(ok), { code: 0, signal: null });
    assert.equal(ok.stdout(), String(max));
    const over = await native!.start({ argv: ["/bin/true", "a".repeat(max + 1)], cwd: tmp.dir, env: { PATH } });
    assert.equal(over.ok, false);
    if (!over.ok) assert.equal(over.error.code, "E2BIG");

    const envOk = await start(native!, ["/bin/sh", "-c", 'printf %s "${#BIG}"'], { PATH, BIG: "b".repeat(max - "BIG=".length) });
    envOk.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(envOk), { code: 0, signal: null });
    assert.equal(envOk.stdout(), String(max - 4));
    const envOver = await native!.start({ argv: ["/bin/true"], cwd: tmp.dir, env: { PATH, BIG: "b".repeat(max - "BIG=".length + 1) } });
    assert.equal(envOver.ok, false);
    if (!envOver.ok) assert.equal(envOver.error.code, "E2BIG");
  });

  test("argv + environment exactly at the stack limit runs (absolute program); one byte over is refused before anything starts", async () => {
    const limit = execLimit();
    const env = { PATH };
    const program = "/bin/true";
    const at = await start(native!, argvTaking(program, limit, env), env);
    at.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(at), { code: 0, signal: null }, `at the limit: ${at.stderr()}`);
    const over = await native!.start({ argv: argvTaking(program, limit + 1, env), cwd: tmp.dir, env });
    assert.equal(over.ok, false, "one byte over the limit must be refused up front");
    if (!over.ok) assert.equal(over.error.code, "E2BIG");
  });

  test("under a smaller stack limit (the launcher started through prlimit): the limit is a quarter of it, and never under ARG_MAX (32 pages); exactly at it runs, one byte over is refused up front", async (t) => {
    const prlimit = ["/usr/bin/prlimit", "/bin/prlimit"].find((p) => existsSync(p));
    if (prlimit === undefined) {
      t.skip("prlimit is not installed");
      return;
    }
    // Stack limits of 1 MiB (room 256 KiB) and 256 KiB (a quarter is 64 KiB: ARG_MAX, 128 KiB, applies).
    for (const [stack, room] of [
      [1024 * 1024, 256 * 1024],
      [256 * 1024, 128 * 1024],
    ] as const) {
      const wrapper = join(tmp.dir, `launcher-stack-${stack}`);
      // exec keeps the pid: the launcher's parent is still this process, as it requires.
      writeFileSync(wrapper, `#!/bin/sh\nexec ${prlimit} --stack=${stack}:${stack} -- ${path!} "$@"\n`);
      chmodSync(wrapper, 0o755);
      const small = createNativeLauncher(wrapper);
      const env = { PATH };
      const at = await start(small, argvTaking("/bin/true", room, env), env);
      at.gate.stdin.end("go\n");
      assert.deepEqual(await exitOf(at), { code: 0, signal: null }, `stack ${stack}, at ${room}: ${at.stderr()}`);
      const over = await small.start({ argv: argvTaking("/bin/true", room + 1, env), cwd: tmp.dir, env });
      assert.equal(over.ok, false, `stack ${stack}: one byte over ${room} must be refused up front`);
      if (!over.ok) assert.equal(over.error.code, "E2BIG");
    }
  });

  test(
    "a bare program name (found on PATH) with argv exactly at the limit runs or is refused up front, never a started cell that fails with E2BIG",
    async () => {
      const limit = execLimit();
      const env = { PATH };
      const r = await native!.start({ argv: argvTaking("true", limit, env), cwd: tmp.dir, env });
      if (!r.ok) {
        assert.equal(r.error.code, "E2BIG");
        return;
      }
      groups.push(r.gate.pid);
      const s: Started = await (async () => {
        let err = "";
        r.gate.stderr.setEncoding("utf8");
        r.gate.stderr.on("data", (c: string) => (err += c));
        r.gate.stderr.resume();
        r.gate.stdout.resume();
        return { gate: r.gate, stdout: () => "", stderr: () => err };
      })();
      s.gate.stdin.end("go\n");
      const e = await exitOf(s);
      assert.deepEqual(e, { code: 0, signal: null }, `started, then after release: exit ${e.code}, stderr ${JSON.stringify(s.stderr())}`);
    },
  );

  test(
    "the same through the executor: a cmd cell [\"true\", ...] exactly at the limit is unlaunchable up front or succeeds, never an execution that ran and failed with E2BIG",
    async () => {
      const ex = createExecutor({ killGraceMs: 200, launcher: native! });
      const env = cellEnvironment(process.env, [], {});
      const argv = argvTaking("true", execLimit(), env);
      const p = await ex.prepare({ cellId: 1, cell: { kind: "cmd", argv }, cwd: tmp.dir, scriptDir: join(tmp.dir, "scripts"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 20, onOutput: async () => undefined });
      if (p.kind !== "gated") {
        assert.match(p.outcome.detail ?? "", /E2BIG/);
        return;
      }
      groups.push(p.identity.pgid);
      p.release();
      const outcome = await p.done;
      assert.equal(outcome.result, "success", `gated, released, then: exit ${outcome.exit_code}, ${outcome.detail}`);
    },
  );

  test(
    "a #! script named by path with argv exactly at the limit runs or is refused up front, never a started cell that fails with E2BIG",
    async () => {
      const script = join(tmp.dir, "edge-script");
      writeFileSync(script, "#!/bin/sh\nexit 0\n");
      chmodSync(script, 0o755);
      const env = { PATH };
      const r = await native!.start({ argv: argvTaking(script, execLimit(), env), cwd: tmp.dir, env });
      if (!r.ok) {
        assert.equal(r.error.code, "E2BIG");
        return;
      }
      groups.push(r.gate.pid);
      let err = "";
      r.gate.stderr.setEncoding("utf8");
      r.gate.stderr.on("data", (c: string) => (err += c));
      r.gate.stderr.resume();
      r.gate.stdout.resume();
      r.gate.stdin.end("go\n");
      const e = await r.gate.exited;
      assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null }, `started, then after release: ${err}`);
    },
  );

  test("an empty environment: no PATH reaches the cell, a program in /bin or /usr/bin is still found, an absolute one runs", async () => {
    const a = await start(native!, ["sh", "-c", 'printf "%s|" "${PATH-unset}"; env | wc -l'], {});
    a.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(a), { code: 0, signal: null }, a.stderr());
    // dash sets its own PATH when none is given, and PWD; nothing of this process's environment.
    assert.match(a.stdout(), /^[^|]*\|\s*\d+\s*$/);
    assert.doesNotMatch(a.stdout(), new RegExp(process.env["HOME"] ?? "no-home-here"));
    const b = await start(native!, ["/usr/bin/env"], {});
    b.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(b), { code: 0, signal: null });
    assert.equal(b.stdout(), "", "the cell's environment is exactly what was sent: nothing");
  });

  /** A harmless program found only in an sbin directory (on dash's default PATH, not on glibc's /bin:/usr/bin). */
  const sbinOnly = [["nologin"], ["iptables", "--version"], ["ldconfig", "--version"]].find(
    ([n]) => ["/usr/sbin", "/sbin"].some((d) => existsSync(join(d, n!))) && !["/usr/bin", "/bin"].some((d) => existsSync(join(d, n!))),
  );

  test(
    "an empty environment: a bare name is searched on dash's default PATH (sbin directories included), as `exec` in sh would",
    {
      skip: sbinOnly === undefined ? "no program found only in an sbin or local directory" : false,
    },
    async () => {
      const s = await start(native!, [...sbinOnly!], {});
      s.gate.stdin.end("go\n");
      const e = await exitOf(s);
      assert.notEqual(e.code, 127, `the native gate finds ${sbinOnly?.[0]}: ${s.stderr()}`);
    },
  );

  test("relative program names: with a slash, relative to the cell's directory; a bare name in the directory but not on PATH is not found (127), as with sh", async () => {
    const dir = join(tmp.dir, "rel");
    mkdirSync(join(dir, "sub"), { recursive: true });
    writeFileSync(join(dir, "prog"), "#!/bin/sh\necho prog \"$@\"\n");
    chmodSync(join(dir, "prog"), 0o755);
    writeFileSync(join(dir, "sub", "noshebang"), "echo no-shebang \"$0\"\n");
    chmodSync(join(dir, "sub", "noshebang"), 0o755);

    const dot = await start(native!, ["./prog", "a b"], { PATH }, dir);
    dot.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(dot), { code: 0, signal: null }, dot.stderr());
    assert.equal(dot.stdout(), "prog a b\n");

    // No #! line: run by /bin/sh, as sh's exec (and execvp) do.
    const noShebang = await start(native!, ["sub/noshebang"], { PATH }, dir);
    noShebang.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(noShebang), { code: 0, signal: null }, noShebang.stderr());
    assert.equal(noShebang.stdout(), "no-shebang sub/noshebang\n");

    const bare = await start(native!, ["prog"], { PATH: "/usr/bin:/bin" }, dir);
    bare.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(bare), { code: 127, signal: null });
    assert.equal(bare.stderr(), "cairn-gate: prog: No such file or directory\n");

    // PATH from the cell's environment, not this process's: a PATH naming the directory finds it.
    const onPath = await start(native!, ["prog", "x"], { PATH: dir }, tmp.dir);
    onPath.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(onPath), { code: 0, signal: null }, onPath.stderr());
    assert.equal(onPath.stdout(), "prog x\n");

    // An empty program name: not found, as sh's `exec ""`.
    const empty = await start(native!, [""], { PATH });
    empty.gate.stdin.end("go\n");
    assert.equal((await exitOf(empty)).code, 127);
  });

  test("a gate started while another waits holds none of the other's sockets, and each is released alone", async () => {
    const a = await start(native!, ["sh", "-c", "echo a"]);
    const b = await start(native!, ["sh", "-c", "echo b"]);
    const links = (pid: number) => fdsOf(pid).map((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`));
    assert.deepEqual(fdsOf(a.gate.pid), [0, 1, 2]);
    assert.deepEqual(fdsOf(b.gate.pid), [0, 1, 2]);
    const shared = links(a.gate.pid).filter((l) => links(b.gate.pid).includes(l));
    assert.deepEqual(shared, []);
    b.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(b), { code: 0, signal: null });
    assert.equal(comm(a.gate.pid), "cairn-gate", "the other still waits");
    a.gate.stdin.end("go\n");
    assert.deepEqual(await exitOf(a), { code: 0, signal: null });
    assert.equal(a.stdout(), "a\n");
    assert.equal(b.stdout(), "b\n");
  });
});
