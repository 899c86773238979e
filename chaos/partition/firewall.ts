/**
 * A network partition of one local user from the etcd members, with iptables OUTPUT rules (on
 * loopback every packet passes OUTPUT once, so that is where both directions are cut):
 *
 * - `reset`: the TCP packets that processes of uid `uid` send to the members' client ports on
 *   127.0.0.1 are refused with a TCP reset (A's connections fail at once, new ones are refused),
 *   and so are packets on A's marked connections (below) whose socket A already closed;
 * - `drop`: both directions vanish silently: A's packets to the members are dropped, and so are the
 *   members' packets on A's connections (recognised by a connection mark that a rule, in place from
 *   `partition()` on, sets on every connection A opens; etcd runs as root, so its own packets cannot
 *   be matched by owner). A's packets are matched both by owner (new connections) and by that mark
 *   (a connection whose socket A closed is orphaned in the kernel, has no owner, and still sends).
 *
 * Every rule carries the comment `cairn-partition-<pid of this process>`: `heal()` removes exactly
 * the cutting rules, `dispose()` all of ours, and leftovers of a crashed earlier run (whose pid no
 * longer lives) are removed by `partition()`. Rules of other live processes are never touched.
 *
 * Needs root and the `iptables` binary (Debian package `iptables`); `firewallUnavailable()` says why
 * not when they are missing.
 */
import { execFileSync } from "node:child_process";

/** How the partition fails A's packets: silently (`drop`) or with a TCP reset (`reset`: faster failure). */
export type CutMode = "drop" | "reset";

const COMMENT_PREFIX = "cairn-partition-";

function iptables(args: readonly string[]): string {
  return execFileSync("iptables", ["-w", "5", ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

/** Why iptables cannot be used here (not root, no binary, no netfilter), or null when it can. */
export function firewallUnavailable(): string | null {
  if (typeof process.getuid !== "function" || process.getuid() !== 0) return "the partition test needs root (iptables, and a child running as another uid)";
  try {
    iptables(["-S", "OUTPUT"]);
    return null;
  } catch (err) {
    return `iptables is not usable (${(err as Error).message.split("\n")[0]}); install the Debian package "iptables"`;
  }
}

/** True when a process with this pid runs (any uid). */
function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Our OUTPUT rules (as `iptables -S` prints them) whose comment's pid satisfies `which`. */
function ruleLines(which: (pid: number) => boolean): string[] {
  return iptables(["-S", "OUTPUT"])
    .split("\n")
    .filter((line) => {
      const m = new RegExp(`--comment "?${COMMENT_PREFIX}(\\d+)"?(\\s|$)`).exec(line);
      return m !== null && which(Number(m[1]));
    });
}

/** Deletes the rules `iptables -S` printed as `-A OUTPUT ...` (ours hold no quoted spaces). */
function deleteRules(lines: readonly string[]): void {
  for (const line of lines) {
    const args = line.trim().split(/\s+/).map((a) => a.replace(/^"(.*)"$/, "$1"));
    if (args[0] !== "-A") continue;
    try {
      iptables(["-D", ...args.slice(1)]);
    } catch {
      // already gone (removed twice, or by the cleanup of a concurrent run of the same leftover)
    }
  }
}

/** A partition of `uid` from TCP `ports` on 127.0.0.1. */
export interface Partition {
  /** The comment every rule of this partition carries. */
  readonly comment: string;
  /** Adds the cutting rules (removing any earlier ones first). */
  cut(mode: CutMode): void;
  /** Removes the cutting rules. Idempotent; never throws. */
  heal(): void;
  /** Removes every rule of ours (the connection mark too). Idempotent; never throws. */
  dispose(): void;
  /** Our cutting rules as `iptables -S OUTPUT` lists them now. */
  cutRules(): string[];
  /** Every rule of ours as `iptables -S OUTPUT` lists them now. */
  rules(): string[];
  /** Packets the cutting rules in place now have matched (dropped or reset). */
  packets(): number;
}

/** The connection mark of A's connections to the members. */
const MARK = "0xca1";

/**
 * Prepares a partition of the processes of `uid` from `ports`: removes stale rules of dead earlier
 * runs, and starts marking `uid`'s connections to `ports` (before the owner connects).
 */
export function partition(uid: number, ports: readonly number[]): Partition {
  const comment = `${COMMENT_PREFIX}${process.pid}`;
  deleteRules(ruleLines((pid) => pid === process.pid || !pidAlive(pid)));
  const dports = ["-m", "multiport", "--dports", ports.join(",")];
  const fromA = ["-d", "127.0.0.1/32", "-p", "tcp", "-m", "owner", "--uid-owner", String(uid), ...dports, "-m", "comment", "--comment", comment];
  const toA = ["-s", "127.0.0.1/32", "-p", "tcp", "-m", "multiport", "--sports", ports.join(","), "-m", "connmark", "--mark", MARK, "-m", "comment", "--comment", comment];
  // A's packets on connections it opened before the cut, matched by their mark rather than by owner:
  // a socket A has closed (an unanswered connection it gave up on) lives on in the kernel, orphaned,
  // still retransmitting what A wrote, and an orphan has no owner for `--uid-owner` to match. Without
  // this rule a commit A sent behind the partition, on a connection it then dropped, reached the
  // cluster during the cut (about one run in five of the resume-after-cut scenario).
  const fromAConns = ["-d", "127.0.0.1/32", "-p", "tcp", ...dports, "-m", "connmark", "--mark", MARK, "-m", "comment", "--comment", comment];
  iptables(["-I", "OUTPUT", ...fromA, "-j", "CONNMARK", "--set-mark", MARK]);
  const ours = () => ruleLines((pid) => pid === process.pid);
  const cutting = () => ours().filter((line) => !line.includes("CONNMARK"));
  const heal = () => {
    try {
      deleteRules(cutting());
    } catch {
      // iptables itself failed: reported by the test's check of cutRules() after healing
    }
  };
  return {
    comment,
    cut(mode) {
      heal();
      // At the top of the chain. A's connections were marked by their earlier packets; a connection
      // A tries to open now never gets an answer to mark.
      if (mode === "reset") {
        iptables(["-I", "OUTPUT", ...fromAConns, "-j", "REJECT", "--reject-with", "tcp-reset"]);
        iptables(["-I", "OUTPUT", ...fromA, "-j", "REJECT", "--reject-with", "tcp-reset"]);
      } else {
        iptables(["-I", "OUTPUT", ...toA, "-j", "DROP"]);
        iptables(["-I", "OUTPUT", ...fromAConns, "-j", "DROP"]);
        iptables(["-I", "OUTPUT", ...fromA, "-j", "DROP"]);
      }
    },
    heal,
    dispose() {
      try {
        deleteRules(ours());
      } catch {
        // reported by the test's check of rules()
      }
    },
    cutRules: cutting,
    rules: ours,
    packets() {
      return iptables(["-S", "OUTPUT", "-v"])
        .split("\n")
        .filter((line) => line.includes(`--comment ${comment} `) && !line.includes("CONNMARK"))
        .reduce((n, line) => n + Number(/ -c (\d+) \d+/.exec(line)?.[1] ?? 0), 0);
    },
  };
}
