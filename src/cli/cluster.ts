/**
 * `cairn cluster up|down|status`: a local three-zone etcd cluster (three members on 127.0.0.1 with
 * free ports, one per named zone) for development and tests. Not for production: see deploy/etcd.
 */
import { resolve } from "node:path";
import { flag, parse, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";

const HELP = `usage: cairn cluster up|down|status|stop MEMBER|start MEMBER [--dir DIR] [--zones a,b,c] [--auth] [--json]

  up      starts three etcd members on 127.0.0.1 (free ports; member names are the zones) in the
          background, waits until the cluster is healthy, and prints the endpoints to use with
          --storage replicated --etcd URLS (or CAIRN_ETCD_ENDPOINTS). On a DIR whose cluster was
          stopped with down, starts the same members on the same ports with their data.
  down    stops the members started from DIR (data is kept)
  stop MEMBER   stops one member (a drill: the other two keep the quorum)
  start MEMBER  starts a stopped member again; it rejoins with its data
  status  shows each member's health and whether the quorum holds
  --dir DIR       where members keep data, logs and cairn-cluster.json (default ./.cairn/cluster)
  --zones a,b,c   the zone (member) names (default zone-a,zone-b,zone-c)
  --auth          create a root user and enable authentication (the password is in cairn-cluster.json)`;

export async function clusterCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("cluster", argv, { dir: { type: "string" }, zones: { type: "string" }, auth: { type: "boolean" }, json: { type: "boolean" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  const dir = resolve(str(p, "dir") ?? "./.cairn/cluster");
  const [action, ...extra] = p.positionals;
  if (action === "stop" || action === "start") {
    const member = extra[0];
    if (member === undefined || extra.length > 1) throw new UsageError(`cairn cluster ${action} takes one member name (see \`cairn cluster status\`).`);
    const dev = await import("./devcluster/detached.js");
    if (action === "stop") {
      const did = await dev.clusterMemberStop(dir, member);
      io.out(did ? `stopped ${member}` : `${member} was not running`);
    } else {
      const did = await dev.clusterMemberStart(dir, member);
      io.out(did ? `started ${member}` : `${member} is already running`);
    }
    return EXIT.ok;
  }
  if (extra.length > 0) throw new UsageError(`cairn cluster takes one action (up, down or status), got "${p.positionals.join(" ")}".`);
  const dev = await import("./devcluster/detached.js");
  switch (action) {
    case "up": {
      const zones = str(p, "zones")?.split(",").map((z) => z.trim()).filter((z) => z !== "");
      if (zones !== undefined && zones.length !== 3) throw new UsageError(`cairn cluster up: --zones takes three names, one per member, got ${zones.length}.`);
      const state = await dev.clusterUp({ dir, ...(zones ? { zones } : {}), auth: flag(p, "auth") });
      if (flag(p, "json")) io.out(JSON.stringify({ endpoints: state.endpoints, members: state.members.map((m) => ({ name: m.name, clientUrl: m.clientUrl, peerUrl: m.peerUrl, pid: m.pid })) }));
      else {
        for (const m of state.members) io.out(`member ${m.name} (zone ${m.name}): ${m.clientUrl}, pid ${m.pid}`);
        io.out(`export CAIRN_ETCD_ENDPOINTS=${state.endpoints.join(",")}`);
      }
      return EXIT.ok;
    }
    case "down": {
      const stopped = await dev.clusterDown(dir);
      io.out(stopped.length ? `stopped ${stopped.join(", ")}` : `no running members recorded in ${dir}`);
      return EXIT.ok;
    }
    case "status": {
      const st = await dev.clusterStatus(dir);
      if (st === null) {
        io.err(`cairn: no dev cluster was started from ${dir}; start one with \`cairn cluster up --dir ${dir}\`.`);
        return EXIT.usage;
      }
      if (flag(p, "json")) io.out(JSON.stringify(st));
      else {
        for (const m of st.members) io.out(`${m.name}: ${m.clientUrl} ${m.running ? "running" : "stopped"}, ${m.reachable ? "reachable" : "unreachable"}${m.isLeader ? ", leader" : ""}`);
        io.out(`quorum ${st.quorumHeld ? "held" : "LOST"} (${st.reachable} of ${st.members.length} reachable)`);
      }
      return st.quorumHeld ? EXIT.ok : EXIT.storage;
    }
    default:
      throw new UsageError(`cairn cluster: say up, down, status, stop MEMBER or start MEMBER (see \`cairn cluster --help\`).`);
  }
}
