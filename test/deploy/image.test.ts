/**
 * The images of deploy/, built and run with Docker (the worker from deploy/Dockerfile on the drill's
 * locally built base, chaos/drill/image.ts; the roles image from deploy/etcd/Dockerfile.roles with
 * local stand-ins for its two bases, since nothing can be pulled here):
 *
 * - the worker runs as uid 10001, never root; /app is not writable; its data, work and home
 *   directories are its own;
 * - on a read-only root file system with volumes where deploy/kubernetes puts them and the settings
 *   the cell sandbox needs, `cairn serve`
 *   listening on 0.0.0.0 starts, prints a generated token once, answers its container address as Host,
 *   and refuses /metrics without the token;
 * - bubblewrap runs a cell-like sandbox (user, PID, network namespaces, a fresh /proc) as uid 10001
 *   with no capabilities and no new privileges under the settings deploy/ documents (seccomp
 *   unconfined, /proc unmasked), and cannot under Docker's defaults: why those settings are needed;
 * - the roles image runs roles.sh with only a shell and etcdctl, and turns authentication on.
 *
 * Needs a running Docker engine (as the drill): in CI (CI or CAIRN_REQUIRE_DOCKER set) its absence
 * fails the file; elsewhere the tests are skipped with the reason.
 */
import assert from "node:assert/strict";
import { execFile, execFileSync, spawnSync } from "node:child_process";
import { chmodSync, copyFileSync, mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { drillImages, type DrillImages } from "../../chaos/drill/image.js";
import { makeTestCerts, type TestCerts } from "../replicated/certs.js";
import { devCluster } from "../replicated/helpers.js";
import { until } from "../support/wait.js";
import { exitAfterTests } from "../support/exit.js";

process.env.TESTCONTAINERS_RYUK_DISABLED = "true";
const REPO = fileURLToPath(new URL("../../", import.meta.url));

function dockerProblem(): string | null {
  try {
    execFileSync("docker", ["info", "--format", "{{.ServerVersion}}"], { stdio: ["ignore", "pipe", "pipe"], timeout: 30_000 });
    return null;
  } catch (err) {
    if ((err as { code?: string }).code === "ENOENT") return "the docker client is not installed";
    return "no Docker engine answers (start dockerd)";
  }
}
const problem = dockerProblem();
if ((process.env.CI || process.env.CAIRN_REQUIRE_DOCKER) && problem !== null) throw new Error(`the image tests cannot run in CI: ${problem}`);

const docker = (...args: string[]): string => execFileSync("docker", args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 300_000, maxBuffer: 64 << 20 }).trim();
/** A container's output, stdout and stderr (`docker logs` passes each on as it was written). */
function logs(id: string): string {
  const r = spawnSync("docker", ["logs", id], { encoding: "utf8", timeout: 60_000 });
  return `${r.stdout}${r.stderr}`;
}
/** `docker ARGS` without throwing: its exit code and output. */
function dockerRun(args: string[]): Promise<{ code: number; out: string }> {
  return new Promise((resolve) =>
    execFile("docker", args, { timeout: 300_000 }, (err, stdout, stderr) => resolve({ code: err ? (typeof err.code === "number" ? err.code : -1) : 0, out: `${stdout}${stderr}` })),
  );
}

/** What deploy/kubernetes/cairn-workers.yaml asks of the container, as `docker run` flags. */
const HARDENED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"];
/** What the cell sandbox needs on top (deploy/README.md). */
const SANDBOX = ["--security-opt", "seccomp=unconfined", "--security-opt", "systempaths=unconfined"];
/** Volumes where the manifests put them. */
const VOLUMES = ["--tmpfs", "/tmp", "--tmpfs", "/work:uid=10001,gid=10001", "--tmpfs", "/var/lib/cairn:uid=10001,gid=10001", "--tmpfs", "/home/cairn:uid=10001,gid=10001"];
/** A cell-like sandbox: every namespace, a fresh /proc, the root read-only. */
const BWRAP = ["--entrypoint", "/usr/bin/bwrap"];
const BWRAP_ARGS = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "--new-session", "/usr/bin/node", "-e", "console.log(`sandboxed uid ${process.getuid()} pid ${process.pid}`)"];

describe("the images of deploy/", { skip: problem ?? false }, () => {
  let images: DrillImages;
  const containers: string[] = [];
  const work = mkdtempSync(join(tmpdir(), "cairn-image-test-"));
  before(async () => {
    images = await drillImages((l) => console.log(`# ${l}`));
  });
  after(() => {
    for (const c of containers) {
      try {
        docker("rm", "-f", c);
      } catch {
        // already gone
      }
    }
    rmSync(work, { recursive: true, force: true });
  });

  it("the worker runs as uid 10001, not root; /app is not writable; its directories are its own", () => {
    const out = docker(
      "run", "--rm", "--entrypoint", "/usr/bin/node", images.worker, "-e",
      "const fs = require('fs'); let app = 'writable'; try { fs.writeFileSync('/app/x', '') } catch (e) { app = e.code } " +
        "console.log(JSON.stringify({ uid: process.getuid(), gid: process.getgid(), cwd: process.cwd(), home: process.env.HOME, app, dirs: ['/work', '/var/lib/cairn', '/home/cairn'].map((d) => fs.statSync(d).uid) }))",
    );
    assert.deepEqual(JSON.parse(out), { uid: 10001, gid: 10001, cwd: "/work", home: "/home/cairn", app: "EACCES", dirs: [10001, 10001, 10001] });
  });

  it("cairn serve on a read-only root with volumes: starts as non-root on 0.0.0.0, prints a generated token once, refuses /metrics without it", async () => {
    const rounds = join(work, "rounds.json");
    writeFileSync(rounds, JSON.stringify({ rounds: [] }));
    chmodSync(rounds, 0o644);
    const id = docker("run", "-d", ...HARDENED, ...SANDBOX, ...VOLUMES, "-v", `${rounds}:/etc/cairn/rounds.json:ro`, images.worker, "serve", "--db", "image-test", "--create", "--model", "scripted:/etc/cairn/rounds.json", "--listen", "0.0.0.0:9464");
    containers.push(id);
    const printed = await until("serve to listen", () => {
      const l = logs(id);
      return /metrics on http:\/\/0\.0\.0\.0:9464\/metrics/.test(l) ? l : docker("inspect", "-f", "{{.State.Running}}", id) === "false" ? `EXITED\n${l}` : undefined;
    });
    assert.doesNotMatch(printed, /^EXITED/, printed);
    const token = /made one \(shown once, nowhere else\): (\S+)/.exec(printed)?.[1];
    assert.ok(token !== undefined, printed);
    assert.equal(printed.split(token).length, 2, "the token is printed once");
    const ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", id);
    const url = `http://${ip}:9464`;
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
    assert.equal((await fetch(`${url}/metrics`)).status, 401, "no token");
    assert.equal((await fetch(`${url}/metrics`, { headers: { authorization: "Bearer wrong-token-wrong-token" } })).status, 401, "a wrong token");
    const ok = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(ok.status, 200, "the container's own address is a Host it answers to");
    assert.match(await ok.text(), /cairn_worker_state/);
    assert.equal(docker("exec", id, "/usr/bin/node", "-e", "console.log(process.getuid())"), "10001");
  });

  it("bubblewrap: a sandbox with its own /proc, PID and network namespaces runs as uid 10001 under the documented settings, and not under Docker's defaults", async () => {
    const ok = await dockerRun(["run", "--rm", ...HARDENED, ...SANDBOX, "--tmpfs", "/tmp", ...BWRAP, images.worker, ...BWRAP_ARGS]);
    assert.equal(ok.code, 0, ok.out);
    assert.match(ok.out, /sandboxed uid 10001 pid [12]\b/, ok.out);
    const defaults = await dockerRun(["run", "--rm", ...HARDENED, "--tmpfs", "/tmp", ...BWRAP, images.worker, ...BWRAP_ARGS]);
    assert.notEqual(defaults.code, 0, "the default seccomp profile refuses unprivileged user namespaces");
    assert.match(defaults.out, /No permissions to create new namespace/);
    const masked = await dockerRun(["run", "--rm", ...HARDENED, "--security-opt", "seccomp=unconfined", "--tmpfs", "/tmp", ...BWRAP, images.worker, ...BWRAP_ARGS]);
    assert.notEqual(masked.code, 0, "a masked /proc makes the kernel refuse a fresh one");
    assert.match(masked.out, /Can't mount proc/);
  });

  it("the roles image runs roles.sh with only a shell and etcdctl, and turns authentication on over TLS", async () => {
    // Stand-ins for the image's two bases: etcdctl at the path of the etcd image, and the drill's base
    // for the small shell image (/bin/sh and libc).
    const etcdctl = realpathSync(execFileSync("sh", ["-c", "command -v etcdctl"], { encoding: "utf8" }).trim());
    const root = join(work, "etcd-rootfs");
    mkdirSync(join(root, "usr/local/bin"), { recursive: true });
    copyFileSync(etcdctl, join(root, "usr/local/bin/etcdctl"));
    chmodSync(join(root, "usr/local/bin/etcdctl"), 0o755);
    const tar = execFileSync("tar", ["-C", root, "-c", "."], { maxBuffer: 1 << 30 });
    execFileSync("docker", ["import", "-", "cairn-test-etcdctl:local"], { input: tar, stdio: ["pipe", "ignore", "pipe"] });
    docker("build", "-q", "-f", join(REPO, "deploy/etcd/Dockerfile.roles"), "--build-arg", "ETCD=cairn-test-etcdctl:local", "--build-arg", `BASE=${images.base}`, "-t", "cairn-test-etcd-roles:local", join(REPO, "deploy/etcd"));

    let certs: TestCerts | null = null;
    let dc: Awaited<ReturnType<typeof devCluster>> | null = null;
    try {
      certs = makeTestCerts();
      // The container's user (65532) reads copies of the client files.
      const pki = join(work, "pki");
      mkdirSync(pki);
      for (const [from, to] of [[certs.ca, "ca.crt"], [certs.clientCert, "tls.crt"], [certs.clientKey, "tls.key"]] as const) {
        copyFileSync(from, join(pki, to));
        chmodSync(join(pki, to), 0o644);
      }
      chmodSync(work, 0o755);
      chmodSync(pki, 0o755);
      dc = await devCluster({ tls: { ca: certs.ca, cert: certs.serverCert, key: certs.serverKey } });
      const env = (k: string, v: string) => ["-e", `${k}=${v}`];
      const r = await dockerRun([
        "run", "--rm", "--network", "host", ...HARDENED, "-v", `${pki}:/pki:ro`,
        ...env("ETCDCTL_ENDPOINTS", dc.cluster.endpoints.join(",")), ...env("ETCDCTL_CACERT", "/pki/ca.crt"), ...env("ETCDCTL_CERT", "/pki/tls.crt"), ...env("ETCDCTL_KEY", "/pki/tls.key"),
        ...env("ETCDCTL_COMMAND_TIMEOUT", "60s"), ...env("ETCDCTL_USER", "root:root-Pw-in-the-image-test"), ...env("CAIRN_ETCD_ENABLE_AUTH", "true"),
        ...env("CAIRN_DB", "harness-1"), ...env("CAIRN_DB_USER", "harness-1"), ...env("CAIRN_DB_PASSWORD", "h1-Pw-in-the-image-test"),
        "cairn-test-etcd-roles:local",
      ]);
      assert.equal(r.code, 0, r.out);
      assert.match(r.out, /Authentication Enabled/);
      assert.match(r.out, /User harness-1 created/);
      assert.match(r.out, /Role cairn-db-harness-1/);
    } finally {
      await dc?.stop();
      certs?.remove();
      for (const image of ["cairn-test-etcd-roles:local", "cairn-test-etcdctl:local"]) await dockerRun(["rmi", "-f", image]);
    }
  });
});

exitAfterTests("test/deploy/image.test.ts");
