#!/bin/sh
# The official postgres image's first-start behaviour, the part the project uses: initdb with
# POSTGRES_USER as superuser (password POSTGRES_PASSWORD), POSTGRES_HOST_AUTH_METHOD for TCP
# logins (trust when no password is given), POSTGRES_DB created, then the *.sql files of
# /docker-entrypoint-initdb.d run once on a server listening on its socket only.
set -eu
if [ "${1:-}" != postgres ]; then exec "$@"; fi
shift
user="${POSTGRES_USER:-postgres}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    method="${POSTGRES_HOST_AUTH_METHOD:-}"
    if [ -z "$method" ]; then
        if [ -n "${POSTGRES_PASSWORD:-}" ]; then method=scram-sha-256; else method=trust; fi
    fi
    pwfile=""
    if [ -n "${POSTGRES_PASSWORD:-}" ]; then
        pwfile="$(mktemp)"
        printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    fi
    initdb -D "$PGDATA" -U "$user" --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust \
        --auth-host="$method" ${pwfile:+--pwfile="$pwfile"} >/dev/null
    [ -z "$pwfile" ] || rm -f "$pwfile"
    printf 'host all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"
    printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    db="${POSTGRES_DB:-$user}"
    if [ "$db" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -c "CREATE DATABASE \"$db\"" >/dev/null
    fi
    for f in /docker-entrypoint-initdb.d/*.sql; do
        [ -e "$f" ] || continue
        echo "initdb: running $f"
        psql -v ON_ERROR_STOP=1 -U "$user" -d "$db" -f "$f" >/dev/null
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "initdb: done"
fi
exec postgres -D "$PGDATA" "$@"
