/**
 * Issue 9: `cairn cluster down` then `cluster up` on the same directory comes back healthy with the
 * same members and its data; `cluster stop|start MEMBER` stops one member and brings it back (the
 * other two keep the quorum meanwhile). Run through main(argv, io), in this process.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Etcd3 } from "etcd3";
import { createServer, type Server } from "node:net";
import { main, type Io } from "../../src/cli/main.js";
import { ephemeralPortRange } from "../../src/cli/devcluster/index.js";
import { tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

function hold(port: number): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => resolve(server));
  });
}

function io(): Io & { text: () => string } {
  const lines: string[] = [];
  return { out: (l) => lines.push(l), err: (l) => lines.push(l), env: {}, text: () => lines.join("\n") };
}

describe("cairn cluster down, up, stop, start on one directory", () => {
  const dirs = tempDir("cluster-again");
  after(async () => {
    await main(["cluster", "down", "--dir", dirs.dir], io());
    dirs.remove();
  });

  it("comes back with the same members and data, and one member can be stopped and started", async () => {
    const up = io();
    assert.equal(await main(["cluster", "up", "--dir", dirs.dir, "--json"], up), 0, up.text());
    const first = JSON.parse(up.text()) as { endpoints: string[]; members: { name: string; clientUrl: string; peerUrl: string }[] };
    // Below the ephemeral range: no outgoing connection can take a member's port between down and up.
    const [low] = ephemeralPortRange();
    for (const m of first.members) {
      for (const url of [m.clientUrl, m.peerUrl]) assert.ok(Number(new URL(url).port) < low, `${url} is below the ephemeral range (${low})`);
    }
    const client = new Etcd3({ hosts: first.endpoints });
    try {
      await client.put("cairn/drill").value("kept");
    } finally {
      client.close();
    }
    assert.equal(await main(["cluster", "down", "--dir", dirs.dir], io()), 0);
    const down = io();
    assert.equal(await main(["cluster", "status", "--dir", dirs.dir], down), 4, "quorum lost while down");

    // A recorded port held by another process: refused with a sentence that names it, nothing started.
    const port = Number(new URL(first.members[1]!.clientUrl).port);
    const squatter = await hold(port);
    const refused = io();
    try {
      assert.equal(await main(["cluster", "up", "--dir", dirs.dir], refused), 2, refused.text());
    } finally {
      await new Promise<void>((r) => squatter.close(() => r()));
    }
    assert.match(refused.text(), new RegExp(`port ${port} recorded for the dev cluster in .* is taken by another process`));
    assert.equal(await main(["cluster", "status", "--dir", dirs.dir], io()), 4, "nothing was started");

    // A port held only briefly (a connection's source port, say) is waited for.
    const brief = await hold(port);
    setTimeout(() => brief.close(), 700);
    const again = io();
    assert.equal(await main(["cluster", "up", "--dir", dirs.dir, "--json"], again), 0, again.text());
    const second = JSON.parse(again.text()) as { endpoints: string[]; members: { name: string; clientUrl: string }[] };
    assert.deepEqual(second.members.map((m) => [m.name, m.clientUrl]), first.members.map((m) => [m.name, m.clientUrl]), "same members, same URLs");
    const st = io();
    assert.equal(await main(["cluster", "status", "--dir", dirs.dir], st), 0, st.text());
    const c2 = new Etcd3({ hosts: second.endpoints });
    try {
      assert.equal(await c2.get("cairn/drill").string(), "kept", "the data survived down and up");

      const member = first.members[0]!.name;
      assert.equal(await main(["cluster", "stop", member, "--dir", dirs.dir], io()), 0);
      const one = io();
      assert.equal(await main(["cluster", "status", "--dir", dirs.dir], one), 0, "two of three keep the quorum");
      assert.match(one.text(), new RegExp(`${member}: .* stopped`));
      await c2.put("cairn/drill").value("while one was down");
      assert.equal(await main(["cluster", "start", member, "--dir", dirs.dir], io()), 0);
      const end = Date.now() + 60_000;
      for (;;) {
        const s = io();
        await main(["cluster", "status", "--dir", dirs.dir], s);
        if (/quorum held \(3 of 3 reachable\)/.test(s.text())) break;
        if (Date.now() > end) assert.fail(`the restarted member never rejoined: ${s.text()}`);
        await new Promise((r) => setTimeout(r, 300));
      }
      const bad = io();
      assert.equal(await main(["cluster", "stop", "nobody", "--dir", dirs.dir], bad), 2);
      assert.match(bad.text(), /no member "nobody"/);
    } finally {
      c2.close();
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/cluster-restart.test.ts");
