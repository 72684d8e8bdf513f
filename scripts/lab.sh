#!/usr/bin/env bash
# Hosts on this box: pg_realtime past one machine, on the engines operators run (issue 42).
#
#   scripts/lab.sh up            build the hosts and start everything; prints the addresses
#   scripts/lab.sh test [--short] up, the checks (pgbench/lab.py), then down, whatever happens
#   scripts/lab.sh down          stop everything the lab started and remove its hosts
#   scripts/lab.sh left          exit 1, naming it, if anything the lab makes is still there
#   scripts/lab.sh sidecar HOST CONSUMER PORT   one more sidecar process (the cost check)
#
# The hosts are network namespaces joined by one bridge, in 198.18.0.0/16 (RFC 2544's
# benchmarking range) with no default route anywhere and no route from the root namespace:
# nothing can leave the bridge. Each host's processes live in a cgroup of their own
# (cpuacct, /sys/fs/cgroup/cpuacct/rtlab/<host>), so each host's CPU is accounted apart and
# `down` finds every process a host started, its children included, by PID.
#
#   db1 198.18.0.11, db2 .12   PostgreSQL 15 from Debian 12, pg_realtime preloaded, kept by
#                              pg_auto_failover's keeper (pg_autoctl); TLS from the lab's CA
#   mon 198.18.0.13            pg_auto_failover's monitor
#   sc1 198.18.0.21, sc2 .22   the release sidecar, port 4000, a multi-host connection string
#                              with target_session_attrs=read-write, TLS verified against
#                              the lab's CA, TRUSTED_PROXIES = the edge
#   sc3 198.18.0.23            a sidecar host made ready but not started, and its server
#                              declared disabled in HAProxy: the host-loss checks add it
#   edge 198.18.0.31           HAProxy on :8080 (balance url_param route, consistent hash,
#                              X-Forwarded-For), the load generators, whose connections come
#                              from 198.18.K.1 for K = 1..20: each its own /24, so the
#                              sidecars' address keys (prefixes included) see 20 clients
#
# Why pg_auto_failover rather than Patroni with etcd: one Debian package, no consensus store
# to run beside it, and a synchronous standby by default. With two data nodes its setting is
# availability-first (number_sync_standbys 0): while the standby is away the monitor
# moves the primary to wait_primary, which empties synchronous_standby_names, and writes go
# on without it. sidecar/README.md, "Past one machine", has the trade-off.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

LAB=${LAB_DIR:-/var/tmp/pg_realtime_lab}
NS=rtlab
CG=/sys/fs/cgroup/cpuacct/$NS
PGBIN=/usr/lib/postgresql/15/bin
SECRET=lab-secret-with-enough-length-for-hs256
HOSTS="db1:11 db2:12 mon:13 sc1:21 sc2:22 sc3:23 edge:31"
CLIENT_NETS=20
SIDECAR_BIN=${SIDECAR_BIN:-$root/target/release/realtime-sidecar}

# A host's address (198.18.0.<its number in HOSTS>), and the edge's client source K.
addr() {
    local entry
    for entry in $HOSTS; do
        [ "${entry%%:*}" = "$1" ] && echo "198.18.0.${entry##*:}" && return
    done
    return 1
}
source_addr() { echo "198.18.$1.1"; }

# What pgbench/lab.py needs to know of the lab, written once here: the hosts' addresses,
# the client sources and the JWT secret, in $LAB/lab.json.
lab_file() {
    local entry k sep=""
    {
        printf '{"secret": "%s", "hosts": {' "$SECRET"
        for entry in $HOSTS; do
            printf '%s"%s": "%s"' "$sep" "${entry%%:*}" "$(addr "${entry%%:*}")"
            sep=", "
        done
        printf '}, "sources": ['
        sep=""
        for k in $(seq 1 "$CLIENT_NETS"); do
            printf '%s"%s"' "$sep" "$(source_addr "$k")"
            sep=", "
        done
        printf ']}\n'
    } > "$LAB/lab.json"
}

# A command on host $1, in its namespace and cgroup, in its own session (so a terminal's
# signals do not reach it); its children stay in the cgroup.
on() {
    local h=$1
    shift
    # The cgroup is joined before entering the namespace: `ip netns exec` mounts the
    # namespace's own /sys, where the cgroup hierarchy is not.
    setsid bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG/$h" ip netns exec "$NS-$h" "$@"
}
# The same, as the postgres OS user (Postgres refuses root). The hosts share one file system
# but each has its own /var/run/postgresql (a bind mount in the namespace's own mount table,
# which `ip netns exec` makes), so the servers' sockets and lock files do not meet.
# pg_autoctl keeps its configuration and state under the XDG directories: the lab's own,
# so that nothing of it outlives the lab.
on_pg() {
    local h=$1
    shift
    mkdir -p "$LAB/run/$h" && chown postgres: "$LAB/run/$h"
    on "$h" bash -c 'mount --bind "$0" /var/run/postgresql && exec "$@"' "$LAB/run/$h" \
        runuser -u postgres -- env PATH="$PGBIN:/usr/bin:/bin" XDG_CONFIG_HOME="$LAB/xdg/config" \
        XDG_DATA_HOME="$LAB/xdg/data" XDG_RUNTIME_DIR="$LAB/xdg/run" "$@"
}

install() {
    . scripts/apt.sh
    if apt_install haproxy postgresql-15-auto-failover pg-auto-failover-cli nftables iproute2 openssl; then
        # The haproxy package starts its own service where an init system runs; the lab
        # starts its own HAProxy in the edge host, so stop any that the install started.
        service haproxy stop >/dev/null 2>&1 || true
    fi
    # The release builds (nothing to do when they are current), and realtime-js with the
    # other packages the end-to-end tests pin, which the lab's clients use.
    cargo build --release -q -p realtime-sidecar -p realtime-loadgen
    [ -d sidecar/e2e/node_modules ] || (cd sidecar/e2e && npm ci --no-audit --no-fund --loglevel=error)
    [ -f "$PGBIN/../lib/pg_realtime.so" ] || [ -f "$(pg_config --pkglibdir)/pg_realtime.so" ] ||
        scripts/install-extension.sh 15
}

# The lab's certificate authority, one server certificate for the database hosts and one
# for the monitor (the sidecars verify the server, names included; the keepers use
# verify-ca between themselves). One certificate valid for both database hosts: pg_rewind,
# which pg_auto_failover runs when an old primary rejoins, copies the other node's
# configuration, certificate paths included, so after a switchover db1 served db2's
# certificate, which names only db2, and every sidecar's TLS handshake with it failed.
certificates() {
    local d=$LAB/tls
    mkdir -p "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=pg_realtime lab CA" \
        -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
    for c in "db:IP:$(addr db1),IP:$(addr db2)" "mon:IP:$(addr mon)"; do
        local name=${c%%:*} names=${c#*:}
        openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
        printf 'subjectAltName = %s\n' "$names" > "$d/$name.ext"
        openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
            -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
    done
    chown -R postgres: "$d"
    chmod 600 "$d"/*.key
}

hosts_up() {
    ip netns add "$NS-sw"
    ip -n "$NS-sw" link add br0 type bridge
    ip -n "$NS-sw" link set br0 up
    mkdir -p "$CG"
    local h a
    for entry in $HOSTS; do
        h=${entry%%:*} a=${entry##*:}
        ip netns add "$NS-$h"
        ip -n "$NS-sw" link add "v-$h" type veth peer name eth0 netns "$NS-$h"
        ip -n "$NS-sw" link set "v-$h" master br0 up
        ip -n "$NS-$h" addr add "198.18.0.$a/16" dev eth0
        ip -n "$NS-$h" link set eth0 up
        ip -n "$NS-$h" link set lo up
        mkdir -p "$CG/$h"
    done
    for k in $(seq 1 "$CLIENT_NETS"); do
        ip -n "$NS-edge" addr add "$(source_addr "$k")/16" dev eth0
    done
}

database_up() {
    local ca=$LAB/tls/ca.crt monitor_uri
    chown -R postgres: "$LAB"
    on_pg mon pg_autoctl create monitor --pgdata "$LAB/mon" --pgport 5432 --hostname "$(addr mon)" \
        --auth trust --ssl-ca-file "$ca" --server-cert "$LAB/tls/mon.crt" --server-key "$LAB/tls/mon.key" \
        --run > "$LAB/mon.log" 2>&1 &
    monitor_uri="postgres://autoctl_node@$(addr mon):5432/pg_auto_failover?sslmode=verify-ca&sslrootcert=$ca"
    wait_for 60 "the monitor" on_pg mon psql -X -q -d "$monitor_uri" -c "select 1"
    # The first node's cluster is made here, with pg_realtime's settings, so that the
    # standby's base backup copies them; its keeper adopts it as the primary.
    on_pg db1 initdb -D "$LAB/db1" -U postgres --auth=trust > "$LAB/db1.initdb.log"
    cat >> "$LAB/db1/postgresql.conf" <<EOF
shared_preload_libraries = 'pg_realtime'
max_connections = 200
realtime.max_consumers = 32
realtime.queue_size = 32MB
# A backend whose sidecar's host vanished without closing its socket goes within seconds,
# and with it the consumer slot it held (not after the kernel's 2-hour keepalive).
tcp_keepalives_idle = 5
tcp_keepalives_interval = 2
tcp_keepalives_count = 3
tcp_user_timeout = 10000
# The standby tries its primary again after half a second, not the default 5 s: while a
# synchronous standby is away every commit waits, and with it every message and presence
# change (after a restart of the primary, presence took 5 s to settle).
wal_retrieve_retry_interval = 500ms
EOF
    # The load generators publish from the edge without TLS (their client has none); the
    # sidecars' connections are TLS (pg_autoctl's --pg-hba-lan lines are hostssl).
    # The sidecars' login, TLS only, from the sidecar hosts alone.
    {
        echo "host all all $(addr edge)/32 trust"
        for h in sc1 sc2 sc3; do echo "hostssl postgres realtime_sidecar $(addr "$h")/32 trust"; done
    } >> "$LAB/db1/pg_hba.conf"
    local create
    for h in db1 db2; do
        create=(pg_autoctl create postgres --pgdata "$LAB/$h" --pgport 5432 --hostname "$(addr "$h")"
            --name "$h" --monitor "$monitor_uri" --auth trust --pg-hba-lan
            --ssl-ca-file "$ca" --server-cert "$LAB/tls/db.crt" --server-key "$LAB/tls/db.key")
        if [ "$h" = db1 ]; then
            # The adopted cluster in two steps, as pg_auto_failover documents them: `create
            # --run` starts its Postgres service beside the keeper's first transition, which
            # then may find Postgres running and refuse to initialise (its issues 111 and
            # 413; it stopped the test suite's short lab once). Without --run, create
            # initialises alone and returns; run then starts the services.
            on_pg db1 timeout 60 "${create[@]}" > "$LAB/db1.log" 2>&1
            on_pg db1 pg_autoctl run --pgdata "$LAB/db1" >> "$LAB/db1.log" 2>&1 &
            wait_for 60 "db1 as the primary" state_is db1 single
        else
            on_pg "$h" "${create[@]}" --run > "$LAB/$h.log" 2>&1 &
        fi
    done
    wait_for 120 "db1 primary and db2 secondary" state_is db1 primary db2 secondary
    # The lab's publisher writes a row of lab_audit with each message, in its transaction:
    # the checks look for messages received whose row the primary lacks after a failover.
    # Its persisted broadcasts go to private topics lab-persist-*, which Supabase's
    # `authenticated` role (pgbench/supabase_auth.sql) may write to, through the sidecars'
    # login. (Quietly: CREATE PUBLICATION warns that wal_level is not logical; pg_realtime
    # reads no WAL.)
    on_pg db1 env PGOPTIONS="-c client_min_messages=error" psql -X -q -h "$(addr db1)" -U postgres -d postgres -v ON_ERROR_STOP=1 \
        -c "CREATE EXTENSION pg_realtime" -c "CREATE PUBLICATION supabase_realtime" \
        -c "CREATE TABLE lab_audit (topic text, n int)" \
        -f "$root/scripts/sidecar_login.sql" -f "$root/pgbench/supabase_auth.sql" \
        -c "GRANT authenticated TO realtime_sidecar" \
        -c "CREATE POLICY lab_persist_write ON realtime.messages FOR INSERT TO authenticated
                WITH CHECK ((SELECT realtime.topic()) LIKE 'lab-persist-%')" >/dev/null
}

# The monitor's view: `state_is db1 primary db2 secondary` holds when each node's reported
# and goal states both are the one named.
state_is() {
    local states
    states=$(on_pg mon pg_autoctl show state --pgdata "$LAB/mon" --json 2>/dev/null) || return 1
    while [ $# -gt 0 ]; do
        STATES="$states" python3 -c '
import json, os, sys
nodes = {n["nodename"]: n for n in json.loads(os.environ["STATES"])}
n = nodes.get(sys.argv[1])
sys.exit(0 if n and n["current_group_state"] == sys.argv[2] and n["assigned_group_state"] == sys.argv[2] else 1)' "$1" "$2" ||
            return 1
        shift 2
    done
}

# wait_for SECONDS WHAT COMMAND...: until the command succeeds, or fail naming WHAT.
wait_for() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "lab: $what not ready within $seconds s (logs in $LAB)" >&2
            return 1
        fi
        sleep 0.5
    done
}

# One sidecar process on host $1, consumer $2, port $3, in the background; its PID goes to
# $LAB/$2.pid (the lab's two are sc1 and sc2 on port 4000; the cost check starts more).
# Routed sidecars share a budget of 120 drain calls a second (sidecar/README.md, "Past one
# machine"), so that the primary's calls do not multiply with them. It is set low enough to
# hold one process as it holds eight: at the checks' 2,000 msg/s, at a budget of 150 one
# process made 129 calls a second and eight made 152; at 120, 106 and 121. A wait after a
# hand-out of up to 100 ms: with the default 50, 8 processes each handed an eighth would make
# at least 20 calls a second each, 160 together, more than the budget.
sidecar() {
    local h=$1 name=$2 port=$3
    local dsn="host=$(addr db1),$(addr db2) port=5432 user=realtime_sidecar dbname=postgres target_session_attrs=read-write application_name=realtime-sidecar"
    # The PID is written by the process itself, which then becomes the sidecar (exec):
    # $! would name the background subshell instead.
    on "$h" bash -c 'echo $$ > "$0" && exec "$@"' "$LAB/$name.pid" \
        env BIND="$(addr "$h")" PORT="$port" DATABASE_URL="$dsn" DB_SSL=true \
        DB_SSL_CA_CERT="$LAB/tls/ca.crt" CONSUMER_NAME="$name" API_JWT_SECRET="$SECRET" \
        TRUSTED_PROXIES="$(addr edge)" DRAIN_CALLS_PER_SECOND="${DRAIN_CALLS_PER_SECOND:-120}" \
        DRAIN_LINGER_MAX_MS="${DRAIN_LINGER_MAX_MS:-100}" \
        LOG_LEVEL=info "$SIDECAR_BIN" > "$LAB/$name.log" 2>&1 &
}

sidecars_up() {
    for h in sc1 sc2; do
        sidecar "$h" "$h" 4000
    done
    for h in sc1 sc2; do
        wait_for 30 "sidecar $h" on "$h" curl -sf "http://$(addr "$h"):4000/healthz"
    done
}

proxy_up() {
    cat > "$LAB/haproxy.cfg" <<EOF
global
    # Two descriptors a connection, under the 20,000 open files a process may have here.
    maxconn 9000
    stats socket $LAB/haproxy.sock mode 600 level admin
defaults
    mode http
    timeout connect 5s
    # Above realtime-js's 25 s heartbeat; a WebSocket, once upgraded, lives by the tunnel's.
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
frontend realtime
    bind $(addr edge):8080
    default_backend sidecars
backend sidecars
    # Each topic's clients on one sidecar: the hash of the URL's route parameter (an app
    # sets it with createClient(url, key, { realtime: { params: { route: topic } } })),
    # consistent so that only a lost sidecar's keys move; without it, round robin.
    balance url_param route
    hash-type consistent
    option forwardfor
    # Which sidecar took the connection, for the checks (pgbench/lab_clients.mjs).
    http-response set-header X-Served-By %[srv_name]
    option redispatch
    retries 2
    # Two states of a sick sidecar, told apart. /healthz is 503 while it cannot drain (cut
    # off from the database, or the database away for everyone): the server goes to NOLB
    # (error-status L7OKC), which takes no new clients and keeps its connected ones, who are
    # told by the sidecar itself; during a failover every sidecar is NOLB at once and no
    # client is cut. No answer at all (the process killed, the host unplugged) fails the
    # check: after two the server is down and its sessions are shut (on-marked-down
    # shutdown-sessions), so its clients reconnect at once and land on another sidecar,
    # instead of waiting for realtime-js's heartbeat to notice.
    option httpchk GET /healthz
    http-check expect status 200,503
    http-check expect status 200 error-status L7OKC
    timeout check 1s
    default-server inter 1s fall 2 rise 2 weight 100 on-marked-down shutdown-sessions
    server sc1 $(addr sc1):4000 check
    server sc2 $(addr sc2):4000 check
    # A third sidecar host, ready for the checks to add ("enable server sidecars/sc3" on the
    # admin socket): consistent hashing moves only the keys it takes, and only for new
    # connections.
    server sc3 $(addr sc3):4000 check disabled
EOF
    on edge haproxy -W -db -f "$LAB/haproxy.cfg" > "$LAB/haproxy.log" 2>&1 &
    wait_for 15 "HAProxy" on edge curl -sf "http://$(addr edge):8080/healthz"
}

up() {
    if [ -e "$CG" ] || ip netns list | grep -q "^$NS-"; then
        echo "lab: already up (scripts/lab.sh down first)" >&2
        return 1
    fi
    install
    rm -rf "$LAB"
    mkdir -p "$LAB"
    certificates
    hosts_up
    lab_file
    database_up
    sidecars_up
    proxy_up
    echo "lab up: HAProxy http://$(addr edge):8080 (in $NS-edge), sidecars $(addr sc1) $(addr sc2)," \
        "databases $(addr db1) $(addr db2), monitor $(addr mon); files in $LAB"
}

# signal_all SIGNAL SECONDS: the signal to every process in the hosts' cgroups, then wait
# (at most SECONDS) until none is left.
signal_all() {
    local pids deadline=$((SECONDS + $2))
    pids=$(cat "$CG"/*/cgroup.procs 2>/dev/null || true)
    [ -z "$pids" ] || kill "-$1" $pids 2>/dev/null || true
    while [ -n "$(cat "$CG"/*/cgroup.procs 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.2
    done
}

# Every process of every host, by PID from the hosts' cgroups: SIGTERM (the keepers stop
# their Postgres with it), then SIGKILL after 20 s; then the hosts and cgroups.
down() {
    if [ -d "$CG" ]; then
        signal_all TERM 20
        signal_all KILL 10
        for d in "$CG"/*/; do [ -d "$d" ] && rmdir "$d"; done
        rmdir "$CG"
    fi
    for n in $(ip netns list | awk '{print $1}' | grep "^$NS-" || true); do
        ip netns del "$n"
    done
}

# What the lab makes, still there: namespaces, cgroups, processes in them.
left() {
    local found=0
    if ip netns list | grep -q "^$NS-"; then
        echo "lab: namespaces left: $(ip netns list | grep "^$NS-" | awk '{print $1}' | tr '\n' ' ')" >&2
        found=1
    fi
    if [ -e "$CG" ]; then
        echo "lab: cgroup $CG left, processes: $(cat "$CG"/*/cgroup.procs 2>/dev/null | tr '\n' ' ')" >&2
        found=1
    fi
    return $found
}

case "${1:-}" in
up)
    trap '[ $? -eq 0 ] || down' EXIT
    up
    ;;
down) down ;;
left) left ;;
sidecar)
    # scripts/lab.sh sidecar HOST CONSUMER PORT: one more sidecar process (pgbench/lab.py's
    # cost check), stopped by `down` with the rest.
    sidecar "$2" "$3" "$4"
    ;;
test)
    shift
    trap down EXIT
    up
    LAB_DIR=$LAB SIDECAR_BIN=$SIDECAR_BIN python3 pgbench/lab.py "$@"
    ;;
*)
    echo "usage: $0 up | test [--short] | down | left | sidecar HOST CONSUMER PORT" >&2
    exit 2
    ;;
esac
