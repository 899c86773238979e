import { startDevServer } from "/work/wt/ds/storage-adapters/durable-streams/devserver.js";
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
const dir = mkdtempSync("/tmp/tornexp/run-");
const server = await startDevServer({ dir });
const u = server.url + "/big";
await fetch(u, { method: "PUT", headers: { "content-type": "application/json" } });
let acked = 0, i = 0, stop = false;
const big = "x".repeat(Number(process.argv[2] ?? "2000000"));
const writer = (async () => {
  while (!stop) {
    try {
      const r = await fetch(u, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ i, big }) });
      await r.arrayBuffer();
      if (r.status === 204) acked++;
    } catch { await new Promise((r) => setTimeout(r, 20)); }
    i++;
  }
})();
function tail(): string {
  const sd = dir + "/streams/";
  const f = readdirSync(sd)[0]!;
  const b = readFileSync(sd + f);
  let p = 0, n = 0;
  while (p + 4 <= b.length) { const L = b.readUInt32BE(p); if (p + 4 + L + 1 > b.length) return `TORN after ${n} frames: claims ${L}, has ${b.length - p - 4}`; p += 4 + L + 1; n++; }
  return p === b.length ? `clean (${n} frames)` : `TORN header (${b.length - p} bytes)`;
}
let torn = 0;
for (let k = 0; k < 80; k++) {
  await new Promise((r) => setTimeout(r, 50 + Math.random() * 300));
  const before = acked;
  await server.kill();
  const t = tail();
  if (t.startsWith("TORN")) torn++;
  await server.restart();
  console.log(`kill ${k}: acked before ${before}, file ${t}`);
}
console.log(`torn tails: ${torn}`);
stop = true; await writer; await server.stop();
