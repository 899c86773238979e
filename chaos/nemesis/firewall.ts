/**
 * iptables rules of the nemesis, all in OUTPUT (loopback traffic passes it once) and all carrying the
 * comment cairn-nemesis-<pid>: dropping every packet to a member's client and peer ports, or every
 * packet the nemesis workers (running as uid `nobody`) send to some members' client ports. Rules of
 * dead earlier runs are removed at start; `clear()` removes ours (also at exit).
 */
import { execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);

const PREFIX = "cairn-nemesis-";

function iptables(args: readonly string[]): string {
  return execFileSync("iptables", ["-w", "5", ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Why the nemesis cannot use iptables here, or null when it can. */
export function firewallUnavailable(): string | null {
  if (typeof process.getuid !== "function" || process.getuid() !== 0) return "the network faults need root (iptables, and workers running as another uid)";
  try {
    iptables(["-S", "OUTPUT"]);
    return null;
  } catch (err) {
    return `iptables is not usable (${(err as Error).message.split("\n")[0]}); install the Debian package "iptables"`;
  }
}

function ours(which: (pid: number) => boolean): string[] {
  return iptables(["-S", "OUTPUT"])
    .split("\n")
    .filter((l) => {
      const m = new RegExp(`--comment "?${PREFIX}(\\d+)-\\d+"?`).exec(l);
      return m !== null && which(Number(m[1]));
    });
}

function remove(lines: readonly string[]): void {
  for (const l of lines) {
    const args = l.trim().split(/\s+/).map((a) => a.replace(/^"(.*)"$/, "$1"));
    if (args[0] !== "-A") continue;
    try {
      iptables(["-D", ...args.slice(1)]);
    } catch {
      // already gone
    }
  }
}

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

export function firewall(): Firewall {
  remove(ours((pid) => pid === process.pid || !pidAlive(pid)));
  let next = 0;
  const added = new Map<number, string[][]>();
  const comment = (id: number) => ["-m", "comment", "--comment", `${PREFIX}${process.pid}-${id}`];
  return {
    async isolatePorts(ports) {
      const id = ++next;
      const p = ports.join(",");
      const rules = [
        ["-p", "tcp", "-m", "multiport", "--dports", p, ...comment(id), "-j", "DROP"],
        ["-p", "tcp", "-m", "multiport", "--sports", p, ...comment(id), "-j", "DROP"],
      ];
      added.set(id, rules);
      for (const r of rules) await run("iptables", ["-w", "5", "-I", "OUTPUT", ...r]);
      return id;
    },
    async cutUid(uid, ports) {
      const id = ++next;
      const rules = [["-p", "tcp", "-m", "owner", "--uid-owner", String(uid), "-m", "multiport", "--dports", ports.join(","), ...comment(id), "-j", "DROP"]];
      added.set(id, rules);
      for (const r of rules) await run("iptables", ["-w", "5", "-I", "OUTPUT", ...r]);
      return id;
    },
    async heal(id) {
      for (const r of added.get(id) ?? []) await run("iptables", ["-w", "5", "-D", "OUTPUT", ...r]).catch(() => undefined);
      added.delete(id);
    },
    clear() {
      try {
        remove(ours((pid) => pid === process.pid));
      } catch {
        // reported by rules() at the end
      }
    },
    rules: () => ours((pid) => pid === process.pid),
  };
}
