/**
 * Drops every TCP packet to and from one etcd member's ports on 127.0.0.1 (its client and peer
 * ports), with iptables OUTPUT rules (on loopback every packet passes OUTPUT once): the member is up
 * and its connections stay open, but nothing it sends or is sent arrives. A silent zone.
 *
 * Rules carry the comment `cairn-zones-<pid>`; `heal()` removes ours, and rules of dead earlier runs
 * are removed first. Rules of other live processes are never touched.
 */
import { execFileSync } from "node:child_process";

const PREFIX = "cairn-zones-";

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

function ours(which: (pid: number) => boolean): string[] {
  return iptables(["-S", "OUTPUT"])
    .split("\n")
    .filter((line) => {
      const m = new RegExp(`--comment "?${PREFIX}(\\d+)"?(\\s|$)`).exec(line);
      return m !== null && which(Number(m[1]));
    });
}

function remove(lines: readonly string[]): void {
  for (const line of lines) {
    const args = line.trim().split(/\s+/).map((a) => a.replace(/^"(.*)"$/, "$1"));
    if (args[0] !== "-A") continue;
    try {
      iptables(["-D", ...args.slice(1)]);
    } catch {
      // already gone
    }
  }
}

/** The port of an http(s)://host:port URL. */
export const portOf = (url: string): number => Number(new URL(url).port);

/** Drops all traffic of `ports`. Returns `heal` (idempotent, never throws). */
export function dropPorts(ports: readonly number[]): { heal: () => void; rules: () => string[] } {
  const comment = `${PREFIX}${process.pid}`;
  remove(ours((pid) => !pidAlive(pid)));
  const list = ports.join(",");
  for (const dir of ["--dports", "--sports"]) {
    iptables(["-I", "OUTPUT", "-d", "127.0.0.1/32", "-p", "tcp", "-m", "multiport", dir, list, "-m", "comment", "--comment", comment, "-j", "DROP"]);
  }
  const mine = () => ours((pid) => pid === process.pid);
  return {
    heal: () => {
      try {
        remove(mine());
      } catch {
        // reported by the caller's check of rules()
      }
    },
    rules: mine,
  };
}
