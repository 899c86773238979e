/**
 * Throwaway TLS material for the replicated adapter's tests, made with the `openssl` CLI in a fresh
 * temporary directory: a CA, a server certificate for 127.0.0.1 / localhost (serverAuth and
 * clientAuth, since etcd also dials itself with it), a client certificate signed by that CA, and a
 * client certificate signed by a second, unrelated CA. EC P-256 keys: fast to make.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** Paths of the generated files (PEM) and a cleanup. */
export interface TestCerts {
  readonly dir: string;
  readonly ca: string;
  readonly serverCert: string;
  readonly serverKey: string;
  /** Client certificate signed by `ca`, CN `clientCn`. */
  readonly clientCert: string;
  readonly clientKey: string;
  readonly clientCn: string;
  /** The unrelated CA, and a client certificate it signed (same CN): etcd must refuse it. */
  readonly otherCa: string;
  readonly otherClientCert: string;
  readonly otherClientKey: string;
  remove(): void;
}

function openssl(args: readonly string[], cwd: string): void {
  try {
    execFileSync("openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"] });
  } catch (err) {
    const stderr = (err as { stderr?: Buffer }).stderr?.toString() ?? "";
    if ((err as { code?: string }).code === "ENOENT") throw new Error("openssl is not installed (Debian: apt-get install -y openssl)");
    throw new Error(`openssl ${args[0]} failed: ${stderr.trim()}`, { cause: err });
  }
}

const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

function makeCa(dir: string, name: string): void {
  openssl(["req", "-x509", ...EC, "-keyout", `${name}.key`, "-out", `${name}.crt`, "-days", "2", "-subj", `/CN=${name}`,
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"], dir);
}

function makeLeaf(dir: string, ca: string, name: string, cn: string, ext: string): void {
  writeFileSync(join(dir, `${name}.ext`), ext);
  openssl(["req", "-new", ...EC, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${cn}`], dir);
  openssl(["x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.crt`, "-CAkey", `${ca}.key`, "-CAcreateserial",
    "-out", `${name}.crt`, "-days", "2", "-extfile", `${name}.ext`], dir);
}

/** Generates the certificates into a fresh temporary directory (throws with openssl's stderr on failure). */
export function makeTestCerts(clientCn = "cairn-test-client"): TestCerts {
  const dir = mkdtempSync(join(tmpdir(), "cairn-certs-"));
  try {
    makeCa(dir, "ca");
    makeCa(dir, "other-ca");
    makeLeaf(dir, "ca", "server", "localhost",
      "subjectAltName=IP:127.0.0.1,DNS:localhost\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n");
    const clientExt = "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n";
    makeLeaf(dir, "ca", "client", clientCn, clientExt);
    makeLeaf(dir, "other-ca", "other-client", clientCn, clientExt);
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const p = (f: string) => join(dir, f);
  return {
    dir,
    ca: p("ca.crt"),
    serverCert: p("server.crt"),
    serverKey: p("server.key"),
    clientCert: p("client.crt"),
    clientKey: p("client.key"),
    clientCn,
    otherCa: p("other-ca.crt"),
    otherClientCert: p("other-client.crt"),
    otherClientKey: p("other-client.key"),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
