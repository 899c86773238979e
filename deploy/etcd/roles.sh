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
#
# CAIRN_ETCD_ENABLE_AUTH=true also turns authentication on where it is still off (a new cluster):
# it creates the user root with the password in ETCDCTL_USER, grants it the root role and enables
# authentication, then goes on as above. Where authentication is on already it changes nothing.
# (deploy/kubernetes/etcd-roles.yaml runs it so.)
#
# Needs only a POSIX sh (its builtins) and etcdctl: it runs in a minimal image.
set -eu
: "${CAIRN_DB:?database name}" "${CAIRN_DB_USER:?etcd user for it}" "${CAIRN_DB_PASSWORD:?its password}"
export ETCDCTL_API=3

# Only the adapter's database names (DATABASE_NAME in src/storage/semantics.ts): any
# other value would grant a prefix that no database uses. (A newline is outside the set too.)
case $CAIRN_DB in
  [A-Za-z0-9]*) bad_name=false ;;
  *) bad_name=true ;;
esac
case $CAIRN_DB in
  *[!A-Za-z0-9._-]*) bad_name=true ;;
esac
if [ "$bad_name" = true ] || [ "${#CAIRN_DB}" -gt 128 ]; then
  echo "roles.sh: CAIRN_DB=\"$CAIRN_DB\" is not a database name: 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit" >&2
  exit 2
fi

# Authentication off means every client that reaches the members may read and write every
# database. Found off (a request without credentials is answered), it is turned on when asked.
if [ "${CAIRN_ETCD_ENABLE_AUTH:-false}" = true ]; then
  case ${ETCDCTL_USER:-} in
    root:?*) ;;
    *)
      echo "roles.sh: CAIRN_ETCD_ENABLE_AUTH=true needs ETCDCTL_USER=root:PASSWORD (the root password to set)" >&2
      exit 2
      ;;
  esac
  if (unset ETCDCTL_USER; etcdctl user list >/dev/null 2>&1); then
    root_password=${ETCDCTL_USER#root:}
    (
      unset ETCDCTL_USER
      etcdctl user get root >/dev/null 2>&1 || printf '%s\n' "$root_password" | etcdctl user add root --interactive=false
      etcdctl user grant-role root root
      etcdctl auth enable
    )
  fi
fi
# Without CAIRN_ETCD_ENABLE_AUTH, turn authentication on by hand, once (the root role is built in):
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
