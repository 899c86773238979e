/**
 * The commit path's own HTTP/2 connection (h2.ts), against node's HTTP/2 server (nghttp2: an
 * independent implementation that Huffman-codes and indexes what it sends) and against raw sockets
 * that break the protocol: HPACK (the Huffman code checked against RFC 7541's table, headers and
 * trailers of random content decoded exactly, the dynamic table across many answers, CONTINUATION),
 * flow control both ways (a 5 MB request to a peer with a 1,000-byte window, a 3 MB answer), the
 * peer's stream limit, PINGs both ways, broken peers failing the streams instead of hanging them, and
 * TLS (ALPN h2, the CA checked, a server that will not speak h2).
 * The wire's behaviour on etcd itself is txn-wire.test.ts and txn-wire-review.test.ts.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http2 from "node:http2";
import { readFileSync } from "node:fs";
import net from "node:net";
import tls from "node:tls";
import { after, before, describe, it } from "node:test";
import fc from "fast-check";
import { H2Connection, HUFFMAN_LENGTHS, HpackDecoder, encodeHeaders, huffmanCode, huffmanDecode, type Header } from "../../storage-adapters/replicated/h2.js";
import { exitAfterTests } from "../support/exit.js";
import { makeTestCerts, type TestCerts } from "./certs.js";

/** One HTTP/2 frame, as a peer would write it. */
function frameOf(type: number, flags: number, id: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(id, 5);
  return Buffer.concat([h, payload]);
}

interface Answer {
  readonly blocks: (readonly Header[])[];
  readonly data: Buffer;
}

/** One request on `conn`, to its end (or its failure, rejected). */
function call(conn: H2Connection, path: string, body: Buffer, extra: Header[] = []): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const blocks: (readonly Header[])[] = [];
    const data: Buffer[] = [];
    conn.request(
      encodeHeaders([[":method", "POST"], [":scheme", "http"], [":path", path], [":authority", conn.url.host], ...extra]),
      body,
      {
        onHeaders: (f) => blocks.push(f),
        onData: (c) => data.push(Buffer.from(c)),
        onEnd: () => resolve({ blocks, data: Buffer.concat(data) }),
        onFail: reject,
      },
    );
  });
}

const field = (h: readonly Header[], name: string): string | undefined => h.find(([n]) => n === name)?.[1];

/** Our own Huffman encoder for the round trip, from the code the decoder derives. */
function huffmanEncode(s: Buffer): Buffer {
  const bits: number[] = [];
  for (const c of s) {
    const len = HUFFMAN_LENGTHS[c]!;
    const code = huffmanCode(c);
    for (let i = len - 1; i >= 0; i--) bits.push(Math.floor(code / 2 ** i) % 2);
  }
  while (bits.length % 8 !== 0) bits.push(1);
  const out = Buffer.alloc(bits.length / 8);
  bits.forEach((b, i) => {
    if (b) out[i >> 3]! |= 0x80 >> (i & 7);
  });
  return out;
}

describe("HPACK", () => {
  it("the Huffman code lengths make a complete prefix code, and the derived codes are RFC 7541's", () => {
    assert.equal(HUFFMAN_LENGTHS.length, 257);
    // Kraft: a complete prefix code sums to exactly 1 (in units of 2^-30).
    assert.equal(HUFFMAN_LENGTHS.reduce((a, l) => a + 2 ** (30 - l), 0), 2 ** 30);
    // Codes as RFC 7541 Appendix B prints them (symbol, code, length), across every length.
    const rfc: [number, number, number][] = [
      [0, 0x1ff8, 13], [1, 0x7fffd8, 23], [9, 0xffffea, 24], [10, 0x3ffffffc, 30], [32, 0x14, 6], [33, 0x3f8, 10],
      [35, 0xffa, 12], [38, 0xf8, 8], [39, 0x7fa, 11], [48, 0x0, 5], [58, 0x5c, 7], [60, 0x7ffc, 15], [92, 0x7fff0, 19],
      [94, 0x3ffc, 14], [97, 0x3, 5], [116, 0x9, 5], [122, 0x7b, 7], [127, 0xffffffc, 28], [128, 0xfffe6, 20],
      [129, 0x3fffd2, 22], [153, 0x1fffdc, 21], [199, 0x1ffffec, 25], [192, 0x3ffffe0, 26], [203, 0x7ffffde, 27],
      [220, 0xffffffd, 28], [249, 0xffffffe, 28], [254, 0x7fffff0, 27], [255, 0x3ffffee, 26], [256, 0x3fffffff, 30],
    ];
    for (const [sym, code, len] of rfc) {
      assert.equal(HUFFMAN_LENGTHS[sym], len, `length of ${sym}`);
      assert.equal(huffmanCode(sym), code, `code of ${sym}`);
    }
  });

  it("Huffman strings round-trip for any bytes; bad padding and EOS are refused", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (a) => {
        const s = Buffer.from(a);
        assert.equal(huffmanDecode(huffmanEncode(s)), s.toString("latin1"));
      }),
      { numRuns: 500 },
    );
    // 'a' is 00011 (5 bits): padding with zeros, or 8 bits of padding, is refused.
    assert.throws(() => huffmanDecode(Buffer.from([0b00011000])), /padding/);
    assert.throws(() => huffmanDecode(Buffer.from([0b00011111, 0xff])), /padding/);
    assert.throws(() => huffmanDecode(Buffer.from([0xff, 0xff, 0xff, 0xff])), /EOS|invalid/);
  });

  it("RFC 7541 C.4's requests decode, with the dynamic table carried from one block to the next", () => {
    const d = new HpackDecoder(4096);
    const hex = (s: string): Buffer => Buffer.from(s.replace(/\s/g, ""), "hex");
    assert.deepEqual(d.decode(hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")), [[":method", "GET"], [":scheme", "http"], [":path", "/"], [":authority", "www.example.com"]]);
    assert.deepEqual(d.decode(hex("8286 84be 5886 a8eb 1064 9cbf")), [[":method", "GET"], [":scheme", "http"], [":path", "/"], [":authority", "www.example.com"], ["cache-control", "no-cache"]]);
    assert.deepEqual(d.decode(hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf")), [
      [":method", "GET"],
      [":scheme", "https"],
      [":path", "/index.html"],
      [":authority", "www.example.com"],
      ["custom-key", "custom-value"],
    ]);
    assert.throws(() => d.decode(hex("ff 7f")), /past the table/);
    assert.throws(() => d.decode(hex("3fe2 1f")), /table size/, "a size update over our SETTINGS");
  });

  it("our header blocks decode to what was encoded (literal, never indexed), values of any byte", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.stringMatching(/^[a-z][a-z0-9-]{0,30}$/), fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a).toString("latin1"))), { maxLength: 12 }),
        (fields) => {
          const all: Header[] = [[":method", "POST"], [":scheme", "http"], ...fields];
          assert.deepEqual(new HpackDecoder(4096).decode(encodeHeaders(all)), all);
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe("H2Connection against node's HTTP/2 server", () => {
  let server: http2.Http2Server;
  let url: URL;
  let handler: (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, body: Buffer) => void = () => undefined;
  const sessions = new Set<http2.ServerHttp2Session>();
  let open = 0;
  let maxOpen = 0;

  before(async () => {
    server = http2.createServer({ settings: { maxConcurrentStreams: 3, initialWindowSize: 1000 }, maxSendHeaderBlockLength: 1 << 20 });
    server.on("session", (s) => {
      sessions.add(s);
      s.on("close", () => sessions.delete(s));
      s.on("error", () => undefined);
    });
    server.on("stream", (stream, headers) => {
      open++;
      maxOpen = Math.max(maxOpen, open);
      stream.on("close", () => open--);
      stream.on("error", () => undefined);
      const chunks: Buffer[] = [];
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("end", () => handler(stream, headers, Buffer.concat(chunks)));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    url = new URL(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`);
  });
  after(async () => {
    for (const s of sessions) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });

  it("headers and trailers of random content, over many answers on one connection (Huffman, dynamic table, eviction), decode exactly", async () => {
    const conn = new H2Connection(url, undefined);
    try {
      const name = fc.stringMatching(/^x-[a-z0-9-]{1,24}$/);
      // Visible ASCII and spaces inside (what node lets through), some values long enough to evict.
      const value = fc.oneof(fc.stringMatching(/^[!-~]([ -~]{0,60}[!-~])?$/), fc.stringMatching(/^[a-z]{500,1500}$/));
      const headersArb = fc.uniqueArray(fc.tuple(name, value), { selector: ([n]) => n, maxLength: 8 });
      await fc.assert(
        fc.asyncProperty(headersArb, headersArb, fc.constantFrom(200, 404, 500, 503), async (hs, ts, status) => {
          handler = (st) => {
            st.respond({ ":status": status, ...Object.fromEntries(hs) }, { waitForTrailers: true });
            st.on("wantTrailers", () => st.sendTrailers(Object.fromEntries(ts.length > 0 ? ts : [["x-none", "1"]])));
            st.end("body");
          };
          const a = await call(conn, "/random", Buffer.from("q"));
          assert.equal(a.blocks.length, 2, "headers, then trailers");
          assert.equal(field(a.blocks[0]!, ":status"), String(status));
          for (const [n, v] of hs) assert.equal(field(a.blocks[0]!, n), v, `header ${n}`);
          for (const [n, v] of ts) assert.equal(field(a.blocks[1]!, n), v, `trailer ${n}`);
          assert.equal(a.data.toString(), "body");
        }),
        { numRuns: 150 },
      );
      assert.equal(sessions.size, 1, "all on one connection");
    } finally {
      conn.destroy(null);
    }
  });

  it("a header block larger than a frame arrives in CONTINUATION frames and decodes", async () => {
    const conn = new H2Connection(url, undefined);
    try {
      const big = "v".repeat(40_000);
      handler = (st) => {
        st.respond({ ":status": 200, "x-big": big, "x-after": "ok" });
        st.end();
      };
      const a = await call(conn, "/big-headers", Buffer.from("q"));
      assert.equal(field(a.blocks[0]!, "x-big"), big);
      assert.equal(field(a.blocks[0]!, "x-after"), "ok");
    } finally {
      conn.destroy(null);
    }
  });

  it("a 5 MB request to a peer whose windows start at 1,000 bytes, and a 3 MB answer, arrive whole", async () => {
    const conn = new H2Connection(url, undefined);
    try {
      const body = Buffer.alloc(5_000_000);
      for (let i = 0; i < body.length; i += 4) body.writeUInt32BE(i, i);
      const answer = Buffer.alloc(3_000_000, 7);
      handler = (st, _h, got) => {
        st.respond({ ":status": 200, "x-sha": createHash("sha256").update(got).digest("hex"), "x-len": String(got.length) });
        st.end(answer);
      };
      const a = await call(conn, "/upload", body);
      assert.equal(field(a.blocks[0]!, "x-len"), String(body.length));
      assert.equal(field(a.blocks[0]!, "x-sha"), createHash("sha256").update(body).digest("hex"));
      assert.ok(a.data.equals(answer), `the answer whole (${a.data.length} bytes)`);
    } finally {
      conn.destroy(null);
    }
  });

  it("the peer's stream limit (3) holds: 12 requests at once are all answered, never more than 3 open", async () => {
    const conn = new H2Connection(url, undefined);
    try {
      // Let the SETTINGS arrive first (before them, the limit is not known, as the RFC allows).
      await call(conn, "/warm", Buffer.from("q")).catch(() => undefined);
      maxOpen = 0;
      handler = (st, h) => {
        setTimeout(() => {
          st.respond({ ":status": 200 });
          st.end(String(h[":path"]));
        }, 20);
      };
      const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => call(conn, `/n/${i}`, Buffer.from("q"))));
      assert.deepEqual(
        answers.map((a) => a.data.toString()),
        Array.from({ length: 12 }, (_, i) => `/n/${i}`),
      );
      assert.ok(maxOpen <= 3, `at most 3 streams open at once (${maxOpen})`);
      assert.equal(maxOpen, 3, "and the limit was used");
    } finally {
      conn.destroy(null);
    }
  });

  it("PINGs both ways: ours is answered; the server's is answered too when no request follows (the held ACK is sent by itself)", async () => {
    const conn = new H2Connection(url, undefined);
    try {
      handler = (st) => {
        st.respond({ ":status": 200 });
        st.end();
      };
      await call(conn, "/p", Buffer.from("q"));
      await new Promise<void>((resolve, reject) => {
        assert.ok(conn.ping((err) => (err === null ? resolve() : reject(err))));
      });
      const [s] = [...sessions];
      const rtt = await new Promise<number>((resolve, reject) => {
        s!.ping((err, duration) => (err ? reject(err) : resolve(duration)));
      });
      assert.ok(rtt < 1000, `the server's PING answered (${rtt.toFixed(1)} ms)`);
    } finally {
      conn.destroy(null);
    }
  });

  it("a stream reset by the server fails that stream only; after GOAWAY the stream it processed is answered, no new one is taken, and the connection ends", async () => {
    const conn = new H2Connection(url, undefined);
    try {
      handler = (st) => st.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      await assert.rejects(call(conn, "/reset", Buffer.from("q")), /reset the stream \(code 7\)/);
      handler = (st) => {
        st.respond({ ":status": 200 });
        st.end("fine");
      };
      assert.equal((await call(conn, "/ok", Buffer.from("q"))).data.toString(), "fine", "the connection serves the next request");
      let goaway = (): void => undefined;
      const sent = new Promise<void>((r) => (goaway = r));
      handler = (st) => {
        // nghttp2 names this stream as the last processed one: it must still be answered.
        st.session?.goaway(http2.constants.NGHTTP2_NO_ERROR, st.id);
        goaway();
        setTimeout(() => {
          st.respond({ ":status": 200 });
          st.end("late");
        }, 100);
      };
      const late = call(conn, "/goaway", Buffer.from("q"));
      await sent;
      await until(() => !conn.usable);
      await assert.rejects(call(conn, "/after", Buffer.from("q")), /takes no new requests/);
      assert.equal((await late).data.toString(), "late");
      await until(() => conn.destroyed);
    } finally {
      conn.destroy(null);
    }
  });
});

async function until(cond: () => boolean, ms = 3000): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) assert.fail(`not within ${ms} ms: ${cond.toString()}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("H2Connection against peers that break the protocol", () => {
  /** A TCP server that, once our preface and a request arrived, writes `bytes` (and optionally ends). */
  async function rawPeer(bytes: Buffer, end: boolean): Promise<{ url: URL; close: () => Promise<void> }> {
    const sockets = new Set<net.Socket>();
    const srv = net.createServer((sock) => {
      sockets.add(sock);
      let seen = 0;
      sock.on("data", (d) => {
        seen += d.length;
        // The preface and SETTINGS (24 + 9 + 12), the WINDOW_UPDATE (13), then a request.
        if (seen > 24 + 21 + 13 && seen - d.length <= 24 + 21 + 13) {
          sock.write(bytes);
          if (end) sock.end();
        }
      });
      sock.on("error", () => undefined);
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
    return {
      url: new URL(`http://127.0.0.1:${(srv.address() as net.AddressInfo).port}`),
      close: () =>
        new Promise<void>((r) => {
          for (const s of sockets) s.destroy();
          srv.close(() => r());
        }),
    };
  }
  const settings = frameOf(4, 0, 0, Buffer.alloc(0));

  const cases: [string, Buffer, boolean, RegExp][] = [
    ["a frame longer than the 16,384 bytes we allow", Buffer.concat([settings, frameOf(0, 0, 1, Buffer.alloc(20_000))]), false, /more than the 16384 allowed/],
    ["a server push, which our SETTINGS refused", Buffer.concat([settings, frameOf(5, 4, 1, Buffer.alloc(8))]), false, /PUSH_PROMISE/],
    ["a header block that does not decode (index past the tables)", Buffer.concat([settings, frameOf(1, 4, 1, Buffer.from([0xff, 0x7f]))]), false, /could not be decoded/],
    ["a header block interrupted by DATA", Buffer.concat([settings, frameOf(1, 0, 1, Buffer.from([0x88])), frameOf(0, 0, 1, Buffer.from("x"))]), false, /interrupted/],
    ["padding longer than its frame", Buffer.concat([settings, frameOf(0, 0x8, 1, Buffer.from([9, 1, 2]))]), false, /padding/],
    ["half an answer, then the connection ends", Buffer.concat([settings, frameOf(1, 4, 1, Buffer.from([0x88])), frameOf(0, 0, 1, Buffer.from("partial"))]), true, /closed/],
    ["GOAWAY naming no stream as processed", Buffer.concat([settings, frameOf(7, 0, 0, Buffer.alloc(8))]), false, /GOAWAY \(code 0\)/],
    ["a connection window pushed past 2^31-1", Buffer.concat([settings, frameOf(8, 0, 0, Buffer.from([0x7f, 0xff, 0xff, 0xff]))]), false, /WINDOW_UPDATE/],
  ];
  for (const [what, bytes, end, expected] of cases) {
    it(`${what}: the stream fails (never an answer, never a hang)`, async () => {
      const peer = await rawPeer(bytes, end);
      const conn = new H2Connection(peer.url, undefined);
      try {
        const t0 = Date.now();
        await assert.rejects(call(conn, "/x", Buffer.from("q")), expected);
        assert.ok(Date.now() - t0 < 2000, "at once");
        assert.equal(conn.usable, false, "the connection is not used again");
      } finally {
        conn.destroy(null);
        await peer.close();
      }
    });
  }

  it("a refused connection fails the request at once", async () => {
    const s = net.createServer();
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
    const port = (s.address() as net.AddressInfo).port;
    await new Promise<void>((r) => s.close(() => r()));
    const conn = new H2Connection(new URL(`http://127.0.0.1:${port}`), undefined);
    await assert.rejects(call(conn, "/x", Buffer.from("q")), /ECONNREFUSED/);
    assert.equal(conn.destroyed, true);
  });
});

describe("H2Connection over TLS", () => {
  let certs: TestCerts;
  before(() => {
    certs = makeTestCerts();
  });
  after(() => certs.remove());

  const pem = (path: string): Buffer => readFileSync(path);

  it("agrees on h2 by ALPN, verifies the server against the CA, and is answered", async () => {
    const server = http2.createSecureServer({ key: pem(certs.serverKey), cert: pem(certs.serverCert) });
    server.on("stream", (st) => {
      st.on("error", () => undefined);
      st.resume();
      st.on("end", () => {
        st.respond({ ":status": 200 });
        st.end("secure");
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    const port = (server.address() as net.AddressInfo).port;
    const conn = new H2Connection(new URL(`https://127.0.0.1:${port}`), { ca: pem(certs.ca) });
    const wrongCa = new H2Connection(new URL(`https://127.0.0.1:${port}`), { ca: pem(certs.otherCa) });
    try {
      assert.equal((await call(conn, "/tls", Buffer.from("q"))).data.toString(), "secure");
      await assert.rejects(call(wrongCa, "/tls", Buffer.from("q")), /certificate/i, "a server the CA did not sign is refused");
    } finally {
      conn.destroy(null);
      wrongCa.destroy(null);
      await new Promise<void>((r) => server.close(() => r()));
    }
  });

  it("a TLS server that does not agree to h2 fails the request with a sentence saying so", async () => {
    const server = tls.createServer({ key: pem(certs.serverKey), cert: pem(certs.serverCert), ALPNProtocols: ["http/1.1"] }, (sock) => sock.on("error", () => undefined));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    const port = (server.address() as net.AddressInfo).port;
    const conn = new H2Connection(new URL(`https://127.0.0.1:${port}`), { ca: pem(certs.ca) });
    try {
      await assert.rejects(call(conn, "/tls", Buffer.from("q")), /did not agree to HTTP\/2|ALPN|protocol/i);
    } finally {
      conn.destroy(null);
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});

describe("H2Connection: the review's findings (frames fed by hand, what it writes read back)", () => {
  const settingsOf = (pairs: [number, number][]): Buffer => {
    const p = Buffer.alloc(6 * pairs.length);
    pairs.forEach(([k, v], i) => {
      p.writeUInt16BE(k, 6 * i);
      p.writeUInt32BE(v, 6 * i + 2);
    });
    return frameOf(4, 0, 0, p);
  };
  /** A connection whose socket is replaced: `feed` delivers bytes as if read, `frames` lists what it wrote since the last `take`. */
  function fed(): { conn: H2Connection; feed: (b: Buffer) => void; take: () => { type: number; flags: number; id: number; payload: Buffer }[] } {
    const conn = new H2Connection(new URL("http://127.0.0.1:9"), undefined);
    const internals = conn as unknown as { socket: net.Socket; read(b: Buffer): void };
    internals.socket.removeAllListeners("close");
    internals.socket.on("error", () => undefined);
    internals.socket.destroy();
    let out: Buffer[] = [];
    internals.socket = { write: (b: Buffer) => out.push(Buffer.from(b)) > 0, end: () => undefined, destroy: () => undefined, ref: () => undefined, unref: () => undefined } as unknown as net.Socket;
    const take = (): { type: number; flags: number; id: number; payload: Buffer }[] => {
      const all = Buffer.concat(out);
      out = [];
      const frames = [];
      for (let at = 0; at < all.length; ) {
        const len = all.readUIntBE(at, 3);
        frames.push({ type: all[at + 3]!, flags: all[at + 4]!, id: all.readUInt32BE(at + 5), payload: all.subarray(at + 9, at + 9 + len) });
        at += 9 + len;
      }
      return frames;
    };
    return { conn, feed: (b) => internals.read(b), take };
  }
  const log: string[] = [];
  const req = (conn: H2Connection, name: string, body = Buffer.from("q")): { cancel(): void } =>
    conn.request(encodeHeaders([[":method", "POST"]]), body, {
      onHeaders: () => undefined,
      onData: () => undefined,
      onEnd: () => log.push(`${name}:end`),
      onFail: (e) => log.push(`${name}:fail ${e.message}`),
    });

  it("the SETTINGS ACK is written before the streams (and DATA) its new values allow", () => {
    const { conn, feed, take } = fed();
    feed(settingsOf([[3, 1], [4, 10]]));
    req(conn, "A", Buffer.alloc(50));
    req(conn, "B");
    take();
    feed(settingsOf([[3, 10], [4, 1000]]));
    const written = take().map((f) => `${f.type}/${f.flags}/${f.id}`);
    assert.equal(written[0], "4/1/0", `the ACK first: ${written.join(" ")}`);
    assert.ok(written.includes("0/1/1"), `then A's remaining DATA: ${written.join(" ")}`);
    assert.ok(written.includes("1/4/3"), `and B's HEADERS: ${written.join(" ")}`);
    conn.destroy(null);
  });

  it("a PING's ACK waits for our next frame and goes first in it; with no frame of ours it goes by itself within the hold", async () => {
    const { conn, feed, take } = fed();
    feed(settingsOf([]));
    take();
    const ping = Buffer.from("01234567");
    feed(frameOf(6, 0, 0, ping));
    assert.deepEqual(take(), [], "not written at once");
    req(conn, "A");
    const written = take();
    assert.equal(written.length >= 2, true);
    assert.equal(`${written[0]!.type}/${written[0]!.flags}`, "6/1", "the ACK first, in the request's write");
    assert.ok(written[0]!.payload.equals(ping), "with the PING's payload");
    assert.equal(written[1]!.type, 1, "then the request's HEADERS");
    feed(frameOf(6, 0, 0, Buffer.from("abcdefgh")));
    assert.deepEqual(take(), []);
    await new Promise((r) => setTimeout(r, 100));
    const alone = take();
    assert.equal(alone.length, 1, "the held ACK went by itself");
    assert.ok(alone[0]!.type === 6 && alone[0]!.flags === 1 && alone[0]!.payload.toString() === "abcdefgh");
    conn.destroy(null);
  });

  it("a stream WINDOW_UPDATE of 0 resets that stream with PROTOCOL_ERROR and fails it at once", async () => {
    log.length = 0;
    const { conn, feed, take } = fed();
    req(conn, "A");
    take();
    feed(frameOf(8, 0, 1, Buffer.alloc(4)));
    const rst = take().find((f) => f.type === 3);
    assert.equal(rst?.payload.readUInt32BE(0), 1, "RST_STREAM(PROTOCOL_ERROR)");
    assert.match(log.join(), /A:fail .*bad WINDOW_UPDATE/);
    assert.equal(conn.usable, true, "a stream error, not the connection's");
    conn.destroy(null);
  });

  it("streams answered, reset or cancelled while their bodies wait for window keep no body in the send list", () => {
    const { conn, feed } = fed();
    feed(settingsOf([]));
    const r = [1, 2, 3].map((i) => req(conn, `S${i}`, Buffer.alloc(1_500_000)));
    feed(frameOf(1, 5, 1, Buffer.from([0x88])));
    feed(frameOf(3, 0, 3, Buffer.from([0, 0, 0, 0])));
    r[2]!.cancel();
    assert.equal((conn as unknown as { blocked: unknown[] }).blocked.length, 0);
    conn.destroy(null);
  });

  it("the last stream id: requests queued behind the stream limit fail, and the connection ends when its streams have", async () => {
    log.length = 0;
    const { conn, feed } = fed();
    feed(settingsOf([[3, 1]]));
    (conn as unknown as { nextId: number }).nextId = 2 ** 31 - 3;
    req(conn, "A");
    req(conn, "B");
    req(conn, "C");
    feed(frameOf(1, 5, 2 ** 31 - 3, Buffer.from([0x88])));
    assert.equal(conn.usable, false);
    feed(frameOf(1, 5, 2 ** 31 - 1, Buffer.from([0x88])));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(log.map((l) => l.replace(/ .*/, "")).sort(), ["A:end", "B:end", "C:fail"]);
    assert.match(log.find((l) => l.startsWith("C:"))!, /last stream id/);
    assert.equal(conn.destroyed, true, "ended once its last stream did");
  });

  it("a flood of empty CONTINUATION frames ends the connection at the header block limit", () => {
    log.length = 0;
    const { conn, feed } = fed();
    req(conn, "A");
    feed(frameOf(1, 0, 1, Buffer.from([0x88])));
    const empty = frameOf(9, 0, 1, Buffer.alloc(0));
    for (let i = 0; i < 40_000 && !conn.destroyed; i++) feed(empty);
    assert.equal(conn.destroyed, true);
    assert.match(log.join(), /A:fail .*header block over/);
  });

  it("an HPACK integer longer than 5 bytes is refused (it would decode to NaN)", () => {
    assert.throws(() => new HpackDecoder(4096).decode(Buffer.from([0x0f, ...Array(200).fill(0x80), 0x01])), /longer than 5 bytes/);
    assert.throws(() => new HpackDecoder(4096).decode(Buffer.from([0x3f, ...Array(200).fill(0x80), 0x01])), /longer than 5 bytes/);
  });

  it("nghttp2 raising its stream limit and its window while requests wait: all answered, the upload whole", async () => {
    const server = http2.createServer({ settings: { maxConcurrentStreams: 1, initialWindowSize: 1000 } });
    let raised = false;
    server.on("session", (ss) => ss.on("error", () => undefined));
    server.on("stream", (st, h) => {
      st.on("error", () => undefined);
      const chunks: Buffer[] = [];
      st.on("data", (c: Buffer) => chunks.push(c));
      if (!raised && h[":path"] !== "/warm") {
        raised = true;
        st.session!.settings({ maxConcurrentStreams: 10, initialWindowSize: 1_000_000 });
      }
      st.on("end", () =>
        setTimeout(() => {
          if (st.destroyed) return;
          st.respond({ ":status": 200 });
          st.end(String(Buffer.concat(chunks).length));
        }, 50),
      );
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    const conn = new H2Connection(new URL(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`), undefined);
    try {
      await call(conn, "/warm", Buffer.from("q"));
      const sizes = [300_000, 1, 2, 3, 4];
      const answers = await Promise.all(sizes.map((n, i) => call(conn, `/${i}`, Buffer.alloc(n))));
      assert.deepEqual(
        answers.map((a) => a.data.toString()),
        sizes.map(String),
      );
    } finally {
      conn.destroy(null);
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});

exitAfterTests("test/replicated/h2.test.ts");
