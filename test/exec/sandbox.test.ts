/**
 * The sandbox's command line (a pure function of the launch) and the choice of sandbox; then, with
 * real processes, what a machine without bubblewrap gets: `cairn serve` refuses to start and names
 * the package and the flag, `cairn run` warns once and runs, `--sandbox required` refuses.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { ConfigError } from "../../src/errors.js";
import { bwrapArgv, chooseSandbox, probeSandbox, type SandboxLaunch } from "../../src/exec/sandbox.js";
import { createExecutor, type CellBoundary } from "../../src/exec/executor.js";
import { DEFAULT_CELL_LIMITS } from "../../src/exec/cgroup.js";
import { which } from "../../src/exec/which.js";
import { collector } from "./helpers.js";
import { cairn } from "../cli/support.js";
import { tempDir } from "./helpers.js";

const tmp = tempDir("cairn-sandbox-");
after(() => tmp.remove());

function launch(extra: Partial<SandboxLaunch> = {}): SandboxLaunch {
  return { bwrap: "/usr/bin/bwrap", init: "/opt/cairn/build/cairn-launcher", cwd: "/work/ws", network: "off", hide: [], binds: [], initArgs: [], argv: ["true"], ...extra };
}

/** The mount operations of an argv, as [op, path] pairs, in order. */
function mounts(argv: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--tmpfs" || a === "--remount-ro") out.push(`${a} ${argv[i + 1]}`);
    else if (a === "--bind" || a === "--ro-bind") out.push(`${a} ${argv[i + 2]}`);
    if (a === "--") break;
  }
  return out;
}

describe("the sandbox's command line", () => {
  test("its own namespaces, no capabilities, the root read-only, a private /tmp and /run, the workspace writable, then the init as the namespace's first process", () => {
    const argv = bwrapArgv(launch({ argv: ["pytest", "-q"], initArgs: ["--nproc", "64"] }));
    for (const flag of ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--as-pid-1"]) assert.ok(argv.includes(flag), flag);
    assert.deepEqual(argv.slice(argv.indexOf("--cap-drop"), argv.indexOf("--cap-drop") + 2), ["--cap-drop", "ALL"]);
    assert.deepEqual(mounts(argv), ["--ro-bind /", "--tmpfs /tmp", "--tmpfs /run", "--bind /work/ws", "--ro-bind /run/cairn/init"]);
    assert.deepEqual(argv.slice(argv.indexOf("--")), ["--", "/run/cairn/init", "init", "--pid1", "--nproc", "64", "--", "pytest", "-q"]);
  });

  test("network host keeps the host's network namespace", () => {
    assert.ok(!bwrapArgv(launch({ network: "host" })).includes("--unshare-net"));
  });

  test("paths to hide: outside the workspace before it is bound, inside it after; read-only and empty; ancestors of the workspace and paths under /tmp and /run are left alone; a path inside a hidden one is not mounted again", () => {
    const argv = bwrapArgv(
      launch({
        hide: [
          { path: "/home/u/.ssh", dir: true },
          { path: "/work/ws/.cairn", dir: true },
          { path: "/work/ws/.cairn/run-1", dir: true },
          { path: "/work", dir: true },
          { path: "/tmp/cairn-abc", dir: true },
          { path: "/etc/cairn/key.pem", dir: false },
          { path: "/work/other-run", dir: true },
        ],
      }),
    );
    assert.deepEqual(mounts(argv), [
      "--ro-bind /",
      "--tmpfs /tmp",
      "--tmpfs /run",
      "--tmpfs /home/u/.ssh",
      "--remount-ro /home/u/.ssh",
      "--ro-bind /etc/cairn/key.pem",
      "--tmpfs /work/other-run",
      "--remount-ro /work/other-run",
      "--bind /work/ws",
      "--tmpfs /work/ws/.cairn",
      "--remount-ro /work/ws/.cairn",
      "--ro-bind /run/cairn/init",
    ]);
  });

  test("files bound in (a script, the cell socket, the cairn command) come after every hiding mount", () => {
    const argv = bwrapArgv(launch({ hide: [{ path: "/work/ws/.cairn", dir: true }], binds: [{ src: "/work/ws/.cairn/x/cell.sock", dest: "/run/cairn/cairn.sock", writable: true }, { src: "/tmp/s/cell-1.py", dest: "/run/cairn/cell-1.py" }] }));
    const m = mounts(argv);
    assert.deepEqual(m.slice(-2), ["--bind /run/cairn/cairn.sock", "--ro-bind /run/cairn/cell-1.py"]);
  });
});

describe("choosing the sandbox", () => {
  const missing = () => ({ ok: false as const, reason: "bubblewrap (bwrap) is not installed" });
  test("required without one: a ConfigError that names the package to install and the flag that accepts the risk", () => {
    assert.throws(
      () => chooseSandbox("required", missing),
      (err: unknown) => err instanceof ConfigError && /apt-get install bubblewrap/.test(err.message) && /--sandbox none/.test(err.message) && /not installed/.test(err.message),
    );
  });
  test("auto without one: none, with the reason; none: never probed", () => {
    assert.deepEqual(chooseSandbox("auto", missing), { kind: "none", reason: "bubblewrap (bwrap) is not installed" });
    assert.deepEqual(chooseSandbox("none", () => assert.fail("probed")), { kind: "none", reason: "--sandbox none" });
    assert.deepEqual(chooseSandbox("auto", () => ({ ok: true, bwrap: "/usr/bin/bwrap" })), { kind: "bwrap", bwrap: "/usr/bin/bwrap" });
  });
});

describe("a machine without bubblewrap (PATH without bwrap)", () => {
  // Only the CLI's own PATH lacks bwrap: node is started by its absolute path, cells use absolute ones.
  const noBwrap = join(tmp.dir, "empty-bin");
  mkdirSync(noBwrap, { recursive: true });
  const model = join(tmp.dir, "model.json");
  writeFileSync(
    model,
    JSON.stringify({
      rounds: [
        { patch: [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["/bin/echo", "ran"] } }] },
        { patch: [{ op: "test", path: "/revision", value: 1 }, { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "ok" } }] },
      ],
    }),
  );

  test("cairn serve refuses to start (exit 2), naming the package and --sandbox none", async () => {
    const r = await cairn(["serve", "--db", "s", "--create", "--data-dir", join(tmp.dir, "serve"), "--model", `scripted:${model}`, "--listen", "127.0.0.1:0"], { env: { PATH: noBwrap } });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /cells must run in a sandbox, and none can be built here: bubblewrap \(bwrap\) is not installed/);
    assert.match(r.stderr, /apt-get install bubblewrap/);
    assert.match(r.stderr, /--sandbox none/);
  });

  test("cairn run warns once at start and runs; the log and status say the cells were not sandboxed", async () => {
    const dataDir = join(tmp.dir, "run");
    const ws = join(tmp.dir, "ws");
    mkdirSync(ws, { recursive: true });
    const r = await cairn(["run", "echo", "--db", "r", "--data-dir", dataDir, "--cwd", ws, "--model", `scripted:${model}`], { env: { PATH: noBwrap } });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr.match(/WITHOUT a sandbox/g)?.length, 1, r.stderr);
    assert.match(r.stdout, /cells NOT sandboxed/);
    const status = await cairn(["status", "--db", "r", "--data-dir", dataDir]);
    assert.match(status.stdout, /cells: NOT sandboxed/);
    const log = await cairn(["log", "--db", "r", "--data-dir", dataDir]);
    assert.match(log.stdout, /sandbox none/);
  });

  test("cairn run --sandbox required refuses (exit 2) before touching the database", async () => {
    const dataDir = join(tmp.dir, "required");
    const r = await cairn(["run", "echo", "--db", "q", "--data-dir", dataDir, "--sandbox", "required", "--model", `scripted:${model}`], { env: { PATH: noBwrap } });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /cells must run in a sandbox/);
    const status = await cairn(["status", "--db", "q", "--data-dir", dataDir]);
    assert.equal(status.code, 2, "no database was created");
  });
});

describe("a script that declares dependencies, in a sandbox without network", { skip: probeSandbox().ok ? false : "no sandbox here" }, () => {
  test("they are installed first (uv sync --script) where the network is and neither the workspace nor any secret is; then the script runs offline from the same cache; a failed install runs nothing", async () => {
    // A stand-in for uv (PyPI is out of reach here), outside /tmp so that both sandboxes see it: on
    // `sync` it records what it could reach; on `run` it checks it is offline with the cache filled.
    const bin = mkdtempSync("/var/tmp/cairn-fake-uv-");
    const ws = join(tmp.dir, "uv-ws");
    mkdirSync(ws, { recursive: true });
    writeFileSync(join(ws, "workspace-secret.txt"), "only the cell may read this\n");
    const listener = createServer((c) => c.end());
    await new Promise<void>((r) => listener.listen(0, "127.0.0.1", r));
    const port = (listener.address() as { port: number }).port;
    const uv = join(bin, "uv");
    writeFileSync(
      uv,
      [
        "#!/bin/sh",
        'if [ "$1" = sync ]; then',
        '  [ -n "$FAIL_SYNC" ] && { echo "no such package: nonexistent-pkg" >&2; exit 1; }',
        `  if python3 -c "import socket; socket.create_connection(('127.0.0.1', ${port}), 3)" 2>/dev/null; then echo net=yes; else echo net=no; fi > "$UV_CACHE_DIR/sync-saw"`,
        `  if [ -e ${ws}/workspace-secret.txt ]; then echo workspace=visible; else echo workspace=hidden; fi >> "$UV_CACHE_DIR/sync-saw"`,
        '  env | grep -c SECRET_TOKEN_FOR_TEST >> "$UV_CACHE_DIR/sync-saw"',
        '  echo installed > "$UV_CACHE_DIR/env-ready"; exit 0',
        "fi",
        'echo "offline=$UV_OFFLINE cache=$(cat "$UV_CACHE_DIR/env-ready" 2>/dev/null || echo empty) script=$3"',
        `if python3 -c "import socket; socket.create_connection(('127.0.0.1', ${port}), 3)" 2>/dev/null; then echo cell-net=yes; else echo cell-net=no; fi`,
        'cat "$UV_CACHE_DIR/sync-saw"',
        'exec python3 "$3"',
      ].join("\n"),
      { mode: 0o755 },
    );
    const probe = probeSandbox();
    assert.ok(probe.ok);
    const boundary: CellBoundary = { sandbox: { kind: "bwrap", bwrap: probe.bwrap }, network: "off", hide: [], passEnv: [], limits: DEFAULT_CELL_LIMITS };
    const ex = createExecutor({ which: (cmd) => (cmd === "uv" ? uv : which(cmd)) });
    const source = '# /// script\n# dependencies = ["rich"]\n# ///\nprint("the script ran")\n';
    process.env.SECRET_TOKEN_FOR_TEST = "s3cr3t";
    try {
      const out = collector();
      const p = await ex.prepare({ cellId: 1, cell: { kind: "script", source }, cwd: ws, scriptDir: join(tmp.dir, "uv-scripts"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 10, boundary, onOutput: out.onOutput });
      assert.equal(p.kind, "gated");
      if (p.kind !== "gated") return;
      p.release();
      const o = await p.done;
      const text = out.text("stdout");
      assert.equal(o.result, "success", `${o.detail} ${text} ${out.text("stderr")}`);
      assert.match(text, /^offline=1 cache=installed script=\/run\/cairn\/cell-1-[0-9a-f]{12}\.py$/m, "the script ran offline, from the cache the install filled");
      assert.match(text, /^cell-net=no$/m, "the cell itself has no network");
      assert.match(text, /^net=yes$/m, "the install had the network");
      assert.match(text, /^workspace=hidden$/m, "the install did not see the workspace");
      assert.match(text, /^0$/m, "no secret reached the install");
      assert.match(text, /^the script ran$/m);

      const failing = collector();
      process.env.FAIL_SYNC = "1";
      const f = await createExecutor({ which: (cmd) => (cmd === "uv" ? uv : which(cmd)) }).prepare({ cellId: 2, cell: { kind: "script", source }, cwd: ws, scriptDir: join(tmp.dir, "uv-scripts"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 10, boundary: { ...boundary, passEnv: ["FAIL_SYNC"] }, onOutput: failing.onOutput });
      assert.equal(f.kind, "gated");
      if (f.kind !== "gated") return;
      f.release();
      const fo = await f.done;
      assert.equal(fo.result, "error");
      assert.match(fo.detail ?? "", /the script's dependencies could not be installed \(uv sync --script: exited with code 1\): no such package: nonexistent-pkg; the script did not run/);
      assert.doesNotMatch(failing.text("stdout"), /the script ran/);
    } finally {
      delete process.env.SECRET_TOKEN_FOR_TEST;
      delete process.env.FAIL_SYNC;
      listener.close();
      rmSync(bin, { recursive: true, force: true });
      assert.equal(existsSync(bin), false);
    }
  });
});

describe("nothing outlives a sandboxed cell", { skip: probeSandbox().ok ? false : "no sandbox here" }, () => {
  const marker = (n: number) => `${n}.${process.pid}`;
  const running = (argv: string[]): number[] => {
    const want = `${argv.join("\0")}\0`;
    return readdirSync("/proc").filter((e) => /^\d+$/.test(e) && (() => {
      try {
        return readFileSync(`/proc/${e}/cmdline`, "utf8") === want && !/^[ZX]$/.test(readFileSync(`/proc/${e}/stat`, "utf8").split(") ")[1]?.[0] ?? "");
      } catch {
        return false;
      }
    })()).map(Number);
  };
  const boundary = (): CellBoundary => {
    const probe = probeSandbox();
    assert.ok(probe.ok);
    return { sandbox: { kind: "bwrap", bwrap: probe.bwrap }, network: "off", hide: [], passEnv: [], limits: DEFAULT_CELL_LIMITS };
  };
  const spawnLeftovers = (a: number, b: number): string[] => ["sh", "-c", `setsid sleep ${marker(a)} & (sleep ${marker(b)} &) ; echo started; sleep 600`];

  for (const how of ["stop (cancel, shutdown, the wall-time limit)", "SIGKILL of its process group (the keeper at the lease deadline, a fence)"] as const) {
    test(`${how}: its setsid child and double-forked daemon end with it`, async () => {
      const [a, b] = how.startsWith("stop") ? [3101, 3102] : [3201, 3202];
      const out = collector();
      const ex = createExecutor({ killGraceMs: 300 });
      const p = await ex.prepare({ cellId: 1, cell: { kind: "cmd", argv: spawnLeftovers(a, b) }, cwd: tmp.dir, scriptDir: join(tmp.dir, "leftover-scripts"), wallTimeMs: 60_000, outputLimitBytes: 1 << 20, flushIntervalMs: 10, boundary: boundary(), onOutput: out.onOutput });
      assert.equal(p.kind, "gated");
      if (p.kind !== "gated") return;
      p.release();
      const deadline = Date.now() + 60_000;
      while (!(out.text("stdout").includes("started") && running(["sleep", marker(a)]).length === 1 && running(["sleep", marker(b)]).length === 1)) {
        assert.ok(Date.now() < deadline, "the leftovers to start");
        await new Promise((r) => setTimeout(r, 50));
      }
      if (how.startsWith("stop")) await p.stop("cancelled");
      else process.kill(-p.identity.pgid, "SIGKILL");
      await p.done;
      const gone = Date.now() + 30_000;
      while (running(["sleep", marker(a)]).length + running(["sleep", marker(b)]).length > 0) {
        assert.ok(Date.now() < gone, `left running: ${running(["sleep", marker(a)])} ${running(["sleep", marker(b)])}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    });
  }
});
