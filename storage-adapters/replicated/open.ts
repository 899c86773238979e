/**
 * Opening a replicated database: check the cluster's members, check that the local copy file is
 * this database's (its id and name stamp), claim the next epoch in one transaction, then bring
 * the local copy in line with the cluster (verify, discard when diverged, catch up; a file SQLite
 * finds damaged is removed and rebuilt), and start watching.
 */
import { randomUUID } from "node:crypto";
import type { IRequestOp, IResponseOp } from "etcd3";
import { ConfigError } from "../../src/errors.js";
import { DatabaseNotFound, StorageUnavailable } from "../../src/storage/errors.js";
import { readEpochHead } from "./cluster-log.js";
import type { Context } from "./context.js";
import { ReplicatedDatabase } from "./database.js";
import { MAX_TXN_OPS, checkDatabaseName, keysOf, type Keys } from "./layout.js";
import type { LocalCopy } from "./local-copy.js";
import { ReplicatedLease, grantLease, handOverOp, leaseGone, leaseNotFound, parseLeaseRef, parseOwner, type LeaseRef, type OwnerRecord } from "./liveness.js";
import { absent, get, kvsOf, prefixEnd, put, putWithLease, valueIs, valueOf } from "./ops.js";
import { copyError, isSqliteError, ownCopy, removeCopyFiles, syncCopy, unreadableFile } from "./open-copy.js";
import { Retry } from "./retry.js";

/** `<db>/waitfor/` entries, all of them (handOver in liveness.ts: one per earlier lease, few). */
const waitForRange = (keys: Keys): IRequestOp => ({ request_range: { key: Buffer.from(keys.waitForPrefix), range_end: prefixEnd(keys.waitForPrefix) } });

/**
 * Adds to `seen` the earlier owners' leases that the owner record `record` and the `<db>/waitfor/`
 * entries `waiting` name: the record's own lease, those it was waiting for, and those handed over.
 */
function noteEarlier(seen: Map<string, LeaseRef>, record: OwnerRecord | null, waiting: readonly LeaseRef[]): void {
  const refs = record === null ? waiting : [{ lease: record.lease, host: record.host, pid: record.pid }, ...record.pending, ...waiting];
  for (const r of refs) if (!seen.has(r.lease)) seen.set(r.lease, r);
}

/** The current owner record and the `<db>/waitfor/` entries, into `seen` (see noteEarlier); returns the leases those entries name. */
async function peekOwner(ctx: Context, keys: Keys, seen: Map<string, LeaseRef>): Promise<Set<string>> {
  const res = await ctx.txn([], [get(keys.liveness), waitForRange(keys)]);
  const entries = refsOf(res.responses, 1);
  noteEarlier(seen, parseOwner(valueOf(res.responses, 0)), entries);
  return new Set(entries.map((r) => r.lease));
}

/** The `<db>/waitfor/` entries a range read at `responses[i]` returned. */
function refsOf(responses: readonly IResponseOp[], i: number): LeaseRef[] {
  return kvsOf(responses, i).flatMap((kv) => {
    const ref = parseLeaseRef(kv.value.toString("utf8"));
    return ref === null ? [] : [ref];
  });
}

/** Claim attempts before giving up (each failed attempt means another opener won that round; refusals for a lease run out count apart, MAX_REFUSALS). */
const MAX_CLAIMS = 20;

/**
 * Earlier leases a claim hands over in its own transaction (6 operations of its own; etcd takes
 * MAX_TXN_OPS). More than this, only after a pile-up of over a hundred live owners none of which saw the
 * others gone: the rest are handed over right after the claim (liveness.ts handOverNow).
 */
const MAX_HANDED_IN_CLAIM = MAX_TXN_OPS - 8;

/** Claims refused because a lease they named had run out, before an open gives up (each drops every earlier lease then reported gone, or pauses: retry.ts). */
const MAX_REFUSALS = 16;

/** A voting member and its zone. */
export interface MemberInfo {
  readonly name: string;
  readonly zone: string;
  readonly clientUrls: readonly string[];
}

/**
 * Lists the cluster's voting members and refuses a cluster of fewer than three (unless
 * allowSmallCluster), with a sentence naming how many were found. Learners do not count.
 */
export async function checkMembers(ctx: Context): Promise<MemberInfo[]> {
  let list;
  try {
    list = await ctx.call((client) => client.cluster.memberList({}), false);
  } catch (err) {
    throw ctx.fail(err, "list the members of the etcd cluster to open");
  }
  const voters = list.members.filter((m) => !m.isLearner);
  const learners = list.members.length - voters.length;
  const zoneOf = (name: string) => ctx.opts.zones?.[name] ?? name;
  const members = voters.map((m) => ({ name: m.name, zone: zoneOf(m.name), clientUrls: m.clientURLs }));
  if (voters.length < 3 && !ctx.opts.allowSmallCluster) {
    throw new ConfigError(
      `the etcd cluster at ${ctx.opts.endpoints.join(",")} has ${voters.length} voting member${voters.length === 1 ? "" : "s"}` +
        `${learners > 0 ? ` (and ${learners} learner${learners === 1 ? "" : "s"}, which do not count)` : ""}; ` +
        `the replicated adapter needs at least 3, one per zone, so that a commit is held in 2 zones. Add members, or set allowSmallCluster for development only.`,
    );
  }
  const zones = new Set(members.map((m) => m.zone));
  if (zones.size < members.length) {
    ctx.log.warn({ zones: members.map((m) => `${m.name}:${m.zone}`) }, "several etcd voting members share a zone: losing that zone may lose the quorum");
  }
  return members;
}

interface Claimed {
  epoch: number;
  head: number;
  revision: string;
  /** The database's id as the claim read it (null for one created before ids existed). */
  uid: string | null;
  /** Earlier owners' leases not known to be gone (the previous owner's, and those it was waiting for). */
  waitFor: LeaseRef[];
  /** Each of them has a `<db>/waitfor/` entry attached to it: put by the claim's transaction, or already there (read by it or by the peek just before). */
  handedOver: boolean;
}

/** The database as a read saw it: its epoch (null: absent), head, revision and id. */
type EpochHead = Awaited<ReturnType<typeof readEpochHead>>;

/**
 * Claims the next epoch of `name` (creating the database when absent, if `create`), and in the same
 * transaction records this owner's lease in `<db>/liveness`, reading the record it replaces, and hands
 * each earlier owner's lease over (see below).
 *
 * `checked` is the id the local copy was checked against (null: not checked yet, the database was
 * absent). The claim compares it in its transaction, so a database deleted and created again since
 * that check (a new id, perhaps at the same epoch) is never claimed with a copy stamped for the old
 * one; nor is one created by another opener since this open found none. Either way nothing is
 * claimed, and the caller checks the copy again against `restart` (the database as it is now).
 *
 * The hand-over: each earlier lease not already named by a `<db>/waitfor/` entry is put as one,
 * attached to that very lease (liveness.ts handOver), in the claim's transaction, so that no moment
 * exists when this owner holds the epoch and only its own record (which dies with its lease) names
 * them. etcd refuses the whole transaction when any lease it names is gone: the claim then asks which
 * (dropGone), drops an earlier owner's and claims again; its own is the caller's to grant anew.
 * Exported for the unit tests of those refusals (test/replicated/unit.test.ts).
 */
export async function claim(
  ctx: Context,
  keys: Keys,
  name: string,
  create: boolean,
  lease: string,
  first: EpochHead,
  checked: string | null,
  seen: Map<string, LeaseRef>,
  own: ReadonlySet<string>,
  gone: Set<string>,
): Promise<Claimed | { restart: EpochHead }> {
  const ttlMs = ctx.opts.livenessMs;
  // Every earlier lease this open has seen named (by any read of any attempt: a claim that landed
  // unanswered read a record this open never saw, and its lease may have run out with it since),
  // never one this open granted nor one seen gone. Waiting for a lease that is already gone costs one poll.
  const earlier = (): LeaseRef[] => [...seen.values()].filter((r) => !own.has(r.lease) && !gone.has(r.lease));
  let refusals = 0;
  const retry = new Retry();
  for (let attempt = 0; attempt < MAX_CLAIMS; attempt++) {
    const current = attempt === 0 ? first : await readEpochHead(ctx, keys);
    // An id without an epoch key (left by a partial deletion) is no database's: it is overwritten below.
    if ((current.epoch === null ? null : current.uid) !== checked) return { restart: current };
    if (current.epoch === null && !create) throw new DatabaseNotFound(name);
    // The previous record and the hand-over entries, read before they are replaced (the record is read
    // again in the same transaction). An entry lasts exactly as long as its lease: not put again.
    const entries = current.epoch === null ? new Set<string>() : await peekOwner(ctx, keys, seen);
    const handed = leasesToHandOver(earlier(), entries);
    const next = current.epoch === null ? 1 : current.epoch + 1;
    const record = putWithLease(keys.liveness, ReplicatedLease.record(next, lease, ttlMs, earlier()), lease);
    const uid = current.epoch === null ? randomUUID() : null;
    let res: Awaited<ReturnType<Context["txn"]>>;
    try {
      res =
        current.epoch === null
          ? await ctx.txn([absent(keys.epoch)], [put(keys.epoch, "1"), put(keys.head, "0"), put(keys.mseq, "0"), record, put(keys.uid, uid!), ...handed.map((r) => handOverOp(keys, r))])
          : await ctx.txn(
              [valueIs(keys.epoch, String(current.epoch)), ...(checked === null ? [] : [valueIs(keys.uid, checked)])],
              [put(keys.epoch, String(next)), get(keys.head), get(keys.liveness), record, get(keys.uid), waitForRange(keys), ...handed.map((r) => handOverOp(keys, r))],
            );
    } catch (err) {
      if (!leaseNotFound(err) || handed.length === 0) throw err;
      const which = await dropGone(ctx, lease, handed, gone);
      if (which === "own") throw err;
      // An earlier owner's lease ran out since it was read (dropped), or none is reported gone yet (the
      // member that answers lags the one that refused): the claim again, not counted as a lost round.
      if (++refusals > MAX_REFUSALS) {
        throw new StorageUnavailable(
          `cannot open database "${name}": etcd refused its claim ${refusals} times because a lease it names had run out (earlier owners' leases are ending while it claims); nothing was claimed. Retry.`,
          { cause: err },
        );
      }
      if (which === "none") await retry.pause();
      attempt--;
      continue;
    }
    if (!res.succeeded) continue;
    if (current.epoch === null) {
      // A database created again by this open (it was deleted meanwhile): the old one's owners, if this
      // open saw any, are still waited for; they see their epoch key gone and stop.
      const waitFor = earlier();
      return { epoch: 1, head: 0, revision: res.header.revision, uid, waitFor, handedOver: allHandedOver(waitFor, handed, []) };
    }
    const present = refsOf(res.responses, 5);
    noteEarlier(seen, parseOwner(valueOf(res.responses, 2)), present);
    // Handed over: by this transaction, or by entries it (or the peek just before it) read.
    const waitFor = earlier();
    return { epoch: next, head: Number(valueOf(res.responses, 1) ?? "0"), revision: res.header.revision, uid: valueOf(res.responses, 4), waitFor, handedOver: allHandedOver(waitFor, handed, [...entries, ...present.map((r) => r.lease)]) };
  }
  throw new ConfigError(`could not claim database "${name}": ${MAX_CLAIMS} other openers claimed it at the same time; is a restart loop running?`);
}

/**
 * The earlier leases a claim puts `<db>/waitfor/` entries for: those not already named by one
 * (`entries`: an entry lasts exactly as long as its lease), at most `cap` (etcd's operations limit).
 */
export function leasesToHandOver(earlier: readonly LeaseRef[], entries: ReadonlySet<string>, cap = MAX_HANDED_IN_CLAIM): LeaseRef[] {
  return earlier.filter((r) => !entries.has(r.lease)).slice(0, cap);
}

/**
 * Whether every lease the new owner waits for has an entry once its claim landed: put by the claim
 * (`handed`) or already there (`present`). False sends the open to the hand-over after the claim
 * (liveness.ts handOverNow).
 */
export function allHandedOver(waitFor: readonly LeaseRef[], handed: readonly LeaseRef[], present: Iterable<string>): boolean {
  const done = new Set([...handed.map((r) => r.lease), ...present]);
  return waitFor.every((r) => done.has(r.lease));
}

/**
 * Which lease made etcd refuse a claim as not found: this open's own (`own`: the caller grants a new
 * one), earlier owners' (`earlier`: added to `gone`), or none reported gone yet (`none`). Asked all at
 * once (LeaseTimeToLive); a cluster that does not answer throws, as the claim would have.
 */
export async function dropGone(ctx: Context, lease: string, refs: readonly LeaseRef[], gone: Set<string>): Promise<"own" | "earlier" | "none"> {
  const ttl = (id: string) => ctx.call((client) => client.leaseClient.leaseTimeToLive({ ID: id, keys: false }), false).then((res) => Number(res.TTL));
  const [mine, ...theirs] = await Promise.all([ttl(lease), ...refs.map((r) => ttl(r.lease))]);
  if (leaseGone(mine!)) return "own";
  let which: "earlier" | "none" = "none";
  refs.forEach((r, i) => {
    if (leaseGone(theirs[i]!)) {
      gone.add(r.lease);
      which = "earlier";
    }
  });
  return which;
}

/**
 * The database's id, written once: by the first opener that finds none (a database created before
 * ids existed). Every opener gets the same one.
 */
async function ensureUid(ctx: Context, keys: Keys): Promise<string> {
  const mine = randomUUID();
  const res = await ctx.txn([absent(keys.uid)], [put(keys.uid, mine)], [get(keys.uid)]);
  return res.succeeded ? mine : (valueOf(res.responses, 0) ?? mine);
}

/** Revokes a lease this open will not use (its keys, if any, go with it); a failure leaves it to its TTL. */
function revokeQuietly(ctx: Context, lease: string): void {
  void ctx.call((client) => client.leaseClient.leaseRevoke({ ID: lease })).catch(() => undefined);
}

/** How many times an open checks the local copy again because the database changed under it. */
const MAX_RECHECKS = 5;

/** Leases an open grants for one claim, each run out before the claim reached etcd, before it gives up. */
const MAX_GRANTS = 3;


/** `Storage.open` for the replicated adapter. */
export async function openReplicatedDatabase(ctx: Context, name: string, create: boolean, onClose: (db: ReplicatedDatabase) => void): Promise<ReplicatedDatabase> {
  checkDatabaseName(name);
  const keys = keysOf(name);
  let current: EpochHead;
  try {
    current = await readEpochHead(ctx, keys);
    if (current.epoch !== null && current.uid === null) current = { ...current, uid: await ensureUid(ctx, keys) };
  } catch (err) {
    throw ctx.fail(err, "open", name);
  }
  let copy: LocalCopy | null = null;
  let claimed: Claimed | null = null;
  // Errors of the local copy's check are its own (a ConfigError, StorageUnavailable, SQLite's), not etcd's.
  let local = false;
  let lease: ReplicatedLease;
  /** The earlier owners' leases any read of this open saw named, and the leases this open granted (claim). */
  const seen = new Map<string, LeaseRef>();
  const ownLeases = new Set<string>();
  /** Earlier leases etcd refused a claim for, as gone (claim). */
  const gone = new Set<string>();
  try {
    for (let check = 0; ; check++) {
      if (current.epoch === null && !create) throw new DatabaseNotFound(name);
      if (check > MAX_RECHECKS) {
        throw new StorageUnavailable(`cannot open database "${name}": it was deleted or created again ${MAX_RECHECKS} times while this open checked its local copy; retry.`);
      }
      // An existing database's copy is checked before the claim, so that a refused open fences nobody.
      // A database created by this open has nobody to fence: its copy is checked right after.
      const checked = current.epoch === null ? null : current.uid;
      local = true;
      copy = checked === null ? null : ownCopy(ctx, name, checked);
      local = false;
      await ctx.opts.faults?.("open:before-claim");
      // Granted after the copy's check, which may take a while, and anew for each claim: until the
      // claim starts its renewals the lease's TTL runs, and the owner counts its life from here.
      let grantedAt: number;
      let leaseId: string;
      let outcome: Claimed | { restart: EpochHead };
      for (let grants = 1; ; grants++) {
        grantedAt = performance.now();
        leaseId = await grantLease(ctx, ctx.opts.livenessMs);
        ownLeases.add(leaseId);
        await ctx.opts.faults?.("open:after-grant", { lease: leaseId });
        try {
          outcome = await claim(ctx, keys, name, create, leaseId, current, checked, seen, ownLeases, gone);
          break;
        } catch (err) {
          // The lease ran out before the claim reached etcd (this process was paused, or etcd was
          // slow to answer): etcd refused the whole transaction, so nothing was claimed or written.
          // A new lease, and the claim again. (An earlier owner's lease run out is claim's own to drop.)
          if (!leaseNotFound(err)) throw err;
          if (grants >= MAX_GRANTS) {
            throw new StorageUnavailable(
              `cannot open database "${name}": the lease granted for its claim ran out before the claim reached etcd, ${MAX_GRANTS} times in a row (this process is being paused, or the cluster answers too slowly for a ${Math.ceil(ctx.opts.livenessMs / 1000)} s lease); nothing was claimed. Retry, or raise the liveness lease (--liveness).`,
              { cause: err },
            );
          }
          ctx.log.warn({ db: name, lease: leaseId }, "the lease granted for the claim ran out before the claim reached etcd; nothing was claimed: claiming again with a new lease");
        }
      }
      if (!("restart" in outcome)) {
        claimed = outcome;
        lease = new ReplicatedLease(ctx, name, keys, claimed.epoch, claimed.revision, leaseId, ctx.opts.livenessMs, claimed.waitFor, grantedAt);
        break;
      }
      ctx.log.info({ db: name, checked, now: outcome.restart.uid }, "database deleted or created again while it was being opened: checking its local copy again");
      copy?.close();
      copy = null;
      // Nothing this claim wrote holds: its transactions were refused, or the database it wrote to is gone.
      revokeQuietly(ctx, leaseId);
      current = outcome.restart;
      // One made before ids existed gets its id now, so that its copy is checked before the claim too.
      if (current.epoch !== null && current.uid === null) current = { ...current, uid: await ensureUid(ctx, keys) };
    }
    await ctx.opts.faults?.("open:after-claim", { lease: lease.id });
    await lease.renewIfOld();
    lease.start();
    if (claimed.handedOver) lease.markHandedOver();
    else await lease.handOverNow();
  } catch (err) {
    // A lease granted here is left to its TTL, not revoked: the claim that failed may have landed
    // unanswered, and then the owner record attached to the lease names the earlier owners the next
    // opener must wait for.
    copy?.close();
    throw local ? copyError(ctx, name, err) : ctx.fail(err, "open", name);
  }
  try {
    const uid = copy === null ? (claimed.uid ?? (await ensureUid(ctx, keys))) : null;
    if (copy === null) {
      local = true;
      copy = ownCopy(ctx, name, uid!);
      local = false;
    }
    let lastHash: string;
    try {
      lastHash = await syncCopy(ctx, keys, name, copy, claimed.head);
    } catch (err) {
      // A copy damaged past its first pages (opening and stamping it read only those): SQLite refuses
      // its tables while it is checked or caught up. Removed and rebuilt from the cluster, once, here:
      // failing would leave every later open to claim, fence the owner and fail the same way.
      if (!unreadableFile(err)) throw err;
      ctx.log.warn({ db: name, path: copy.path, err: (err as Error).message }, "local copy damaged: removing it and rebuilding from the cluster");
      // The copy checked before the claim was checked against the id the claim compared (claimed.uid).
      const copyUid = uid ?? claimed.uid ?? (await ensureUid(ctx, keys));
      local = true;
      copy.close();
      removeCopyFiles(copy.path);
      copy = null;
      copy = ownCopy(ctx, name, copyUid);
      local = false;
      try {
        lastHash = await syncCopy(ctx, keys, name, copy, claimed.head);
      } catch (again) {
        if (!unreadableFile(again)) throw again;
        local = true;
        throw new StorageUnavailable(
          `cannot open database "${name}": its local copy ${copy.path} was damaged, and the copy rebuilt from the cluster in its place reads as damaged too (${(again as Error).message}): the disk or the file system under ${ctx.opts.dataDir} is failing. Check them (or move dataDir to another disk), then open again.`,
          { cause: again },
        );
      }
    }
    const db: ReplicatedDatabase = new ReplicatedDatabase(ctx, {
      name,
      epoch: claimed.epoch,
      keys,
      copy,
      head: claimed.head,
      lastHash,
      claimRevision: claimed.revision,
      lease,
      onClose: () => onClose(db),
    });
    await db.startWatches();
    ctx.log.info({ db: name, epoch: claimed.epoch, head: claimed.head }, "database opened");
    return db;
  } catch (err) {
    // Released as a close releases it: with earlier owners not known gone, the record naming them is
    // handed over first (liveness.ts handOver), so the next opener waits for them as this one would
    // have. First, so that a copy that fails to close cannot leave the lease renewing.
    await lease.release();
    try {
      copy?.close();
    } catch (closeErr) {
      ctx.log.warn({ db: name, err: (closeErr as Error).message }, "local copy did not close cleanly after a failed open");
    }
    throw local || isSqliteError(err) ? copyError(ctx, name, err) : ctx.fail(err, "open", name);
  }
}
