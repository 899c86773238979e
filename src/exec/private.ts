/**
 * Files only this process's user can reach: directories checked to be ours and 0700 before anything
 * is written in them, files created without following links and without overwriting. A directory
 * another local user made first (a shared temp dir) or a symbolic link planted in one is refused,
 * never written through.
 */
import { chmodSync, closeSync, constants, lstatSync, mkdirSync, mkdtempSync, openSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CairnError } from "../errors.js";

const uid = (): number | null => (typeof process.getuid === "function" ? process.getuid() : null);

/**
 * Makes sure `dir` is a directory of this user's, not a symbolic link, with no access for group or
 * others: creates it (and missing parents, 0700) when absent; tightens its mode when it is ours but
 * wider. Throws a CairnError saying what is wrong otherwise.
 */
export function ensurePrivateDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const st = lstatSync(dir);
  if (st.isSymbolicLink() || !st.isDirectory()) {
    throw new CairnError("config", `${dir} must be a directory of this user's, but it is ${st.isSymbolicLink() ? "a symbolic link" : "not a directory"}; remove it or choose another directory`);
  }
  const me = uid();
  if (me !== null && st.uid !== me) {
    throw new CairnError("config", `${dir} belongs to user ${st.uid}, not to this process's user (${me}): another user could change what runs there; remove it or choose another directory`);
  }
  if ((st.mode & 0o077) !== 0) {
    // Ours, but open to others (made so by hand or by an older version): only we can fix it, so do.
    chmodSync(dir, 0o700);
    if ((lstatSync(dir).mode & 0o077) !== 0) throw new CairnError("config", `${dir} is open to other users (mode ${(st.mode & 0o777).toString(8)}) and could not be made private (0700)`);
  }
}

/**
 * A new private directory (0700, ours, a random name) under `parent` (default the OS temp dir), made
 * with mkdtemp: safe in a directory other users can write, since nobody can have made it first.
 */
export function makePrivateTempDir(prefix: string, parent: string = tmpdir()): string {
  const dir = mkdtempSync(join(parent, prefix));
  ensurePrivateDir(dir);
  return dir;
}

/**
 * Creates `path` with `data` (mode 0600): refuses when anything is already there (O_EXCL), and never
 * follows a symbolic link (O_NOFOLLOW), so a link planted by someone else cannot redirect the write.
 */
export function writeNewFile(path: string, data: string): void {
  const fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    const buf = Buffer.from(data, "utf8");
    let off = 0;
    while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
  } finally {
    closeSync(fd);
  }
}
