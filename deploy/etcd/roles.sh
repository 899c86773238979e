#!/bin/sh
# Users and roles for Cairn on etcd: one role per database, granting readwrite on exactly that
# database's key prefix, and one user per harness holding that role. Run with the root credentials,
# once per database; running it again for the same database is safe (an existing user keeps its
# password: change it with `etcdctl user passwd`). Passwords come from the environment and reach
# etcdctl on stdin, never on a command line (which `ps` shows to every local user).
#
#   ETCDCTL_ENDPOINTS=https://etcd-a:2379,https://etcd-b:2379,https://etcd-c:2379 \
#   ETCDCTL_CACERT=/etc/etcd/pki/ca.crt \
#   ETCDCTL_CERT=/etc/etcd/pki/admin.crt ETCDCTL_KEY=/etc/etcd/pki/admin.key \
#   ETCDCTL_USER=root:$ROOT_PASSWORD \
#   CAIRN_DB=harness-1 CAIRN_DB_USER=harness-1 CAIRN_DB_PASSWORD=... ./roles.sh
#
# ETCDCTL_CERT / ETCDCTL_KEY are needed because the members require client certificates
# (client-cert-auth: true in etcd.conf.yml).
set -eu
: "${CAIRN_DB:?database name}" "${CAIRN_DB_USER:?etcd user for it}" "${CAIRN_DB_PASSWORD:?its password}"
export ETCDCTL_API=3

# Only the adapter's database names (DATABASE_NAME in src/storage/semantics.ts): any
# other value would grant a prefix that no database uses.
if ! printf '%s' "$CAIRN_DB" | grep -Eqx '[A-Za-z0-9][A-Za-z0-9._-]{0,127}' || [ "$(printf '%s' "$CAIRN_DB" | wc -l)" -ne 0 ]; then
  echo "roles.sh: CAIRN_DB=\"$CAIRN_DB\" is not a database name: 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit" >&2
  exit 2
fi

# First time only: a root user, then turn authentication on (the root role is built in).
#   printf '%s\n' "$ROOT_PASSWORD" | etcdctl user add root --interactive=false
#   etcdctl user grant-role root root
#   etcdctl auth enable

role="cairn-db-$CAIRN_DB"
# Create only what is missing; any other failure (wrong root password, no quorum) stops the script.
etcdctl role get "$role" >/dev/null 2>&1 || etcdctl role add "$role"
etcdctl role grant-permission "$role" --prefix=true readwrite "cairn/db/$CAIRN_DB/"
if ! etcdctl user get "$CAIRN_DB_USER" >/dev/null 2>&1; then
  # --interactive=false: read the password from stdin (printf is a shell builtin: no process argv).
  printf '%s\n' "$CAIRN_DB_PASSWORD" | etcdctl user add "$CAIRN_DB_USER" --interactive=false
fi
etcdctl user grant-role "$CAIRN_DB_USER" "$role"

# An operator role that may list (and read) every database, for `cairn status` across databases:
#   etcdctl role add cairn-operator
#   etcdctl role grant-permission cairn-operator --prefix=true read cairn/db/
etcdctl role get "$role"
