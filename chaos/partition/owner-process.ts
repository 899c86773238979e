/**
 * Starts owner.ts as a child process running as an unprivileged uid, collects its JSON lines, and
 * stops it. The child gets its own HOME and TMPDIR (tsx keeps its cache under TMPDIR) owned by that
 * uid, and runs from a world-readable copy of what it needs (`stageOwner`, see stage.ts), so the
 * checkout itself may be private.
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { chownSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { OwnerConfig, OwnerLine } from "./protocol.js";
import { stageForOtherUser } from "./stage.js";

export type { OwnerLine } from "./protocol.js";

const REPO = fileURLToPath(new URL("../../", import.meta.url));
const OWNER = fileURLToPath(new URL("./owner.ts", import.meta.url));

/** The owner's staged copy: its working directory and entry file. */
export interface StagedOwner {
  readonly root: string;
  readonly entry: string;
}

/** Copies owner.ts and what it needs into `dest` (which the other user must be able to traverse to). */
export function stageOwner(dest: string): StagedOwner {
  return { root: dest, entry: stageForOtherUser(REPO, OWNER, dest) };
}

/** The uid and gid of user `name` (from `id`). */
export function userIds(name: string): { uid: number; gid: number } {
  const uid = Number(execFileSync("id", ["-u", name], { encoding: "utf8" }).trim());
  const gid = Number(execFileSync("id", ["-g", name], { encoding: "utf8" }).trim());
  return { uid, gid };
}

/** A running owner process. */
export interface OwnerProcess {
  readonly pid: number;
  /** Every line printed so far, in order. */
  readonly lines: readonly OwnerLine[];
  /** Its stderr so far (for failure messages). */
  stderr(): string;
  /** Resolves with the first value `check` returns other than undefined; rejects when the child exits first or after `limitMs`. */
  until<T>(what: string, check: (lines: readonly OwnerLine[]) => T | undefined, limitMs?: number): Promise<T>;
  /** Sends `signal` (SIGUSR1 pauses new commits, SIGUSR2 resumes them). */
  signal(signal: NodeJS.Signals): void;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves when it exited. Safe to call twice. */
  stop(graceMs?: number): Promise<void>;
}

/** Starts the staged owner.ts as `user` with `config`; `home` is created and given to that user. */
export function startOwner(user: { uid: number; gid: number }, home: string, config: OwnerConfig, staged: StagedOwner): OwnerProcess {
  const tmp = join(home, "tmp");
  mkdirSync(tmp, { recursive: true });
  chownSync(home, user.uid, user.gid);
  chownSync(tmp, user.uid, user.gid);
  const child: ChildProcess = spawn(process.execPath, ["--import", "tsx", staged.entry, JSON.stringify(config)], {
    cwd: staged.root,
    uid: user.uid,
    gid: user.gid,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home, TMPDIR: tmp, NODE_NO_WARNINGS: "1" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: OwnerLine[] = [];
  let err = "";
  let buf = "";
  child.stdout!.setEncoding("utf8");
  child.stdout!.on("data", (chunk: string) => {
    buf += chunk;
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const text = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (text.trim() === "") continue;
      try {
        lines.push(JSON.parse(text) as OwnerLine);
      } catch {
        err += `[unparsable stdout] ${text}\n`;
      }
    }
  });
  child.stderr!.setEncoding("utf8");
  child.stderr!.on("data", (chunk: string) => {
    err = (err + chunk).slice(-20_000);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const hasExited = () => child.exitCode !== null || child.signalCode !== null;

  return {
    pid: child.pid ?? -1,
    lines,
    stderr: () => err,
    async until(what, check, limitMs = 30_000) {
      const deadline = Date.now() + limitMs;
      for (;;) {
        const v = check(lines);
        if (v !== undefined) return v;
        if (hasExited()) throw new Error(`owner A exited (code ${child.exitCode}, signal ${child.signalCode}) before ${what}; stderr:\n${err.slice(-3000)}`);
        if (Date.now() > deadline) throw new Error(`gave up waiting ${limitMs} ms for ${what}; owner stderr:\n${err.slice(-3000)}`);
        await new Promise((r) => setTimeout(r, 25));
      }
    },
    signal(signal) {
      if (!hasExited()) child.kill(signal);
    },
    async stop(graceMs = 15_000) {
      if (hasExited()) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };
}
