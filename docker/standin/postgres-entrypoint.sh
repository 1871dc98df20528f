#!/bin/sh
# Entrypoint of the `postgres:17` stand-in that `make docker-check` builds from Debian's
# PostgreSQL where no registry is reachable. It keeps the part of the official image's contract
# that docker/compose.yaml uses: POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB on the first
# start of an empty data volume, the scripts in /docker-entrypoint-initdb.d (*.sql, *.sh) run
# once then, password (scram-sha-256) auth over TCP, and `pg_isready` on the PATH.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
export PGDATA

if [ "$(id -u)" = 0 ]; then
    # A fresh named volume is root's: hand it to postgres, then run as postgres.
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "POSTGRES_PASSWORD is empty: set it in docker/.env" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" > /dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    # Set-up runs on a private unix socket only: neither clients nor pg_isready (the
    # healthcheck) see a server before it is done.
    setup=$(mktemp -d)
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=$setup" \
        -w start > /dev/null
    psql="psql -v ON_ERROR_STOP=1 -h $setup --username=$POSTGRES_USER --no-password"
    psql="$psql --dbname=postgres"
    if [ "$POSTGRES_DB" != postgres ]; then
        $psql -q -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sql) echo "initdb: running $f"; $psql --dbname="$POSTGRES_DB" -q -f "$f" ;;
            *.sh) echo "initdb: running $f"; . "$f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
    rmdir "$setup"
    echo "initdb: done"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
