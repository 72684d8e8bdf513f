#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster with pg_realtime preloaded, owned by the postgres OS user.
#   scripts/cluster.sh start DIR PORT [SETTING=VALUE ...]   initdb + start, sockets in DIR
#   scripts/cluster.sh stop DIR
set -euo pipefail
bindir=$(pg_config --bindir)
as_pg() { runuser -u postgres -- env -u RUST_BACKTRACE "$@"; }

case "${1:-}" in
start)
    dir=$2 port=$3
    shift 3
    # A fixed port inside the ephemeral range can be taken at any moment by some
    # connection's source port (load tests open tens of thousands), and the start fails.
    read -r low high < /proc/sys/net/ipv4/ip_local_port_range
    if [ "$port" -ge "$low" ] && [ "$port" -le "$high" ]; then
        echo "$0: port $port is in the ephemeral range $low-$high; choose one below $low" >&2
        exit 2
    fi
    mkdir -p "$dir" && chown postgres: "$dir"
    as_pg "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
    {
        echo "shared_preload_libraries = 'pg_realtime'"
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir'"
        for setting in "$@"; do echo "$setting"; done
    } >> "$dir/data/postgresql.conf"
    as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    ;;
stop)
    as_pg "$bindir/pg_ctl" -D "$2/data" -m fast stop >/dev/null
    ;;
*)
    echo "usage: $0 start DIR PORT [SETTING=VALUE ...] | stop DIR" >&2
    exit 2
    ;;
esac
