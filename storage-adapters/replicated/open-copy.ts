/**
 * The local copy's part of an open (open.ts): the copy file opened and made sure to be this
 * database's (its id and name stamp, the in-use lock), then brought in line with the cluster's log
 * once the epoch is claimed; and the errors of the copy, reported as the sqlite adapter reports its
 * own file's.
 */
import { existsSync, rmSync } from "node:fs";
import { CairnError, ConfigError } from "../../src/errors.js";
import { StorageUnavailable } from "../../src/storage/errors.js";
import { forEachBatch } from "./cluster-log.js";
import type { Context } from "./context.js";
import { GENESIS_HASH, decodeBatch, type Keys } from "./layout.js";
import { LocalCopy, localCopyPath } from "./local-copy.js";
import { get, valueOf } from "./ops.js";
import { readPointer, readSegments } from "./snapshots.js";

/**
 * Brings the local copy in line with the cluster's log up to `head` (which cannot move: we own the
 * epoch). Diverged copies (a bad hash chain, a local head past the cluster's, a last batch the
 * cluster does not hold identically) are discarded and rebuilt, and that is logged. Returns the hash
 * of the last batch.
 */
export async function syncCopy(ctx: Context, keys: Keys, name: string, copy: LocalCopy, head: number): Promise<string> {
  let problem: string | null;
  try {
    problem = copy.verify();
  } catch (err) {
    problem = `the local copy cannot be read (${(err as Error).message})`;
  }
  // After a snapshot the cluster holds the batches after `cut` only (snapshots.ts).
  const { pointer } = await readPointer(ctx, keys);
  const cut = pointer?.cut ?? 0;
  const localHead = copy.head();
  if (problem === null && localHead > head) problem = `the local copy reaches seq ${localHead}, past the cluster's head ${head}`;
  const last = copy.lastBatch();
  let behind = false;
  if (problem === null && last !== null) {
    if (last.last < cut) behind = true;
    else if (last.last === cut) {
      if (last.hash !== pointer!.cutHash) problem = `the local batch at seq ${last.first} is not the cluster's`;
    } else {
      const res = await ctx.txn([], [get(keys.log(last.first))]);
      const value = valueOf(res.responses, 0);
      const cluster = value === null ? null : decodeBatch(keys.log(last.first), value);
      if (cluster === null || cluster.header.hash !== last.hash || cluster.header.last !== last.last) {
        problem = `the local batch at seq ${last.first} is not the cluster's`;
      }
    }
  }
  if (problem === null && last === null && localHead < cut) behind = true;
  if (problem !== null) {
    ctx.log.warn({ db: name, path: copy.path, problem }, "local copy diverged from the cluster: discarding it and rebuilding from the cluster");
    copy.discard();
  }
  if (cut > 0 && (problem !== null || behind)) {
    // The cluster no longer holds the batches before the cut: start the copy there, with the
    // identity segments of everything before it (exact duplicate refusal, layout.ts).
    if (behind) ctx.log.warn({ db: name, path: copy.path, localHead, cut }, "local copy ends before the cluster's compacted entries: rebuilding it from the latest snapshot (its older history stays only in archives)");
    copy.rebase(cut, pointer!.cutHash, await readSegments(ctx, keys));
  }
  const tip = copy.tip();
  const from = tip.head;
  const prevHash = from === 0 ? GENESIS_HASH : tip.hash;
  if (from < head) {
    const hash = await forEachBatch(ctx, keys, from + 1, head, prevHash, (records) => copy.append(records));
    ctx.log.info({ db: name, from, to: head }, from === 0 ? "local copy rebuilt from the cluster" : "local copy caught up with the cluster");
    return hash ?? prevHash;
  }
  return prevHash;
}

/**
 * Opens the local copy; a file SQLite says is not a database or is damaged (a power loss on a disk
 * that reorders writes, a bad sector, a stray write: a process crash cannot tear a WAL database) is
 * removed and started afresh, to be rebuilt from the cluster. Only that: a copy
 * that cannot be opened for another reason (locked by another process, a full disk, no permission) is
 * left as it is and the open fails (copyError says so), since removing it would cut another process's
 * file from under it and lose the history before the cluster's compaction cut that only the copy keeps.
 */
function openCopy(ctx: Context, name: string): LocalCopy {
  const path = localCopyPath(ctx.opts.dataDir, name);
  try {
    return new LocalCopy(path);
  } catch (err) {
    if (!existsSync(path) || !unreadableFile(err)) throw err;
    ctx.log.warn({ db: name, path, err: (err as Error).message }, "local copy unreadable: removing it and rebuilding from the cluster");
    removeCopyFiles(path);
    return new LocalCopy(path);
  }
}

/** SQLite's word for a file that is not a database, or a damaged one (SQLITE_NOTADB, SQLITE_CORRUPT and its extended codes). */
export function unreadableFile(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^SQLITE_(NOTADB|CORRUPT)/.test(code);
}

/** Removes a copy's SQLite files (not its in-use file: other processes may hold it). */
export function removeCopyFiles(path: string): void {
  for (const suffix of ["", "-wal", "-shm"]) rmSync(path + suffix, { force: true });
}

/**
 * Opens the local copy of database `name` (id `uid`) and makes sure it is this database's, and marks it
 * in use. The copy is the owner's only record of which identities the log holds (layout.ts), and its
 * file is named by the name alone, so a copy stamped for another database (another etcd cluster's,
 * one deleted and created again, or a name differing only in case on a case-insensitive file system)
 * is taken over (emptied, to be rebuilt from the cluster: it diverged) only when no process has it
 * open; while one does, the open is refused, since that owner may be running on another cluster.
 *
 * The in-use lock is taken BEFORE the stamp is read, and a take-over needs the exclusive lock, so a
 * copy whose stamp an opener found to be its own cannot be taken over until that opener closes it.
 * An unstamped copy is stamped now. A copy SQLite finds damaged when stamping is started afresh, like
 * one it cannot open.
 */
export function ownCopy(ctx: Context, name: string, uid: string): LocalCopy {
  let copy = openCopy(ctx, name);
  try {
    for (let attempt = 0; attempt < 3; attempt++) {
      copy.holdInUse();
      let stamp: { uid: string; name: string };
      try {
        stamp = copy.stamp(uid, name);
      } catch (err) {
        // Only a damaged file is started afresh; a busy one (another process's long write) is not ours to remove.
        const code = String((err as { code?: unknown }).code ?? "");
        if (!code.startsWith("SQLITE_CORRUPT") && !code.startsWith("SQLITE_NOTADB")) {
          throw new StorageUnavailable(`cannot open database "${name}": its local copy ${copy.path} could not be checked (${(err as Error).message}); another process may be writing it. Retry.`, { cause: err });
        }
        copy.close();
        ctx.log.warn({ db: name, path: copy.path, err: (err as Error).message }, "local copy's stamp unreadable: removing it and rebuilding from the cluster");
        removeCopyFiles(copy.path);
        copy = new LocalCopy(copy.path);
        continue;
      }
      if (stamp.uid === uid && stamp.name === name) return copy;
      const whose = stamp.name === name ? `another database named "${name}" (id ${stamp.uid}; this one is ${uid})` : `database "${stamp.name}" (id ${stamp.uid})`;
      copy.releaseInUse();
      const current = copy;
      if (!copy.whileUnused(() => current.takeOver(uid, name))) {
        throw new ConfigError(
          `cannot open database "${name}": its local copy ${copy.path} belongs to ${whose}, and a running process has it open (its owner on another etcd cluster sharing this dataDir, or a name differing only in case on a case-insensitive file system). Give each etcd cluster its own dataDir, and never two database names that differ only in case.`,
        );
      }
      ctx.log.warn({ db: name, path: copy.path, was: stamp }, `local copy belonged to ${whose} and no process had it open: discarding it and rebuilding from the cluster`);
      // Looked at again under the in-use lock: another opener may have taken it over in between.
    }
    throw new StorageUnavailable(`cannot open database "${name}": its local copy ${copy.path} was taken over by other openers three times while this one opened it; retry.`);
  } catch (err) {
    copy.close();
    throw err;
  }
}

/**
 * Whether `err` is SQLite's (better-sqlite3 gives every one a `SQLITE_...` code) and about the file or
 * the disk, not a broken constraint (which would be a bug, and is reported as one).
 */
export function isSqliteError(err: unknown): boolean {
  const code = String((err as { code?: unknown } | null)?.code ?? "");
  return code.startsWith("SQLITE_") && !code.startsWith("SQLITE_CONSTRAINT");
}

/**
 * An error of the local copy (opening, checking or catching it up), as the sqlite adapter reports its
 * own file's: SQLite's and the file system's (a string code) become StorageUnavailable naming the copy.
 * Cairn's own errors, and anything else (a bug), pass as they are.
 */
export function copyError(ctx: Context, name: string, err: unknown): unknown {
  if (err instanceof CairnError || typeof (err as { code?: unknown } | null)?.code !== "string") return err;
  const code = (err as { code: string }).code;
  const path = localCopyPath(ctx.opts.dataDir, name);
  const what = /^SQLITE_(BUSY|LOCKED)/.test(code)
    ? "Another process holds it locked (a tool that opened the file, or a process stopped while it recovered the file): let it finish or stop it, then retry."
    : unreadableFile(err)
      ? `The file is damaged: remove it (with its -wal and -shm files) and open again; it is rebuilt from the cluster (history before the cluster's last compaction cut is then only in archives).`
      : `Check that the data directory exists, is writable and is on a local disk, and that the copy's files (${path} and its -wal and -shm files) belong to the user running Cairn.`;
  return new StorageUnavailable(`cannot open database "${name}": its local copy ${path} could not be opened or written (${(err as Error).message}). ${what}`, { cause: err });
}
