/**
 * Hostile cells: a run whose cells try, as an attacker steered by what it read would, to get out of
 * their boundary. Real processes throughout: `cairn run` as a child process with secrets in its own
 * environment, its data dir inside the workspace, a TCP listener and a real etcd member on this
 * host's loopback. Each probe writes what it found into the workspace (writable either way).
 *
 * With the sandbox (the default where bubblewrap works) every probe is contained. The same run with
 * `--sandbox none` shows what the sandbox prevents: there the harness's environment, the data dir,
 * the host's loopback and the file system outside the workspace are in reach. (The environment
 * allow-list and the cgroup limits hold with or without it.)
 *
 * A second part runs eight runs of one database at once, each with a script cell printing its own
 * marker and trying to read the other runs' workspaces.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { probeSandbox } from "../../src/exec/sandbox.js";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { cairn } from "../cli/support.js";
import { adds, cmd, conclude, note, tempDir } from "../harness/support.js";
import { startFakeOpenAI } from "../../chaos/support/fake-openai.js";

const sandbox = probeSandbox();
const skip = sandbox.ok ? false : `no sandbox can be built here: ${sandbox.reason}`;

const SECRETS: Record<string, string> = {
  ANTHROPIC_API_KEY: "sk-ant-probe-secret-one",
  OPENAI_API_KEY: "sk-probe-secret-two",
  CAIRN_ETCD_PASSWORD: "etcd-probe-secret-three",
  GITHUB_TOKEN: "ghp_probe_secret_four",
  ANTHROPIC_AUTH_TOKEN: "probe-secret-five",
  CAIRN_UI_TOKEN: "probe-secret-six",
  AWS_SECRET_ACCESS_KEY: "probe-secret-seven",
};

const tmp = tempDir("cairn-hostile-cells-");
const cleanups: (() => void | Promise<void>)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
  tmp.cleanup();
});

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Processes whose command line contains `needle`. */
function processesWith(needle: string): number[] {
  const out: number[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${e}/cmdline`, "utf8").replace(/\0/g, " ").includes(needle)) out.push(Number(e));
    } catch {
      // gone
    }
  }
  return out;
}

let listener: Server;
let listenerPort = 0;
let listenerHits = 0;
let etcd: ChildProcess;
let etcdPort = 0;

before(async () => {
  listener = createServer((c) => {
    listenerHits++;
    c.end("hello from the host\n");
  });
  await new Promise<void>((r) => listener.listen(0, "127.0.0.1", r));
  listenerPort = (listener.address() as { port: number }).port;
  cleanups.push(() => new Promise<void>((r) => listener.close(() => r())));
  // A real etcd member on the host's loopback, as on a worker (a dev cluster has no auth).
  etcdPort = await freePort();
  const peer = await freePort();
  const dir = join(tmp.dir, "etcd");
  etcd = spawn(
    "etcd",
    ["--name", "probe", "--data-dir", dir, "--listen-client-urls", `http://127.0.0.1:${etcdPort}`, "--advertise-client-urls", `http://127.0.0.1:${etcdPort}`, "--listen-peer-urls", `http://127.0.0.1:${peer}`, "--initial-advertise-peer-urls", `http://127.0.0.1:${peer}`, "--initial-cluster", `probe=http://127.0.0.1:${peer}`],
    { stdio: "ignore" },
  );
  cleanups.push(() => {
    etcd.kill("SIGKILL");
  });
  const deadline = Date.now() + 60_000;
  for (;;) {
    const ok = await fetch(`http://127.0.0.1:${etcdPort}/health`).then((r) => r.ok).catch(() => false);
    if (ok) break;
    if (Date.now() > deadline) throw new Error("the probe etcd did not start");
    await new Promise((r) => setTimeout(r, 200));
  }
});

/** The probes, one cmd cell each; every one exits 0 and writes what it found under probe/. */
function probes(mark: string, dataDir: string): ReturnType<typeof cmd>[] {
  const sh = (name: string, script: string) => cmd("sh", "-c", `mkdir -p probe; ( ${script} ) > probe/${name}.txt 2>&1; true`);
  const py = (name: string, code: string) => cmd("sh", "-c", `mkdir -p probe; python3 -c "$0" > probe/${name}.txt 2>&1; true`, code);
  return [
    sh("env", "env"),
    sh("procenv", "cat /proc/[0-9]*/environ | tr '\\0' '\\n'; echo; echo PROCS $(ls /proc | grep -c '^[0-9]')"),
    sh("datadir", `ls -la ${dataDir}; for f in ${dataDir}/*; do head -c 15 "$f"; echo; done`),
    sh("datawrite", `touch ${dataDir}/planted-${mark} && echo WROTE`),
    sh("outside", `touch /var/tmp/cairn-probe-${mark} && echo WROTE-VAR-TMP; touch ../outside-${mark} && echo WROTE-PARENT`),
    py("loopback", `import socket\ntry:\n  s = socket.create_connection(("127.0.0.1", ${listenerPort}), 3); print("REACHED", s.recv(100))\nexcept OSError as e:\n  print("BLOCKED", e)`),
    py(
      "etcd",
      `import urllib.request, json, base64\ntry:\n  print("REACHED", urllib.request.urlopen("http://127.0.0.1:${etcdPort}/version", timeout=3).read())\n  k = base64.b64encode(b"planted-${mark}").decode()\n  r = urllib.request.Request("http://127.0.0.1:${etcdPort}/v3/kv/put", data=json.dumps({"key": k, "value": k}).encode(), method="POST")\n  print("WROTE", urllib.request.urlopen(r, timeout=3).read())\nexcept OSError as e:\n  print("BLOCKED", e)`,
    ),
    sh("leftovers", `setsid sleep 30${mark.length}1${mark} > /dev/null 2>&1 & ( sleep 30${mark.length}2${mark} > /dev/null 2>&1 & ) ; echo STARTED`),
    sh("symlink", `for d in /tmp/cairn-*/scripts/*/; do ln -s /etc/hostname "$d/cell-11-aaaaaaaaaaaa.py" && echo PLANTED "$d"; done; echo TRIED`),
  ];
}

interface ProbeRun {
  readonly ws: string;
  readonly dataDir: string;
  readonly mark: string;
  readonly code: number | null;
  readonly stderr: string;
  readonly found: (name: string) => string;
  readonly status: { sessions: { executions: { cell_id: number; result: string | null; detail: string | null; sandbox?: string; network?: string }[]; sandbox?: unknown }[] };
  readonly log: string;
}

async function probeRun(mode: "default" | "none"): Promise<ProbeRun> {
  const mark = `${mode === "none" ? "9" : "7"}${process.pid % 100000}`;
  const ws = join(tmp.dir, `ws-${mode}`);
  const dataDir = join(ws, ".cairn");
  mkdirSync(ws, { recursive: true });
  // One round adds every probe, then a script cell printing its own marker (after the symlink probe),
  // a bounded fork bomb and a cell allocating past the memory limit; later rounds wait (a note) until
  // nothing is queued or running, then conclude. A fake OpenAI-compatible server plays the model, so
  // the harness is a real `cairn run` process with the secrets in its own environment.
  const forkBomb = cmd("python3", "-c", "import os, time\nn = 0\ntry:\n  while n < 1000:\n    pid = os.fork()\n    if pid == 0:\n      time.sleep(30); os._exit(0)\n    n += 1\nexcept OSError as e:\n  print('fork refused after', n, e)\nprint('forked', n)");
  const memory = cmd("python3", "-c", "b = bytearray(400 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated 400 MiB')");
  const script = { kind: "script", source: `# /// script\n# dependencies = []\n# ///\nprint("MARK-${mark}-OWN")\n` } as never;
  const cells = [...probes(mark, dataDir), script, forkBomb, memory];
  const model = await startFakeOpenAI((req) => {
    const state = req.state as { revision: number; runtime: { next_cell_id: number; cells: Record<string, { phase: string }> } };
    if (state.revision === 0) return adds(0, 1, cells);
    const busy = Object.values(state.runtime.cells).some((c) => c.phase === "queued" || c.phase === "started");
    return adds(state.revision, state.runtime.next_cell_id, [busy ? note("waiting for the probes") : conclude("success", "probed")]);
  });
  cleanups.push(() => model.close());
  const args = ["run", "probe the boundary", "--db", "probe", "--data-dir", dataDir, "--cwd", ws, "--model", "openai/fake", "--base-url", model.baseUrl, "--cell-memory", "128MiB", "--cell-processes", "64"];
  if (mode === "none") args.push("--sandbox", "none");
  const r = await cairn(args, { env: { ...SECRETS }, timeoutMs: 300_000 });
  cleanups.push(() => {
    for (const pid of [...processesWith(`sleep 30${mark.length}1${mark}`), ...processesWith(`sleep 30${mark.length}2${mark}`)]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    rmSync(`/var/tmp/cairn-probe-${mark}`, { force: true });
  });
  const status = await cairn(["status", "--db", "probe", "--data-dir", dataDir, "--json"]);
  if (status.code !== 0) throw new Error(`cairn status failed (${status.stderr.trim()}) after cairn run exited ${r.code}: ${r.stderr.slice(-2000)} ${r.stdout.slice(-2000)}`);
  const log = await cairn(["log", "--db", "probe", "--data-dir", dataDir]);
  return {
    ws,
    dataDir,
    mark,
    code: r.code,
    stderr: r.stderr,
    found: (name) => {
      const f = join(ws, "probe", `${name}.txt`);
      return existsSync(f) ? readFileSync(f, "utf8") : "";
    },
    status: JSON.parse(status.stdout) as ProbeRun["status"],
    log: log.stdout,
  };
}

describe("hostile cells, sandboxed (the default)", { skip }, () => {
  let run: ProbeRun;
  before(async () => {
    run = await probeRun("default");
  });

  test("the run itself completes, every cell recorded as sandboxed with no network", () => {
    assert.equal(run.code, 0, `${run.stderr}\n${run.log.slice(-3000)}`);
    const executions = run.status.sessions[0]!.executions;
    assert.ok(executions.length >= 10);
    for (const e of executions) {
      assert.equal(e.sandbox, "bwrap", `cell ${e.cell_id}`);
      assert.equal(e.network, "off", `cell ${e.cell_id}`);
    }
    assert.match(run.log, /sandbox bwrap, network off/);
  });

  test("no secret of the harness's environment reaches a cell: not in its own environment, not in any /proc/*/environ it can read", () => {
    const env = run.found("env");
    const procenv = run.found("procenv");
    assert.match(env, /^CAIRN_SESSION=/m, `the probe ran: ${run.log.slice(0, 4000)}`);
    for (const [k, v] of Object.entries(SECRETS)) {
      assert.ok(!env.includes(v), `${k} in the cell's environment`);
      assert.ok(!procenv.includes(v), `${k} in a /proc/*/environ the cell could read`);
    }
    const procs = Number(/PROCS (\d+)/.exec(procenv)?.[1]);
    assert.ok(procs > 0 && procs < 16, `the cell sees only its own processes (saw ${procs}; this host has ${readdirSync("/proc").filter((e) => /^\d+$/.test(e)).length})`);
  });

  test("the data dir inside the workspace is invisible: nothing read, nothing written", () => {
    assert.doesNotMatch(run.found("datadir"), /SQLite format|probe\.db/);
    assert.doesNotMatch(run.found("datawrite"), /WROTE/);
    assert.equal(existsSync(join(run.dataDir, `planted-${run.mark}`)), false);
  });

  test("nothing is written outside the workspace (a write under /tmp lands in the cell's private /tmp)", () => {
    assert.doesNotMatch(run.found("outside"), /WROTE-VAR-TMP/);
    assert.equal(existsSync(`/var/tmp/cairn-probe-${run.mark}`), false);
    assert.equal(existsSync(join(run.ws, "..", `outside-${run.mark}`)), false);
  });

  test("neither a listener on the host's loopback nor etcd is reachable; etcd holds nothing the cell wrote", async () => {
    assert.match(run.found("loopback"), /BLOCKED/);
    assert.match(run.found("etcd"), /BLOCKED/);
    const key = Buffer.from(`planted-${run.mark}`).toString("base64");
    const got = (await (await fetch(`http://127.0.0.1:${etcdPort}/v3/kv/range`, { method: "POST", body: JSON.stringify({ key }) })).json()) as { count?: string };
    assert.equal(got.count ?? "0", "0");
  });

  test("a setsid child and a double-forked daemon end with their cell", () => {
    assert.match(run.found("leftovers"), /STARTED/);
    assert.deepEqual(processesWith(`sleep 30${run.mark.length}1${run.mark}`), []);
    assert.deepEqual(processesWith(`sleep 30${run.mark.length}2${run.mark}`), []);
  });

  test("a symlink cannot be planted in the scripts dir, and the next script runs its own source", () => {
    assert.doesNotMatch(run.found("symlink"), /PLANTED/);
    const executions = run.status.sessions[0]!.executions;
    const script = executions.find((e) => e.cell_id === probes(run.mark, run.dataDir).length + 1);
    assert.equal(script?.result, "success", script?.detail ?? "");
    assert.match(run.log, new RegExp(`MARK-${run.mark}-OWN`));
  });

  test("a fork bomb hits the process limit and ends; an allocation past the memory limit is killed with a sentence the model can read", () => {
    const n = probes(run.mark, run.dataDir).length;
    const executions = run.status.sessions[0]!.executions;
    const bomb = executions.find((e) => e.cell_id === n + 2);
    assert.match(run.log, /fork refused after \d+/);
    const forked = Number(/forked (\d+)/.exec(run.log)?.[1]);
    assert.ok(forked < 64, `forked ${forked} with a limit of 64 processes`);
    assert.match(bomb?.detail ?? "", /process limit 64 reached/);
    const memory = executions.find((e) => e.cell_id === n + 3);
    assert.equal(memory?.result, "error");
    assert.match(memory?.detail ?? "", /^killed: memory limit 128 MiB/);
  });
});

describe("the same probes with --sandbox none: what the sandbox prevents", { skip }, () => {
  let run: ProbeRun;
  before(async () => {
    run = await probeRun("none");
  });

  test("the run completes; its cells are recorded as not sandboxed, on the host's network", () => {
    assert.equal(run.code, 0, `${run.stderr}\n${run.log.slice(-3000)}`);
    for (const e of run.status.sessions[0]!.executions) assert.equal(e.sandbox, "none");
    assert.match(run.log, /sandbox none/);
  });

  test("the allow-list still keeps secrets out of the cell's own environment, but the harness's /proc/PID/environ is readable", () => {
    const env = run.found("env");
    for (const [k, v] of Object.entries(SECRETS)) assert.ok(!env.includes(v), `${k} in the cell's environment`);
    assert.ok(Object.values(SECRETS).some((v) => run.found("procenv").includes(v)), "without a sandbox, the harness's environment can be read through /proc");
  });

  test("without a sandbox the data dir, the world outside the workspace and the host's loopback are in reach", () => {
    assert.match(run.found("datadir"), /SQLite format/);
    assert.match(run.found("datawrite"), /WROTE/);
    assert.match(run.found("outside"), /WROTE-VAR-TMP/);
    assert.match(run.found("loopback"), /REACHED/);
    assert.match(run.found("etcd"), /REACHED/);
    assert.ok(listenerHits > 0);
  });
});

/** Each run adds one script cell printing its own marker and listing the other runs' workspaces, then ends. */
class MarkerModel implements Model {
  readonly name = "markers";
  constructor(private readonly workspaces: readonly string[]) {}

  async step(req: ModelRequest): Promise<ModelReply> {
    const s = req.state;
    if (s.revision === 0) {
      const others = this.workspaces.map((w) => JSON.stringify(w)).join(", ");
      const source = `# /// script\n# dependencies = []\n# ///\nimport os\nprint("MARK", ${JSON.stringify(s.id)})\nfor w in [${others}]:\n  if os.path.realpath(w) != os.path.realpath(os.getcwd()):\n    try:\n      seen = os.listdir(w)\n      if seen: print("SAW", w, seen)\n    except OSError:\n      pass\n`;
      return { patch: adds(0, 1, [{ kind: "script", source } as never]), usage: null };
    }
    return { patch: adds(s.revision, s.runtime.next_cell_id, [conclude("success")]), usage: null };
  }
}

describe("eight runs of one database at once", { skip }, () => {
  test("each runs its own script (never another run's) and sees none of the other runs' workspaces", { timeout: 300_000 }, async () => {
    const root = join(tmp.dir, "eight");
    const workspaces = Array.from({ length: 8 }, (_, i) => join(root, `ws-${i}`));
    for (const [i, w] of workspaces.entries()) {
      mkdirSync(w, { recursive: true });
      writeFileSync(join(w, "secret-of-run.txt"), `run ${i}\n`);
    }
    const storage = createSqliteStorage({ dataDir: join(root, "data") });
    const h = await Harness.open({ storage, name: "eight", model: new MarkerModel(workspaces), workDir: join(root, "work") });
    try {
      const ids = await Promise.all(workspaces.map((cwd) => h.start({ goal: "print your marker", cwd })));
      const outcomes = await Promise.all(ids.map((id) => h.wait(id)));
      for (const o of outcomes) assert.equal(o.result, "success", o.reason);
      for (const id of ids) {
        const ex = h.session(id)!.executions.get(1)!;
        assert.equal(ex.result, "success", ex.detail ?? "");
        assert.match(ex.output_tail, new RegExp(`^MARK ${id}$`, "m"), `run ${id} printed its own marker`);
        for (const other of ids) if (other !== id) assert.doesNotMatch(ex.output_tail, new RegExp(`^MARK ${other}$`, "m"), `run ${id} ran ${other}'s script`);
        assert.doesNotMatch(ex.output_tail, /SAW/, `run ${id} listed another run's workspace: ${ex.output_tail}`);
      }
    } finally {
      await h.close();
      await storage.close();
    }
  });
});
