/**
 * Opening a database: read what is needed to own it (the latest snapshot's cut and the log after it),
 * claim the next epoch in the log, and read back up to the claim.
 *
 * The claim is decide-then-perform, checked by reading: the opener picks epoch E = one above every
 * epoch it has seen, appends its claim record as producer (E, 0), then reads the log until its claim.
 * Everything the previous owner appended before the claim is ordered before it (and read now); every
 * append of the previous owner after it is refused by the server (403: a stale epoch). A claim can
 * lose: another opener may have taken E first (the server then answers this one as a duplicate, 204,
 * and the claim read back carries the other's nonce), or a server that forgot the claim may have let
 * the old owner append after it (the fold voids the claim). The opener then claims again, higher.
 * Finally it appends its `opened` mark (E, 1): the server accepting that proves it holds the claim.
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { DatabaseNotFound, ResetError, StorageFailure, StorageUnavailable } from "../../src/storage/errors.js";
import { CairnError } from "../../src/errors.js";
import { appendResolving } from "./append.js";
import { DsDatabase } from "./database.js";
import { claimFrame, topEpoch } from "./fold.js";
import { DsProtocolError, DsTransportError, type Wire } from "./http.js";
import { LogView, readFailure, type Boundary } from "./log-view.js";
import { sleep } from "./mailbox.js";
import type { DsContext } from "./options.js";
import { CATALOG, claimRecord, streamsOf, type OpenedRecord } from "./records.js";
import { cutOf, loadIdentities, SnapshotIndex, type LoadedSnapshot } from "./snapshots.js";

/** How many claims an open makes before it gives up (each lost only to a racing opener or a forgetful server). */
const CLAIM_ATTEMPTS = 16;

/** Maps what opening can meet to the Storage errors. */
function openFailure(ctx: DsContext, name: string, err: unknown): CairnError {
  if (err instanceof CairnError) return err;
  if (err instanceof DsTransportError) return new StorageUnavailable(`cannot open database "${name}": the Durable Streams server at ${ctx.url} did not answer (${err.message}).`, { cause: err });
  if (err instanceof DsProtocolError) return new StorageFailure(`cannot open database "${name}" at ${ctx.url}: ${err.message}`, { cause: err });
  return readFailure(name, "opening it", err);
}

/**
 * Creates the database's streams when missing (idempotent): its name in the catalog first, the log
 * last, so a database exists exactly when its log does.
 */
export async function ensureCreated(wire: Wire, name: string): Promise<void> {
  const s = streamsOf(name);
  await wire.create(CATALOG);
  for (let attempt = 0; ; attempt++) {
    try {
      const res = await wire.append(CATALOG, JSON.stringify({ v: 1, t: "db", name }));
      if (res.kind === "appended") break;
      throw new DsProtocolError(`the catalog stream refused the name of database "${name}" (${res.kind})`);
    } catch (err) {
      if (!(err instanceof DsTransportError) || attempt >= 5) throw err;
      await sleep(100 * 2 ** attempt);
    }
  }
  for (const path of [s.snaps, s.mail, s.owners, s.log]) await wire.create(path);
}

/** Opens (and, with `create`, creates) database `name`, claiming it. */
export async function openDatabase(ctx: DsContext, name: string, create: boolean, onClose: (db: DsDatabase) => void): Promise<DsDatabase> {
  try {
    const index = new SnapshotIndex(ctx.wire, name);
    let latest = await index.latest();
    let view = latest === "missing" ? null : await caughtUpView(ctx, name, cutOf(latest));
    if (latest === "missing" || view === null) {
      if (!create) throw new DatabaseNotFound(name);
      await ensureCreated(ctx.wire, name);
      latest = await index.latest();
      if (latest === "missing") throw new StorageFailure(`database "${name}": its snapshot index is missing right after it was created.`);
      view = await caughtUpView(ctx, name, cutOf(latest));
      if (view === null) throw new StorageFailure(`database "${name}": its log is missing right after it was created.`);
    }
    const owned = view;
    const claimed = await owned.lock.run(() => claim(ctx, name, owned));
    const identities = await identitiesOf(ctx, name, latest, owned);
    const db: DsDatabase = new DsDatabase({ ctx, name, epoch: claimed.epoch, view: owned, identities, index, latest, ownersEnd: claimed.ownersEnd, onClose: () => onClose(db) });
    return db;
  } catch (err) {
    throw openFailure(ctx, name, err);
  }
}

/** A view of the log from `start`, caught up; null when the log stream does not exist (a creation that stopped half way). */
async function caughtUpView(ctx: DsContext, name: string, start: Boundary): Promise<LogView | null> {
  const view = new LogView(ctx.wire, name, streamsOf(name).log, start);
  try {
    await view.catchUp();
    return view;
  } catch (err) {
    if (err instanceof ResetError && err.reason === "deleted") return null;
    throw err;
  }
}

/** Every identity of the log: the segments before the cut, then the events read after it. */
async function identitiesOf(ctx: DsContext, name: string, latest: LoadedSnapshot | null, view: LogView): Promise<Set<string>> {
  const ids = latest === null ? new Set<string>() : await loadIdentities(ctx.wire, name, latest.body.ids, latest.entry.cut.state.head);
  for (const id of view.cachedIdentities()) ids.add(id);
  return ids;
}

/** Claims the next epoch (lock held): claim, read back, notice, opened. */
async function claim(ctx: DsContext, name: string, view: LogView): Promise<{ epoch: number; ownersEnd: string }> {
  const s = streamsOf(name);
  let hint = 0;
  for (let attempt = 0; attempt < CLAIM_ATTEMPTS; attempt++) {
    if (attempt > 0) await view.catchUpLocked();
    const epoch = Math.max(view.state.maxEpoch, hint) + 1;
    const nonce = randomBytes(8).toString("hex");
    const record = claimRecord(epoch, nonce, hostname(), process.pid, new Date().toISOString());
    const { result } = await appendResolving(ctx.wire, s.log, JSON.stringify(record), { id: ctx.producerId, epoch, seq: 0 }, ctx.outageMs);
    if (result.kind === "stale") {
      hint = Math.max(hint, result.epoch ?? epoch);
      continue;
    }
    if (result.kind === "not-found" || result.kind === "gone") throw new ResetError("stop", "deleted", `database "${name}": its log stream disappeared while it was being opened.`);
    if (result.kind !== "appended" && result.kind !== "duplicate") throw new StorageFailure(`database "${name}": the server answered a claim at epoch ${epoch} with "${result.kind}".`);
    // Read up to the claim: whatever the previous owner appended before it is counted now.
    await view.catchUpLocked();
    const mine = claimFrame(view.state, epoch);
    if (mine === undefined || mine.n !== nonce) continue;
    if (topEpoch(view.state) > epoch) throw ResetError.fenced(name, epoch, topEpoch(view.state));
    const opened: OpenedRecord = { v: 1, t: "opened", e: epoch, s: 1 };
    const [ownersEnd, mark] = await Promise.all([
      notice(ctx, name, epoch, nonce),
      appendResolving(ctx.wire, s.log, JSON.stringify(opened), { id: ctx.producerId, epoch, seq: 1 }, ctx.outageMs),
    ]);
    switch (mark.result.kind) {
      case "appended":
        try {
          view.applyOwn(opened, mark.result.next);
        } catch {
          await view.catchUpLocked();
        }
        break;
      case "duplicate":
        await view.catchUpLocked();
        break;
      case "stale":
        throw ResetError.fenced(name, epoch, mark.result.epoch);
      case "gap":
      case "epoch-unknown":
        // The server no longer holds the claim (it lost it): claim again, higher.
        continue;
      default:
        throw new StorageFailure(`database "${name}": the server answered the opened mark at epoch ${epoch} with "${mark.result.kind}".`);
    }
    const top = view.state.frames.at(-1);
    if (top === undefined || top.e !== epoch || top.t !== "opened") {
      if (topEpoch(view.state) > epoch) throw ResetError.fenced(name, epoch, topEpoch(view.state));
      continue;
    }
    return { epoch, ownersEnd };
  }
  throw new StorageUnavailable(`cannot open database "${name}": ${CLAIM_ATTEMPTS} claims in a row were taken by other openers or forgotten by the server; retry.`);
}

/** Appends this owner's notice to the owners stream (what earlier owners' watches follow); returns the offset after it. */
async function notice(ctx: DsContext, name: string, epoch: number, nonce: string): Promise<string> {
  const body = JSON.stringify({ v: 1, t: "claim", e: epoch, n: nonce });
  const deadline = Date.now() + ctx.outageMs;
  for (let attempt = 0; ; attempt++) {
    try {
      const res = await ctx.wire.append(streamsOf(name).owners, body);
      if (res.kind === "appended") return res.next;
      if (res.kind === "not-found") {
        await ctx.wire.create(streamsOf(name).owners);
        continue;
      }
      throw new StorageFailure(`database "${name}": the owners stream refused the claim notice (${res.kind}).`);
    } catch (err) {
      if (!(err instanceof DsTransportError) || Date.now() > deadline) throw err;
    }
    await sleep(Math.min(1000, 50 * 2 ** attempt));
  }
}
