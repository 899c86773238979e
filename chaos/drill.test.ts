/**
 * The failover drill on real containers (testcontainers 11 on Docker; Ryuk disabled, as its image
 * cannot be pulled here). Machines and zones are containers with their own addresses on one Docker
 * network: three etcd containers (etcd-a, etcd-b, etcd-c: one per zone) and two worker machines
 * (machine-1, machine-2) from the image deploy/Dockerfile builds (chaos/drill/image.ts: every image is
 * built locally). The test is the scheduler: it runs the job (`cairn run`, then `cairn resume` after a
 * failover) on one machine; when that machine is lost it starts the job on the other; when the lost
 * machine comes back it starts nothing there (standby), and the job there, if it survived, is fenced.
 *
 * Machine faults: `docker kill`, `docker pause`, `docker network disconnect` of the owner's machine;
 * zone faults: `docker kill` / `docker pause` of an etcd container while the owner works. Each
 * failover is timed from the fault to the first `execution_started` on the new owner (read from the
 * cluster by this process) and the times are printed. The final log must be gap-free, with unique
 * identities, at most one start per cell, and the run must end in success exactly once.
 *
 * Needs a running Docker engine: .ci/run installs docker.io and starts dockerd. In CI a missing
 * engine fails the test with the reason (CI or CAIRN_REQUIRE_DOCKER set; .ci/run sets it);
 * elsewhere the test is skipped with it.
 */
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { describe, it } from "node:test";
import { GenericContainer, Network, Wait, type StartedNetwork, type StartedTestContainer } from "testcontainers";

/**
 * A worker machine whose cells can be sandboxed (deploy/README.md says what a scheduler must allow):
 * user namespaces past Docker's default seccomp profile, and a /proc bubblewrap can mount (what
 * `docker run --security-opt systempaths=unconfined` does: no masked or read-only /proc paths).
 */
class SandboxableContainer extends GenericContainer {
  constructor(image: string) {
    super(image);
    this.hostConfig.SecurityOpt = ["seccomp=unconfined"];
    this.hostConfig.MaskedPaths = [];
    this.hostConfig.ReadonlyPaths = [];
  }
}
import type { LogEvent } from "../src/state/events.js";
import type { State } from "../src/state/schema.js";
import { createReplicatedStorage } from "../storage-adapters/replicated/index.js";
import { drillImages } from "./drill/image.js";
import { startFakeOpenAI, type FakeOpenAI } from "./support/fake-openai.js";
import { exitAfterTests } from "../test/support/exit.js";

// Once the tests are done, the process is ended if it has not ended by itself (exitAfterTests, at the
// end of this file), so that a handle left open (a container client's connection) never keeps it
// running until the runner's file timeout. The file's own "still running" deadline timers are
// unref'd (see `raceDeadline`), so they never hold it open.

process.env.TESTCONTAINERS_RYUK_DISABLED = "true";

function dockerProblem(): string | null {
  try {
    execFileSync("docker", ["info", "--format", "{{.ServerVersion}}"], { stdio: ["ignore", "pipe", "pipe"], timeout: 30_000 });
    return null;
  } catch (err) {
    const e = err as { code?: string; stderr?: Buffer };
    if (e.code === "ENOENT") return "the docker client is not installed (.ci/run installs Debian's docker.io)";
    return `no Docker engine answers (${String(e.stderr ?? "").trim().split("\n")[0] || "docker info failed"}); start dockerd (.ci/run does)`;
  }
}
const problem = dockerProblem();
if ((process.env.CI || process.env.CAIRN_REQUIRE_DOCKER) && problem !== null) throw new Error(`the container drill cannot run in CI: ${problem}`);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A deadline raced against a job's exit: its timer must not keep this file's process alive once the tests are done. */
const raceDeadline = (ms: number) => new Promise<void>((r) => setTimeout(r, ms).unref());
const docker = (...args: string[]) => execFileSync("docker", args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 }).trim();
const ZONES = ["a", "b", "c"] as const;
const DB = "drill";

/** The drill's model: cells one after another until told to finish, resolving every UnknownExecution. */
function decide(state: State, finish: boolean): unknown[] {
  const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }];
  let next = state.runtime.next_cell_id;
  const add = (cell: Record<string, unknown>) => ops.push({ op: "add", path: "/cells/-", value: { id: next++, previous_id: null, ...cell } });
  const runtime = Object.entries(state.runtime.cells);
  for (const [id, rc] of runtime) {
    if (rc.result === "UnknownExecution" && rc.resolved_by === undefined && rc.unknown !== undefined) {
      add({ kind: "note", role: "resolution", target_cell_id: Number(id), evidence_refs: rc.unknown.evidence_refs, text: `cell ${id}: accepted as uncertain` });
    }
  }
  if (runtime.some(([, rc]) => rc.phase !== "finished")) add({ kind: "note", text: "waiting for the running cell" });
  else if (!finish) add({ kind: "cmd", argv: ["sh", "-c", "sleep 0.3; echo $CAIRN_CELL >> /tmp/effects"] });
  else add({ kind: "note", role: "conclusion", result: "success", text: "the drill is over" });
  return ops;
}

const pct = (xs: readonly number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

describe("container drill: machines and zones as containers, the test as the scheduler", { skip: problem ?? false }, () => {
  it("fails over on kill, pause and disconnect of the owner's machine; the returned machine stays standby", { timeout: 1_200_000 }, async () => {
    const log = (l: string) => console.log(l);
    const t0 = Date.now();
    const images = await drillImages(log);
    log(`drill: images ready after ${Date.now() - t0} ms`);
    let finish = false;
    let fake: FakeOpenAI | null = null;
    let net: StartedNetwork | null = null;
    const containers: StartedTestContainer[] = [];
    const jobs: { machine: number; exited: Promise<number | null>; code: number | null; out: string }[] = [];
    let reader: ReturnType<typeof createReplicatedStorage> | null = null;
    const faults: Record<string, number> = {};
    const count = (k: string) => (faults[k] = (faults[k] ?? 0) + 1);
    try {
      fake = await startFakeOpenAI((req) => decide(req.state as State, finish), "0.0.0.0");
      net = await new Network().start();
      const gateway = docker("network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", net.getName());
      const cluster = ZONES.map((z) => `etcd-${z}=http://etcd-${z}:2380`).join(",");
      const etcds = await Promise.all(
        ZONES.map((z) =>
          new GenericContainer(images.base)
            .withNetwork(net!)
            .withNetworkAliases(`etcd-${z}`)
            .withEntrypoint(["/usr/bin/etcd"])
            .withCommand([
              "--name", `etcd-${z}`, "--data-dir", "/tmp/etcd",
              "--listen-client-urls", "http://0.0.0.0:2379", "--advertise-client-urls", `http://etcd-${z}:2379`,
              "--listen-peer-urls", "http://0.0.0.0:2380", "--initial-advertise-peer-urls", `http://etcd-${z}:2380`,
              "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "cairn-drill",
            ])
            .withWaitStrategy(Wait.forLogMessage(/ready to serve client requests/))
            .withStartupTimeout(180_000)
            .start(),
        ),
      );
      containers.push(...etcds);
      const machines = await Promise.all(
        [1, 2].map((n) =>
          new SandboxableContainer(images.worker)
            .withNetwork(net!)
            .withNetworkAliases(`machine-${n}`)
            .withEntrypoint(["/usr/bin/node", "-e", "setInterval(() => {}, 1 << 30)"])
            .withCommand([])
            .withStartupTimeout(180_000)
            .start(),
        ),
      );
      containers.push(...machines);
      const ips = etcds.map((c) => c.getIpAddress(net!.getName()));
      log(`drill: etcd at ${ips.join(", ")}; machines ${machines.map((m) => m.getIpAddress(net!.getName())).join(", ")}; model at ${gateway}:${fake.port}`);
      reader = createReplicatedStorage({ endpoints: ips.map((ip) => `http://${ip}:2379`), dataDir: `/tmp/cairn-drill-reader-${process.pid}` });
      const readLog = async (): Promise<LogEvent[]> => {
        const r = await reader!.reader(DB);
        try {
          return await r.read(0);
        } finally {
          await r.close();
        }
      };
      const until = async <T>(what: string, f: () => Promise<T | undefined>, limitMs = 240_000): Promise<T> => {
        const deadline = Date.now() + limitMs;
        for (;;) {
          const v = await f().catch(() => undefined);
          if (v !== undefined) return v;
          if (Date.now() > deadline) throw new Error(`drill: gave up waiting for ${what} after ${limitMs} ms; jobs: ${JSON.stringify(jobs.map((j) => ({ machine: j.machine, code: j.code, out: j.out.slice(-800) })))}`);
          await sleep(100);
        }
      };

      const etcdFlag = ZONES.map((z) => `http://etcd-${z}:2379`).join(",");
      const startJob = (machine: number, command: "run" | "resume") => {
        const args = ["exec", "-e", "OPENAI_API_KEY=drill", machines[machine]!.getId(), "/usr/bin/node", "/app/cairn.mjs", command];
        if (command === "run") args.push("drill: cells until told to stop", "--cwd", "/tmp");
        args.push("--db", DB, "--storage", "replicated", "--etcd", etcdFlag, "--data-dir", "/tmp/cairn", "--model", "openai/drill", "--base-url", `http://${gateway}:${fake!.port}/v1`);
        const child = spawn("docker", args, { stdio: ["ignore", "pipe", "pipe"] });
        const job = { machine, code: null as number | null, out: "", exited: null as unknown as Promise<number | null> };
        child.stdout.setEncoding("utf8").on("data", (d: string) => (job.out = (job.out + d).slice(-4000)));
        child.stderr.setEncoding("utf8").on("data", (d: string) => (job.out = (job.out + d).slice(-4000)));
        job.exited = new Promise((resolve) => child.once("close", (code) => resolve((job.code = code))));
        jobs.push(job);
        return job;
      };
      const finishedCells = (l: readonly LogEvent[]) => l.filter((e) => e.kind === "execution_finished").length;
      // The test is the scheduler: a job that exits 4 (its storage unreachable: during a zone fault
      // under load an election can outlast the owner's 3 s liveness lease, and the owner stops, as
      // designed) is restarted on the same machine, as deploy/README.md's policy does. Exit 3 (fenced)
      // is never restarted: that would mean a returned machine took the database back.
      let restartsAfter4 = 0;
      const keepRunning = (machine: number) => {
        if (job.code !== 4) return;
        restartsAfter4++;
        log(`drill: the job on machine-${machine + 1} exited 4 (storage unreachable); restarting it there`);
        job = startJob(machine, "resume");
      };
      const progress = async (n: number, machine: number) => {
        const at = finishedCells(await readLog().catch(() => []));
        await until(`${n} more cells finished`, async () => {
          keepRunning(machine);
          return finishedCells(await readLog()) >= at + n ? true : undefined;
        });
      };

      let owner = 0;
      let job: ReturnType<typeof startJob> = startJob(owner, "run");
      await until("the run started", async () => ((await readLog()).some((e) => e.kind === "execution_started") ? true : undefined));
      const failovers: number[] = [];
      const oldExits: string[] = [];
      const scenario = ["kill", "pause", "disconnect"] as const;
      for (const [i, kind] of scenario.entries()) {
        await progress(2, owner);
        const lost = machines[owner]!;
        const other = 1 - owner;
        const head0 = (await readLog()).length;
        const t = Date.now();
        if (kind === "kill") docker("kill", lost.getId());
        if (kind === "pause") docker("pause", lost.getId());
        if (kind === "disconnect") docker("network", "disconnect", net.getName(), lost.getId());
        count(`machine-${kind}`);
        // A zone fault on top of the second failover: an etcd member (not all) goes down meanwhile.
        if (i === 1) {
          docker("kill", etcds[2]!.getId());
          count("zone-kill");
        }
        const oldJob = job;
        job = startJob(other, "resume");
        // The new owner's first cell: started on the other machine (the lost one may have started a
        // cell between the read of head0 and the fault).
        const otherHost = docker("inspect", "-f", "{{.Config.Hostname}}", machines[other]!.getId());
        await until(`the first cell on machine-${other + 1} after the ${kind}`, async () => {
          keepRunning(other);
          return (await readLog()).some((e) => e.seq > head0 && e.kind === "execution_started" && (e.body as { host: string }).host === otherHost) ? true : undefined;
        });
        failovers.push(Date.now() - t);
        log(`drill: ${kind} of machine-${owner + 1}: first new cell on machine-${other + 1} after ${Date.now() - t} ms`);
        // The lost machine returns, as standby: the scheduler starts nothing there.
        if (kind === "kill") docker("start", lost.getId());
        if (kind === "pause") docker("unpause", lost.getId());
        if (kind === "disconnect") docker("network", "connect", net.getName(), lost.getId());
        if (i === 1) {
          docker("start", etcds[2]!.getId());
          // The killed member must be back in the cluster (following a leader) before another one is
          // paused: two members out at once is a lost quorum, which the owner rightly answers by
          // letting its lease lapse and exiting 4. This drill moves one zone at a time.
          const ipC = docker("inspect", "-f", `{{(index .NetworkSettings.Networks "${net.getName()}").IPAddress}}`, etcds[2]!.getId());
          await until("etcd-c back in the cluster", async () => {
            const r = await fetch(`http://${ipC}:2379/health`, { signal: AbortSignal.timeout(2000) });
            return r.ok && ((await r.json()) as { health?: string }).health === "true" ? true : undefined;
          });
          docker("pause", etcds[0]!.getId());
          count("zone-pause");
        }
        const code = await Promise.race([oldJob.exited, raceDeadline(180_000).then(() => "still running" as const)]);
        oldExits.push(`${kind}: ${code}`);
        if (kind === "kill") assert.notEqual(code, 0, "the job on the killed machine did not end normally");
        else assert.ok(code === 3 || code === 4, `the job on the machine that came back after a ${kind} must stop (fenced: exit 3, or 4 when its storage call failed first), not go on; got ${code}\n${oldJob.out}`);
        if (i === 1) docker("unpause", etcds[0]!.getId());
        // The new owner keeps the database: it goes on making progress and was not fenced.
        await progress(2, other);
        assert.equal(job.code, null, `the job on machine-${other + 1} is still running (not fenced by the returned machine): ${job.out}`);
        owner = other;
      }
      finish = true;
      const last = await Promise.race([job.exited, raceDeadline(240_000).then(() => "still running" as const)]);
      assert.equal(last, 0, `the job ends with the run's success: ${job.out}`);

      const final = await readLog();
      assert.deepEqual(final.map((e) => e.seq), final.map((_, i) => i + 1), "seqs are 1..head");
      assert.equal(new Set(final.map((e) => e.identity)).size, final.length, "identities are unique");
      const starts = final.filter((e) => e.kind === "execution_started").map((e) => (e.body as { cell_id: number }).cell_id);
      assert.equal(new Set(starts).size, starts.length, "no cell started twice");
      const ends = final.filter((e) => e.kind === "run_ended");
      assert.equal(ends.length, 1);
      assert.equal((ends[0]!.body as { result: string }).result, "success");
      const total = Object.values(faults).reduce((a, b) => a + b, 0);
      console.log(
        `drill: ${total} faults (${Object.entries(faults).map(([k, v]) => `${k} ${v}`).join(", ")}); failover (machine lost → first cell on the other) ` +
          `p50 ${pct(failovers, 50)} ms, p90 ${pct(failovers, 90)} ms, max ${Math.max(...failovers)} ms; old jobs: ${oldExits.join(", ")}; owners restarted after exit 4: ${restartsAfter4}; ` +
          `${starts.length} cells, log head ${final.length}; drill took ${Date.now() - t0} ms`,
      );
    } finally {
      finish = true;
      await reader?.close().catch(() => undefined);
      for (const c of containers) {
        try {
          docker("rm", "-f", "-v", c.getId());
        } catch {
          // already gone
        }
      }
      await net?.stop().catch(() => undefined);
      await fake?.close();
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("chaos/drill.test.ts");
