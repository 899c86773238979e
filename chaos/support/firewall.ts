/**
 * The chaos tests' iptables rules, all in OUTPUT (on loopback every packet passes OUTPUT once, so that
 * is where both directions are cut), each carrying the comment `<prefix><pid>` or
 * `<prefix><pid>-<id>`, where pid is the process that added it. A helper removes only its own
 * rules, and the leftovers of crashed earlier runs (whose pid no longer lives) when it starts: rules
 * of other live processes are never touched.
 *
 * Three shapes:
 * - `partition(uid, ports)`: the processes of one local user cut off from TCP ports (the etcd
 *   members), with a TCP reset or silently in both directions (chaos/partition.test.ts,
 *   chaos/silent-zone.test.ts);
 * - `dropPorts(ports)`: every packet to and from some ports dropped, the member up but silent
 *   (chaos/silent-member.test.ts, bench/silent.ts);
 * - `firewall()`: the nemesis's numbered rules, added and healed while it runs (chaos/nemesis).
 *
 * Needs root and the `iptables` binary (Debian package `iptables`); `firewallUnavailable()` says why
 * not when they are missing.
 */
import { execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";
import { pidAlive } from "../../src/storage/pid.js";

const run = promisify(execFile);

function iptables(args: readonly string[]): string {
  return execFileSync("iptables", ["-w", "5", ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

/** Why iptables cannot be used here (not root, no binary, no netfilter), or null when it can. */
export function firewallUnavailable(): string | null {
  if (typeof process.getuid !== "function" || process.getuid() !== 0) return "the network faults need root (iptables, and processes running as another uid)";
  try {
    iptables(["-S", "OUTPUT"]);
    return null;
  } catch (err) {
    return `iptables is not usable (${(err as Error).message.split("\n")[0]}); install the Debian package "iptables"`;
  }
}

/** The OUTPUT rules (as `iptables -S` prints them) whose comment is `prefix` and a pid satisfying `which`. */
function rulesOf(prefix: string, which: (pid: number) => boolean): string[] {
  const comment = new RegExp(`--comment "?${prefix}(\\d+)(-\\d+)?"?(\\s|$)`);
  return iptables(["-S", "OUTPUT"])
    .split("\n")
    .filter((line) => {
      const m = comment.exec(line);
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

/** Removes the rules of `prefix` left by dead processes, and by this one when `mineToo`. */
function removeStale(prefix: string, mineToo: boolean): void {
  deleteRules(rulesOf(prefix, (pid) => (mineToo && pid === process.pid) || !pidAlive(pid)));
}

/** How a partition fails the cut-off packets: silently (`drop`) or with a TCP reset (`reset`: faster failure). */
export type CutMode = "drop" | "reset";

/** A partition of one uid from TCP ports on 127.0.0.1. */
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

const PARTITION = "cairn-partition-";
/** The connection mark of the partitioned user's connections to the ports. */
const MARK = "0xca1";

/**
 * Prepares a partition of the processes of `uid` (A) from `ports`, and starts marking A's connections
 * to them (before A connects). `reset`: A's packets to the ports are refused with a TCP reset (its
 * connections fail at once, new ones are refused), and so are packets on A's marked connections
 * whose socket A already closed. `drop`: both directions vanish silently: A's packets are dropped,
 * and so are the ports' packets on A's connections, recognised by the mark (the members run as
 * root, so their packets cannot be matched by owner). A's packets are matched both by owner (new
 * connections) and by that mark (a connection whose socket A closed is orphaned in the kernel, has
 * no owner, and still sends).
 */
export function partition(uid: number, ports: readonly number[]): Partition {
  const comment = `${PARTITION}${process.pid}`;
  removeStale(PARTITION, true);
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
  const ours = () => rulesOf(PARTITION, (pid) => pid === process.pid);
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

const ZONES = "cairn-zones-";

/** The port of an http(s)://host:port URL. */
export const portOf = (url: string): number => Number(new URL(url).port);

/**
 * Drops every TCP packet to and from `ports` on 127.0.0.1 (a member's client and peer ports): the
 * member is up and its connections stay open, but nothing it sends or is sent arrives. A silent
 * zone. `heal` is idempotent and never throws; `rules` lists what is still in place.
 */
export function dropPorts(ports: readonly number[]): { heal: () => void; rules: () => string[] } {
  const comment = `${ZONES}${process.pid}`;
  removeStale(ZONES, false);
  const list = ports.join(",");
  for (const dir of ["--dports", "--sports"]) {
    iptables(["-I", "OUTPUT", "-d", "127.0.0.1/32", "-p", "tcp", "-m", "multiport", dir, list, "-m", "comment", "--comment", comment, "-j", "DROP"]);
  }
  const mine = () => rulesOf(ZONES, (pid) => pid === process.pid);
  return {
    heal: () => {
      try {
        deleteRules(mine());
      } catch {
        // reported by the caller's check of rules()
      }
    },
    rules: mine,
  };
}

/** The nemesis's rules, each numbered so that it can be healed alone while others stay. */
export interface Firewall {
  /** Drops every packet to or from `ports` (a member's client and peer ports); resolves with the rule id. */
  isolatePorts(ports: readonly number[]): Promise<number>;
  /** Drops every TCP packet `uid` sends to `ports`; resolves with the rule id. */
  cutUid(uid: number, ports: readonly number[]): Promise<number>;
  /** Removes the rules of `id`. Never rejects. */
  heal(id: number): Promise<void>;
  /** Removes every rule of this process. Never throws. */
  clear(): void;
  /** Rules of this process still in place. */
  rules(): string[];
}

const NEMESIS = "cairn-nemesis-";

/**
 * The nemesis's firewall: its rules are added and removed asynchronously (iptables runs beside the
 * nemesis's other faults instead of blocking them).
 */
export function firewall(): Firewall {
  removeStale(NEMESIS, true);
  let next = 0;
  const added = new Map<number, string[][]>();
  const comment = (id: number) => ["-m", "comment", "--comment", `${NEMESIS}${process.pid}-${id}`];
  const insert = async (id: number, rules: string[][]) => {
    added.set(id, rules);
    for (const r of rules) await run("iptables", ["-w", "5", "-I", "OUTPUT", ...r]);
    return id;
  };
  return {
    isolatePorts(ports) {
      const p = ports.join(",");
      const id = ++next;
      return insert(id, [
        ["-p", "tcp", "-m", "multiport", "--dports", p, ...comment(id), "-j", "DROP"],
        ["-p", "tcp", "-m", "multiport", "--sports", p, ...comment(id), "-j", "DROP"],
      ]);
    },
    cutUid(uid, ports) {
      const id = ++next;
      return insert(id, [["-p", "tcp", "-m", "owner", "--uid-owner", String(uid), "-m", "multiport", "--dports", ports.join(","), ...comment(id), "-j", "DROP"]]);
    },
    async heal(id) {
      for (const r of added.get(id) ?? []) await run("iptables", ["-w", "5", "-D", "OUTPUT", ...r]).catch(() => undefined);
      added.delete(id);
    },
    clear() {
      try {
        deleteRules(rulesOf(NEMESIS, (pid) => pid === process.pid));
      } catch {
        // reported by rules() at the end
      }
    },
    rules: () => rulesOf(NEMESIS, (pid) => pid === process.pid),
  };
}
