/**
 * etcd users and roles for Cairn databases: one role per database granting readwrite on exactly its
 * key prefix (`cairn/db/<name>/`), so a process holding that user's credentials can open that
 * database and no other. deploy/etcd/README.md shows the same with etcdctl.
 */
import { Etcd3 } from "etcd3";
import { ROOT_PREFIX, checkDatabaseName } from "./layout.js";

/** The key prefix a database's role must grant. */
export function databasePrefix(name: string): string {
  checkDatabaseName(name);
  return `${ROOT_PREFIX}${name}/`;
}

/** The role name used for database `name`. */
export function databaseRole(name: string): string {
  return `cairn-db-${name}`;
}

export interface GrantOptions {
  readonly endpoints: readonly string[];
  /** A user allowed to manage auth (e.g. root). */
  readonly admin: { readonly username: string; readonly password: string };
  /** The user to create (when missing) and grant. */
  readonly user: string;
  readonly password: string;
  /** Databases this user may open, read and post to. */
  readonly databases: readonly string[];
}

/**
 * Creates `user` (if missing) and, per database, the role `cairn-db-<name>` with readwrite on
 * `cairn/db/<name>/`, granted to `user`. Idempotent for existing roles. Throws the etcd client's
 * error when the admin credentials are refused.
 */
export async function grantDatabaseAccess(options: GrantOptions): Promise<void> {
  const client = new Etcd3({ hosts: [...options.endpoints], auth: { username: options.admin.username, password: options.admin.password } });
  try {
    const users = await client.getUsers();
    if (!users.some((u) => u.name === options.user)) await client.user(options.user).create(options.password);
    for (const db of options.databases) {
      const roleName = databaseRole(db);
      const roles = await client.getRoles();
      const role = roles.find((r) => r.name === roleName) ?? (await client.role(roleName).create());
      await role.grant({ permission: "Readwrite", range: client.range({ prefix: databasePrefix(db) }) });
      await client.user(options.user).addRole(roleName);
    }
  } finally {
    client.close();
  }
}
