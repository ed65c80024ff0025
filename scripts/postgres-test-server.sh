#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests: `start DIR` creates and starts one in DIR
# (listening only on a Unix socket in DIR) and prints its connection string; `stop DIR` stops
# it. The tests read the string from VILVONA_TEST_POSTGRES_URL, and create a database each.
#
#   export VILVONA_TEST_POSTGRES_URL="$(scripts/postgres-test-server.sh start /tmp/vilvona-pg)"
#   cargo test --workspace
#   scripts/postgres-test-server.sh stop /tmp/vilvona-pg
#
# Debian's postgresql package keeps initdb and pg_ctl in its versioned bin directory, off
# PATH; it is installed when missing (as root). initdb refuses to run as root, so as root the
# cluster runs as the postgres user.
set -euo pipefail

action="${1:-}"
dir="${2:-}"
if [[ -z "$action" || -z "$dir" ]]; then
    echo "usage: $0 start|stop DIR" >&2
    exit 2
fi

bin_dir() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -z "$found" && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "installing Debian's postgresql package" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 \
            || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; }
        found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    fi
    if [[ -z "$found" ]]; then
        echo "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin; install Debian's postgresql package" >&2
        exit 1
    fi
    echo "$found"
}

as_owner() {
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

bin="$(bin_dir)"
case "$action" in
start)
    mkdir -p "$dir"
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres "$dir"
    fi
    if [[ ! -f "$dir/data/PG_VERSION" ]]; then
        as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    # No TCP at all; fsync off: a test cluster trades durability for speed.
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o "-c listen_addresses='' -c unix_socket_directories=$dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    echo "host=$dir user=postgres dbname=postgres"
    ;;
stop)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
