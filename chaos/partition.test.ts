/**
 * A network partition, with real processes: owner A (a child process running as `nobody`) commits in
 * a loop to a real three-member etcd cluster; iptables rules then cut A off from all three members.
 * While A is cut off (and retrying, with its quorum seen lost), B (this process, not cut off, another
 * data directory) opens the database: B claims the epoch, finds every commit A saw resolve, and
 * commits. Then the partition heals, and the contract must hold:
 *
 * - every commit A saw resolve is in the log at the seq A was told, at or below the head B found;
 * - A's commits that were waiting, and every commit it tries afterwards, are refused with
 *   ResetError {code "reset", action "stop", reason "fenced"}, and none of their events is anywhere
 *   in the log: after the point B opened, the log holds B's events only;
 * - A's `watch` reports the fence, with B's epoch (also when A commits nothing: then only the
 *   epoch watch can tell it).
 *
 * Cuts (see support/firewall.ts): `reset` refuses A's packets with a TCP reset (connections fail
 * at once); `drop` silently drops both directions of A's connections (the client only learns from
 * its deadlines, and nothing the members send reaches A either). Rules carry the comment
 * cairn-partition-<pid> and are removed in `finally`/`after` (and at process exit), even on failure.
 * Needs root and iptables; skipped otherwise.
 */
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { event, identity, type LogEvent } from "../src/state/events.js";
import type { Storage } from "../src/storage/contract.js";
import { startDevCluster, type DevCluster } from "../src/cli/devcluster/index.js";
import { createReplicatedStorage } from "../storage-adapters/replicated/index.js";
import { firewallUnavailable, partition, type CutMode, type Partition } from "./support/firewall.js";
import { stageOwner, startOwner, userIds, type OwnerLine, type OwnerProcess, type StagedOwner } from "./partition/owner-process.js";
import { OWNER_SESSION } from "./partition/protocol.js";
import { exitAfterTests } from "../test/support/exit.js";

const AT = "2025-01-02T03:04:05.678Z";
/** A must have resolved at least this many commits before the cut, or the test proves nothing. */
const MIN_RESOLVED_BEFORE_CUT = 20;
/** Commits A must see refused after it learned it is fenced ("next" commits). */
const MIN_REFUSED_AFTER_FENCE = 3;
/** Per-request deadline of A's adapter: under `drop` it is how long A waits before retrying. */
const A_COMMIT_TIMEOUT_MS = 1500;

// Under CI (root, iptables installed by .ci/run) a missing firewall is a failure, never a silent skip.
const unavailable = process.env.CI ? (firewallUnavailable() && assert.fail(`the partition test cannot run in CI: ${firewallUnavailable()}`)) : firewallUnavailable();

/** The handle stats A printed last. */
const lastStats = (lines: readonly OwnerLine[]) => lines.findLast((l) => l.t === "stats")?.stats;

const isFencedLine = (l: OwnerLine | undefined): boolean => l !== undefined && l.t === "err" && l.code === "reset" && l.action === "stop" && l.reason === "fenced";

/** Settlement (ok or err line) of each identity A submitted, and which are still unsettled. */
function ledger(lines: readonly OwnerLine[]): { submitted: string[]; settled: Map<string, OwnerLine>; pending: string[] } {
  const submitted: string[] = [];
  const settled = new Map<string, OwnerLine>();
  for (const l of lines) {
    if (l.t === "submit") submitted.push(l.id!);
    if (l.t === "ok" || l.t === "err") settled.set(l.id!, l);
  }
  return { submitted, settled, pending: submitted.filter((id) => !settled.has(id)) };
}

const bEvent = (n: number) => {
  const id = identity.inbox("b", `obs-${n}`);
  return event("inbox_received", "b", id, AT, { observation: { id: `obs-${n}`, source: "external", kind: "note", at: AT, payload: { n } } });
};

interface Scenario {
  readonly mode: CutMode;
  readonly db: string;
  /** B commits before the heal (else only after A's waiting commits settled). */
  readonly bFirst: boolean;
  /**
   * A stops calling commit before the cut, so that nothing is in flight when A is cut off, and
   * resumes right after the cut (its commits then certainly never reached the cluster before the
   * heal) or only after its watch reported the fence (then only the epoch watch can tell it).
   */
  readonly quietCut?: "resume-after-cut" | "resume-after-fence";
}

describe("partition: an owner cut off from the etcd cluster is fenced by the next opener and never appends again", { skip: unavailable ?? false }, () => {
  let root = "";
  let cluster: DevCluster | null = null;
  let fw: Partition | null = null;
  let staged: StagedOwner | null = null;
  const owners: OwnerProcess[] = [];
  const storages: Storage[] = [];
  const dispose = () => fw?.dispose();

  before(async () => {
    root = mkdtempSync(join(tmpdir(), "cairn-partition-"));
    chmodSync(root, 0o711); // nobody must reach its home below
    staged = stageOwner(join(root, "app")); // nobody may not read this checkout (a private home)
    cluster = await startDevCluster({ dir: join(root, "etcd") });
    const ports = cluster.endpoints.map((u) => Number(new URL(u).port));
    process.once("exit", dispose);
    fw = partition(userIds("nobody").uid, ports);
  });

  after(async () => {
    dispose();
    for (const o of owners) await o.stop(2_000).catch(() => undefined);
    for (const s of storages) await s.close().catch(() => undefined);
    await cluster?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
    if (fw) assert.deepEqual(fw.rules(), [], "no iptables rule of ours may be left behind");
  });

  const scenario = (sc: Scenario) => async () => {
    const { mode, db, bFirst, quietCut } = sc;
    const idle = quietCut === "resume-after-fence";
    const c = cluster!;
    const cut = fw!;
    const home = join(root, `A-${db}`);
    mkdirSync(home, { recursive: true });
    const a = startOwner(userIds("nobody"), home, { endpoints: c.endpoints, dataDir: join(home, "data"), db, workers: 3, pauseMs: 20, commitTimeoutMs: A_COMMIT_TIMEOUT_MS }, staged!);
    owners.push(a);
    const diag = () => `\nA's last lines:\n${a.lines.filter((l) => l.t !== "stats").slice(-12).map((l) => JSON.stringify(l)).join("\n")}\nA's stats: ${JSON.stringify(lastStats(a.lines))}\nA's stderr:\n${a.stderr().slice(-2000)}`;
    const wait = <T>(what: string, check: (ls: readonly OwnerLine[]) => T | undefined, ms = 120_000) =>
      a.until(what, check, ms).catch((err: Error) => {
        throw new Error(err.message + diag());
      });

    try {
      // 1. A owns the database and commits.
      const opened = await wait("A opened", (ls) => ls.find((l) => l.t === "opened"), 40_000);
      await wait(`A resolved ${MIN_RESOLVED_BEFORE_CUT} commits`, (ls) => (ls.filter((l) => l.t === "ok").length >= MIN_RESOLVED_BEFORE_CUT ? true : undefined));
      if (quietCut !== undefined) {
        a.signal("SIGUSR1");
        await wait("A paused with nothing waiting", (ls) => (ls.some((l) => l.t === "paused") && ledger(ls).pending.length === 0 ? true : undefined));
      }

      // 2. Cut A off from all three members, and keep it cut off until A has retried unanswered
      //    commit transactions (unless idle) and its health monitor has seen the quorum lost.
      const txnsAtCut = lastStats(a.lines)?.commitTxns ?? 0;
      cut.cut(mode);
      assert.equal(cut.cutRules().length, mode === "drop" ? 3 : 2, `the partition rules are in place: ${cut.rules().join(" | ")}`);
      if (quietCut === "resume-after-cut") a.signal("SIGUSR2");
      await wait("A behind the partition with the quorum lost", (ls) => {
        const st = lastStats(ls);
        if (st === undefined || st.quorumHeld !== false) return undefined;
        return idle || (ledger(ls).pending.length > 0 && st.commitTxns >= txnsAtCut + 3) ? true : undefined;
      });
      const okAtCut = a.lines.filter((l) => l.t === "ok").length;
      assert.ok(okAtCut >= MIN_RESOLVED_BEFORE_CUT, `A resolved ${okAtCut} commits before the cut`);

      // 3. B opens: claims the epoch, finds every commit A saw resolve, (maybe) commits.
      const B = createReplicatedStorage({ endpoints: c.endpoints, dataDir: join(root, `B-${db}`) });
      storages.push(B);
      const b = await B.open(db);
      assert.ok(b.epoch > opened.epoch!, `B's epoch ${b.epoch} is above A's ${opened.epoch}`);
      const headAtOpen = await b.head();
      const seenByB = await b.read();
      assert.equal(seenByB.length, headAtOpen);
      for (const r of a.lines.filter((l) => l.t === "ok")) {
        assert.ok(r.firstSeq! <= headAtOpen, `A's resolved ${r.id} at seq ${r.firstSeq} is within B's head ${headAtOpen}`);
        assert.equal(seenByB[r.firstSeq! - 1]?.identity, r.id, `B's log holds A's resolved ${r.id} at seq ${r.firstSeq}`);
      }
      const bIds: string[] = [];
      const bCommits = async (): Promise<void> => {
        assert.equal(await b.head(), headAtOpen + bIds.length, "the head moved only by B's own commits since B opened");
        for (let n = 0; n < 5; n++) {
          const receipt = await b.commit([bEvent(n)]);
          assert.equal(receipt.firstSeq, headAtOpen + n + 1, "B appends right after the head it found");
          bIds.push(bEvent(n).identity);
        }
        const batch = [bEvent(5), bEvent(6), bEvent(7)];
        await b.commit(batch);
        bIds.push(...batch.map((e) => e.identity));
      };
      if (bFirst) await bCommits();
      const pendingAtHeal = ledger(a.lines).pending;
      if (!idle) assert.ok(pendingAtHeal.length > 0, "A has commits waiting behind the partition when it heals");
      assert.equal(a.lines.filter((l) => l.t === "ok").length, okAtCut, "no commit of A resolved while it was cut off" + diag());
      const cutPackets = cut.packets();
      assert.ok(cutPackets > 0, "the partition rules matched packets of A's connections");

      // 4. Heal. A must learn it is fenced: its watch says so, its waiting commits and its next ones are refused.
      cut.heal();
      assert.deepEqual(cut.cutRules(), [], "the partition rules are gone");
      const healedAt = a.lines.length;
      const submittedAtHeal = ledger(a.lines).submitted.length;
      const signal = await wait("A's watch reports the fence", (ls) => ls.find((l) => l.t === "signal" && l.signal?.type === "fenced"), 40_000);
      if (idle) {
        assert.equal(ledger(a.lines).submitted.length, submittedAtHeal, "the fence reached idle A by its watch alone (no commit was called)");
        a.signal("SIGUSR2");
      }
      await wait("A's waiting commits settle", (ls) => (pendingAtHeal.every((id) => ledger(ls).settled.has(id)) ? true : undefined), 40_000);
      await wait(`${MIN_REFUSED_AFTER_FENCE} commits of A refused after its watch reported the fence`, (ls) => {
        const from = ls.indexOf(signal);
        const later = ls.slice(from + 1).filter((l) => l.t === "submit").map((l) => l.id!);
        const { settled } = ledger(ls);
        return later.filter((id) => settled.get(id)?.t === "err").length >= MIN_REFUSED_AFTER_FENCE ? true : undefined;
      });
      // B still owns the database and commits after the heal.
      if (!bFirst) await bCommits();
      assert.equal(await b.head(), headAtOpen + bIds.length, "the head moved only by B's own commits since B opened");
      const late = bEvent(8);
      await b.commit([late]);
      bIds.push(late.identity);
      await a.stop();

      // 5. The verdict, from the cluster itself (a fresh machine's reader) and from B.
      const probe = createReplicatedStorage({ endpoints: c.endpoints, dataDir: join(root, `probe-${db}`) });
      storages.push(probe);
      const log: LogEvent[] = await (await probe.reader(db)).read();
      assert.deepEqual(log.map((e) => e.seq), log.map((_, i) => i + 1), "the log's seqs are 1..head without gaps");
      assert.deepEqual((await b.read()).map((e) => e.identity), log.map((e) => e.identity), "B's copy is the cluster's log");
      const bySeq = new Map(log.map((e) => [e.seq, e]));
      const inLog = new Set(log.map((e) => e.identity));

      const { settled } = ledger(a.lines);
      const oks = a.lines.filter((l) => l.t === "ok");
      const errs = a.lines.filter((l) => l.t === "err");
      for (const r of oks) {
        assert.ok(r.firstSeq! <= headAtOpen, `A's receipt for ${r.id} (seq ${r.firstSeq}) is not past the head B opened at (${headAtOpen})`);
        assert.equal(bySeq.get(r.firstSeq!)?.identity, r.id, `the log holds A's resolved ${r.id} at seq ${r.firstSeq}`);
      }
      for (const e of errs) {
        assert.ok(isFencedLine(e), `every refusal A got is reset/stop/fenced, got ${JSON.stringify(e)}`);
        assert.ok(!inLog.has(e.id!), `A's refused ${e.id} is nowhere in the log`);
      }
      const afterOpen = log.filter((e) => e.seq > headAtOpen);
      assert.deepEqual(afterOpen.map((e) => e.identity), bIds, "after the point B opened the log holds B's events only, in B's order");
      assert.ok(afterOpen.every((e) => e.session !== OWNER_SESSION), "nothing of A's session after B opened");
      // A's waiting commits: refused as fenced, unless durable before B's claim (then within B's head).
      for (const id of pendingAtHeal) {
        const s = settled.get(id);
        assert.ok(isFencedLine(s) || (s?.t === "ok" && s.firstSeq! <= headAtOpen), `A's waiting commit ${id} ended as ${JSON.stringify(s)}`);
      }
      if (quietCut === "resume-after-cut") {
        // Sent only after the cut: they cannot have reached the cluster before B's claim.
        for (const id of pendingAtHeal) assert.ok(isFencedLine(settled.get(id)), `A's commit ${id}, called behind the partition, was refused as fenced: ${JSON.stringify(settled.get(id))}`);
      }
      assert.equal(signal.signal!.epoch, b.epoch, "A's watch names B's epoch");
      assert.ok(a.lines.slice(healedAt).some(isFencedLine), "A was refused after the heal");

      const waitingRefused = pendingAtHeal.filter((id) => isFencedLine(settled.get(id))).length;
      console.log(
        `partition (${mode}${quietCut ? `, quiet cut, ${quietCut}` : ""}, B commits ${bFirst ? "before" : "after"} the heal): A resolved ${okAtCut} before the cut, ` +
          `${oks.length - okAtCut} later (all within B's head ${headAtOpen}); ${cutPackets} packets ${mode === "drop" ? "dropped" : "reset"}; ` +
          `${pendingAtHeal.length} waiting at the heal (${waitingRefused} refused as fenced); ${errs.length} refusals in all; B appended ${bIds.length}; log head ${log.length}`,
      );
    } finally {
      cut.heal();
      await a.stop(2_000);
    }
  };

  it("reset: A's waiting and next commits are refused as fenced, nothing of A after B opened", scenario({ mode: "reset", db: "p", bFirst: true }));
  it("drop (both directions): the same when A's packets and the members' answers vanish", scenario({ mode: "drop", db: "p-drop", bFirst: true }));
  it("drop, A's commits called behind the partition, B commits only after the heal: they still expect the head, only the epoch guard refuses them", scenario({ mode: "drop", db: "p-quiet", bFirst: false, quietCut: "resume-after-cut" }));
  it("drop, A idle: the fence reaches A by its epoch watch alone, and its next commits are refused", scenario({ mode: "drop", db: "p-idle", bFirst: true, quietCut: "resume-after-fence" }));
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("chaos/partition.test.ts");
