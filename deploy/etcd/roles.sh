#!/bin/sh
# Users and roles for Cairn on etcd: one role per database, granting readwrite on exactly that
# database's key prefix. Run once with the root credentials (ETCDCTL_USER=root:...), then for each
# new database. Passwords are read from the environment, never written on the command line history.
#
#   ETCDCTL_ENDPOINTS=https://etcd-a:2379,https://etcd-b:2379,https://etcd-c:2379 \
#   ETCDCTL_CACERT=/etc/etcd/pki/ca.crt ETCDCTL_USER=root:$ROOT_PASSWORD \
#   CAIRN_DB=harness-1 CAIRN_DB_USER=harness-1 CAIRN_DB_PASSWORD=... ./roles.sh
set -eu
: "${CAIRN_DB:?database name}" "${CAIRN_DB_USER:?etcd user for it}" "${CAIRN_DB_PASSWORD:?its password}"
export ETCDCTL_API=3

# First time only: a root user, then turn authentication on.
#   etcdctl user add root --new-user-password="$ROOT_PASSWORD" --interactive=false
#   etcdctl user grant-role root root
#   etcdctl auth enable

role="cairn-db-$CAIRN_DB"
etcdctl role add "$role" || true
etcdctl role grant-permission "$role" --prefix=true readwrite "cairn/db/$CAIRN_DB/"
etcdctl user add "$CAIRN_DB_USER" --new-user-password="$CAIRN_DB_PASSWORD" --interactive=false || true
etcdctl user grant-role "$CAIRN_DB_USER" "$role"

# An operator role that may list (and read) every database, for `cairn status` across databases:
#   etcdctl role add cairn-operator
#   etcdctl role grant-permission cairn-operator --prefix=true read cairn/db/
etcdctl role get "$role"
