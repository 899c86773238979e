/**
 * Process identity and survivors: /proc parsing, describeSurvivor's classification, and stopSurvivor
 * stopping a group started by another (dead) process while never signalling a recycled pid.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { copyFileSync, chmodSync, existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import {
  bootId,
  describeSurvivor,
  hostName,
  identityOf,
  processGroupOf,
  processStartTime,
  stopSurvivor,
  type ProcessIdentity,
} from "../../src/exec/identity.js";
import { liveGroupMembers, parseProcStat } from "../../src/exec/procfs.js";
import { isAlive, killGroupQuietly, tempDir, waitFor } from "./helpers.js";

const tmp = tempDir();
const groupsToClean: number[] = [];
after(() => {
  for (const g of groupsToClean) killGroupQuietly(g);
  tmp.remove();
});

/** Starts `sleep 60` detached (its own process group) from this process and returns its identity. */
function detachedSleep(file = "sleep"): ProcessIdentity {
  const child = spawn(file, ["60"], { detached: true, stdio: "ignore" });
  child.unref();
  const pid = child.pid!;
  groupsToClean.push(pid);
  const id = identityOf(pid);
  assert.ok(id !== null, "the sleep is running");
  return id;
}

describe("parsing /proc/PID/stat", () => {
  test("splits after the last ')' so a comm with spaces and parentheses parses", () => {
    const fields = Array.from({ length: 50 }, (_, i) => String(i + 3));
    fields[0] = "S"; // field 3
    fields[1] = "1"; // ppid
    fields[2] = "4242"; // pgrp
    fields[3] = "4242"; // session
    fields[19] = "987654"; // field 22
    const stat = parseProcStat(`4243 (a b) c) (d) ${fields.join(" ")}\n`);
    assert.deepEqual(stat, { pid: 4243, state: "S", ppid: 1, pgid: 4242, sid: 4242, startTime: "987654" });
    assert.equal(parseProcStat("garbage"), null);
  });

  test("processStartTime of this process matches field 22 of /proc/self/stat", () => {
    const line = readFileSync("/proc/self/stat", "utf8");
    const afterComm = line.slice(line.lastIndexOf(")") + 2).split(" ");
    assert.equal(processStartTime(process.pid), afterComm[22 - 3]);
    assert.equal(processGroupOf(process.pid), Number(afterComm[5 - 3]));
    assert.equal(bootId(), readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim());
    assert.match(bootId(), /^[0-9a-f-]{36}$/);
  });

  test("a real process whose name contains spaces and a ')' is read correctly", async () => {
    const odd = join(tmp.dir, "sl ee) p");
    copyFileSync("/bin/sleep", odd);
    chmodSync(odd, 0o755);
    const id = detachedSleep(odd);
    assert.equal(readFileSync(`/proc/${id.pid}/comm`, "utf8").trim(), "sl ee) p");
    assert.equal(id.pgid, id.pid);
    assert.match(id.start_time, /^\d+$/);
    assert.deepEqual(liveGroupMembers(id.pgid), [id.pid]);
    killGroupQuietly(id.pgid);
    await waitFor(() => !isAlive(id.pid), 10_000, "the odd sleep to exit");
  });
});

describe("describeSurvivor", () => {
  test("a live detached sleep is the same process, and its group lists it", () => {
    const id = detachedSleep();
    assert.deepEqual(describeSurvivor(id), { state: "same_process", members: [id.pid] });
  });

  test("the same pid with another start time is recycled", () => {
    const id = detachedSleep();
    const fake = { ...id, start_time: String(BigInt(id.start_time) + 1n) };
    assert.equal(describeSurvivor(fake).state, "recycled");
  });

  test("a dead pid is gone; another host or another boot cannot be checked", async () => {
    const id = detachedSleep();
    killGroupQuietly(id.pgid);
    await waitFor(() => !isAlive(id.pid), 10_000, "the sleep to exit");
    assert.deepEqual(describeSurvivor(id), { state: "gone", members: [] });
    assert.equal(describeSurvivor({ ...id, host: `${hostName()}-elsewhere` }).state, "other_host");
    assert.equal(describeSurvivor({ ...id, boot_id: "00000000-0000-0000-0000-000000000000" }).state, "other_boot");
  });
});

describe("stopSurvivor", () => {
  test("stops a detached group started by another process that was SIGKILLed", async () => {
    // A node process starts `sh -c 'sleep 60 & exec sleep 60'` in its own group, prints the identity, and is killed.
    const script = `
      const { spawn } = require("node:child_process");
      const c = spawn("/bin/sh", ["-c", "sleep 60 & exec sleep 60"], { detached: true, stdio: "ignore" });
      c.unref();
      process.stdout.write(String(c.pid) + "\\n");
      setInterval(() => {}, 1000);
    `;
    const parent = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    let pgid = 0;
    try {
      const line = await new Promise<string>((resolve, reject) => {
        let buf = "";
        parent.stdout!.on("data", (d: Buffer) => {
          buf += d.toString();
          if (buf.includes("\n")) resolve(buf.trim());
        });
        parent.once("exit", () => reject(new Error("the parent exited early")));
      });
      pgid = Number(line);
      groupsToClean.push(pgid);
      await waitFor(() => liveGroupMembers(pgid).length === 2, 10_000, "both sleeps");
      const id = identityOf(pgid)!;
      parent.kill("SIGKILL");
      await new Promise((r) => parent.once("exit", r));
      assert.equal(describeSurvivor(id).state, "same_process", "the group survived its parent");

      const result = await stopSurvivor(id, { graceMs: 1000 });
      assert.equal(result.worker_stopped, true, result.detail);
      assert.deepEqual(liveGroupMembers(pgid), []);
      assert.equal(isAlive(id.pid), false);
      assert.match(result.detail, /SIGTERM/);
      assert.deepEqual(await stopSurvivor(id), {
        worker_stopped: true,
        detail: `not running: pid ${id.pid} has exited and no process remains in its process group ${id.pgid}`,
      });
    } finally {
      parent.kill("SIGKILL");
      if (pgid > 0) killGroupQuietly(pgid);
    }
  });

  test("a leader that exited with members left in its group: the members are stopped", async () => {
    const child = spawn("/bin/sh", ["-c", "sleep 60 & echo $!; exit 0"], { detached: true, stdio: ["ignore", "pipe", "ignore"] });
    const pgid = child.pid!;
    groupsToClean.push(pgid);
    const leader = identityOf(pgid)!;
    const bg = await new Promise<number>((resolve) => child.stdout!.once("data", (d: Buffer) => resolve(Number(d.toString().trim()))));
    await new Promise((r) => child.once("exit", r));
    const found = describeSurvivor(leader);
    assert.equal(found.state, "gone");
    assert.deepEqual(found.members, [bg]);
    const result = await stopSurvivor(leader, { graceMs: 1000 });
    assert.equal(result.worker_stopped, true, result.detail);
    assert.equal(isAlive(bg), false);
  });

  test("a recycled pid is never signalled and the result is worker_stopped false", async () => {
    const id = detachedSleep();
    const fake = { ...id, start_time: String(BigInt(id.start_time) - 1n) };
    const result = await stopSurvivor(fake, { graceMs: 100 });
    assert.equal(result.worker_stopped, false);
    assert.match(result.detail, /reused by another process/);
    assert.match(result.detail, /could not be confirmed stopped/);
    assert.equal(isAlive(id.pid), true, "the unrelated live process was not signalled");
    assert.equal(processStartTime(id.pid), id.start_time);
    killGroupQuietly(id.pgid);
  });

  test("other boot is stopped (the machine restarted); other host is not", async () => {
    const id = detachedSleep();
    const otherBoot = await stopSurvivor({ ...id, boot_id: "00000000-0000-0000-0000-000000000000" });
    assert.equal(otherBoot.worker_stopped, true);
    assert.match(otherBoot.detail, /restarted/);
    const otherHost = await stopSurvivor({ ...id, host: "elsewhere.invalid" });
    assert.equal(otherHost.worker_stopped, false);
    assert.match(otherHost.detail, /elsewhere\.invalid/);
    assert.equal(isAlive(id.pid), true, "neither case signalled a local process");
    killGroupQuietly(id.pgid);
  });
});

describe("liveGroupMembers", () => {
  test("a group whose only process is a zombie has no live member; once reaped, none at all (the ESRCH fast path)", async () => {
    // `sleep` (after exec) never reaps its child, which made its own group with setsid and exited: a
    // zombie alone in its group, which kill(-pgid, 0) still finds, so the /proc scan must decide.
    const parent = spawn("/bin/sh", ["-c", "setsid sh -c 'exit 0' & exec sleep 60"], { detached: true, stdio: "ignore" });
    groupsToClean.push(parent.pid!);
    try {
      let zombie = 0;
      await waitFor(
        () => {
          try {
            const children = readFileSync(`/proc/${parent.pid}/task/${parent.pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number);
            zombie = children.find((c) => parseProcStat(readFileSync(`/proc/${c}/stat`, "utf8"))?.state === "Z") ?? 0;
          } catch {
            zombie = 0;
          }
          return zombie > 0;
        },
        10_000,
        "the zombie child",
      );
      assert.doesNotThrow(() => process.kill(-zombie, 0), "the kernel still knows the zombie's group");
      assert.deepEqual(liveGroupMembers(zombie), [], "a zombie is not a live member");
      assert.deepEqual(liveGroupMembers(parent.pid!), [parent.pid], "the parent's group lists the parent");
      parent.kill("SIGKILL");
      await waitFor(() => !existsSync(`/proc/${zombie}`), 10_000, "the zombie to be reaped");
      assert.throws(() => process.kill(-zombie, 0), /ESRCH/);
      assert.deepEqual(liveGroupMembers(zombie), []);
    } finally {
      parent.kill("SIGKILL");
    }
  });
});
