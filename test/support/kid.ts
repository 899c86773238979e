/**
 * Child processes for the tests of stopped (SIGSTOP) processes: spawned, read, written to, frozen
 * until every thread is stopped, and killed in an `after` hook whatever the test did.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { after } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { REPO } from "../../chaos/support/cli.js";

/** The `name` of the process warnings the sqlite adapter emits when it ends a frozen lock holder. */
export const FROZEN_LEASE_WARNING = "CairnFrozenLeaseHolder";

/** Collects the messages of this process's `CairnFrozenLeaseHolder` warnings (clear with `length = 0`). */
export function frozenLeaseWarnings(): string[] {
  const warnings: string[] = [];
  process.on("warning", (w) => {
    if (w.name === FROZEN_LEASE_WARNING) warnings.push(w.message);
  });
  return warnings;
}

export interface Kid {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Resolves once the child's stdout contains `word` (rejects if it exits first or after `ms`). */
  waitFor(word: string, ms?: number): Promise<void>;
  /** Writes one line to the child's stdin. */
  send(line: string): void;
  /** SIGSTOP, resolved once every thread is stopped. */
  freeze(): Promise<void>;
  alive(): boolean;
  out(): string;
  err(): string;
}

/** Spawns `cmd args` (a node script: see `nodeKid`), killed in an `after` hook. */
export function kid(cmd: string, args: string[]): Kid {
  const child = spawn(cmd, args, { cwd: REPO, stdio: ["pipe", "pipe", "pipe"] });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const alive = () => child.exitCode === null && child.signalCode === null;
  after(() => {
    if (alive()) {
      child.kill("SIGCONT");
      child.kill("SIGKILL");
    }
  });
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err += d));
  const pid = child.pid!;
  return {
    child,
    pid,
    exited,
    async waitFor(word, ms = 15_000) {
      const end = Date.now() + ms;
      while (!out.includes(word)) {
        if (!alive()) throw new Error(`child ${pid} exited before "${word}": ${out.slice(-500)} ${err.slice(-2000)}`);
        if (Date.now() > end) throw new Error(`child ${pid} did not say "${word}" within ${ms} ms: ${out.slice(-500)} ${err.slice(-2000)}`);
        await sleep(5);
      }
    },
    send(line) {
      child.stdin!.write(`${line}\n`);
    },
    async freeze() {
      child.kill("SIGSTOP");
      const end = Date.now() + 10_000;
      for (;;) {
        const states = readdirSync(`/proc/${pid}/task`).map((tid) => {
          const st = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
          return st[st.lastIndexOf(")") + 2];
        });
        if (states.every((s) => s === "T")) return;
        assert.ok(Date.now() < end, "hang guard: the child's threads did not all stop");
        await sleep(2);
      }
    },
    alive,
    out: () => out,
    err: () => err,
  };
}

/** A Node child running the ES module `script` (TypeScript through tsx), in the repository's root. */
export const nodeKid = (script: string): Kid => kid(process.execPath, ["--no-warnings", "--import", "tsx", "--input-type=module", "-e", script]);
