#!/usr/bin/env bash
# pg_upgrade from PostgreSQL 15 to 17, the way Supabase moves a project to 17, on a database
# Supabase made with pg_realtime installed, in a fresh Debian 13 root:
#   scripts/pg_upgrade.sh    (as root, after scripts/package.sh built target/debian/)
# PostgreSQL 17 and the extension's 17 package are installed with apt; Debian 12's
# postgresql-15 and the libraries Debian 13 lacks for it (ICU 72, OpenLDAP 2.5) are unpacked
# into the root with dpkg-deb -x, with the extension's 15 package. A 15 cluster is made like
# Supabase's image and given the Supabase fixture (its policies, the published chat table, a
# persisted client broadcast, a row the app inserted into realtime.messages), pg_realtime and
# the sidecar's login; its catalog is described (regress/fixtures/supabase/describe.sql, as
# the dump test describes it, with the extension's members, recorded dependencies, definer
# functions and roles), and pg_upgrade runs. Its dump loses the extension's recorded
# dependencies on the app's objects and the internal delivery triggers (shown); the
# sidecar's first connection makes them again (extension/README.md, "Versions and
# upgrades"). Then the realtime-js tests of a database Supabase made
# (sidecar/e2e/supabase_database.test.mjs: private channels, the app's trigger, Postgres
# Changes, presence, a row inserted into realtime.messages, the replay of the broadcast
# persisted on 15) run against the upgraded cluster with this tree's sidecar, and the 17
# cluster's description must be the 15 one's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/debian-root.sh"
out="$root/target/debian"
ext_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/extension/Cargo.toml" | head -1)
for pg in 15 17; do
    [ -e "$out/postgresql-$pg-pg-realtime_${ext_version}_amd64.deb" ] ||
        { echo "run scripts/package.sh first: no postgresql-$pg-pg-realtime_${ext_version}_amd64.deb" >&2; exit 1; }
done
work=$(mktemp -d /tmp/pg_realtime_upgrade.XXXXXX)
dir=/var/lib/pg_realtime/pg-upgrade-test
port=25433
trap 'in_root "$dir" sh -c "runuser -u postgres -- /usr/lib/postgresql/17/bin/pg_ctl -D /tmp/new -m immediate stop" >/dev/null 2>&1 || true
      rm -rf --one-file-system "$work" "$dir"' EXIT

base=/var/lib/pg_realtime/clean-trixie
pristine trixie "$base"
rm -rf --one-file-system "$dir"
cp -a "$base" "$dir"
mkdir -p "$dir/tmp/debs" "$dir/tmp/old-debs"
cp "$out/postgresql-17-pg-realtime_${ext_version}_amd64.deb" "$dir/tmp/debs/"
echo "== PostgreSQL 17 and postgresql-17-pg-realtime from Debian 13"
# GnuTLS for Debian 12's OpenLDAP 2.5 (the same soname in Debian 13).
in_root "$dir" sh -ec "apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends /tmp/debs/*.deb libgnutls30t64" \
    > "$work/apt.log" 2>&1 || { tail -n 40 "$work/apt.log" >&2; exit 1; }
echo "== PostgreSQL 15 from Debian 12, unpacked with dpkg-deb -x"
(cd "$work" && apt-get download postgresql-15 postgresql-client-15 libicu72 libldap-2.5-0 > "$work/download.log" 2>&1) ||
    { tail -n 20 "$work/download.log" >&2; exit 1; }
for deb in "$work"/*.deb "$out/postgresql-15-pg-realtime_${ext_version}_amd64.deb"; do
    dpkg-deb -x "$deb" "$dir"
    echo "unpacked $(basename "$deb")"
done
missing=$(in_root "$dir" sh -c 'ldd /usr/lib/postgresql/15/bin/postgres /usr/lib/postgresql/15/lib/pg_realtime.so | grep "not found" || true')
[ -z "$missing" ] || { echo "PostgreSQL 15 lacks libraries in the root: $missing" >&2; exit 1; }

mkdir -p "$dir/tmp/fixture"
cp "$root"/regress/fixtures/supabase/*.sql "$root/scripts/sidecar_login.sql" "$dir/tmp/fixture/"
cat > "$dir/tmp/fixture/app_data.sql" <<'SQL'
-- What a project has in flight when it is upgraded: a client broadcast kept for replay (as
-- the sidecar writes it for a persist), and a row the app inserted into realtime.messages.
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
VALUES ('66666666-6666-4666-8666-666666666666', 'room:lobby', true, 'kept', '{"text": "kept across pg_upgrade"}',
        now() + interval '3 days');
INSERT INTO realtime.messages (topic, extension, event, payload, private)
VALUES ('room:lobby', 'broadcast', 'inserted', '{"text": "an integration wrote this"}', true);
SQL
# The extension's own facts beside describe.sql's: its members, what it is recorded as
# depending on (binary-upgrade dumps re-create members one by one, and these records are
# what lets a dump order the app's objects first), its definer functions and their owners,
# its roles.
cat > "$dir/tmp/fixture/extension_facts.sql" <<'SQL'
WITH ext AS (SELECT oid, extname, extowner, extconfig FROM pg_extension WHERE extname = 'pg_realtime')
SELECT line FROM (
    SELECT format('extension %s owner=%s config=%s', extname, extowner::regrole, extconfig::regclass[]) AS line FROM ext
    UNION ALL
    -- A member table's row type is its table's (PostgreSQL 17's binary upgrade records it as
    -- a member too: ALTER EXTENSION ADD TABLE adds it there).
    SELECT format('member %s', pg_describe_object(d.classid, d.objid, d.objsubid))
    FROM pg_depend d, ext WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
      AND NOT (d.classid = 'pg_type'::regclass
               AND EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = d.objid
                           AND (t.typrelid <> 0 OR EXISTS (SELECT 1 FROM pg_type e WHERE e.oid = t.typelem AND e.typrelid <> 0))))
    UNION ALL
    SELECT format('extension depends on %s deptype=%s', pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid), d.deptype)
    FROM pg_depend d, ext WHERE d.classid = 'pg_extension'::regclass AND d.objid = ext.oid
    UNION ALL
    SELECT format('definer %s owner=%s config=%s', p.oid::regprocedure, p.proowner::regrole, p.proconfig)
    FROM pg_proc p WHERE p.pronamespace = 'realtime'::regnamespace AND p.prosecdef
    UNION ALL
    SELECT format('role %s super=%s login=%s bypassrls=%s', rolname, rolsuper, rolcanlogin, rolbypassrls)
    FROM pg_roles WHERE rolname IN ('realtime_prober', 'realtime_sidecar')
) f ORDER BY 1;
SQL
chmod -R a+rX "$dir/tmp/fixture"

# $1: 15 or 17; the rest: what runs as postgres in the root.
as_pg() { in_root "$dir" runuser -u postgres -- "$@"; }
psql_admin() { as_pg psql -X -q -v ON_ERROR_STOP=1 -h /tmp -p "$port" -U supabase_admin -d postgres "$@"; }
conf() {
    printf "shared_preload_libraries = 'pg_realtime'\nwal_level = logical\nport = %s\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '/tmp'\njit = off\n" "$port" \
        >> "$dir/tmp/$1/postgresql.conf"
}
# Spellings that mean the same on either version are made one: an ACL equal to its object's
# default ({=X/owner,owner=X/owner} for a function, {owner=arwdDxt/owner} for a table),
# which pg_upgrade's dump restores as the default itself, and PostgreSQL 17's MAINTAIN
# privilege (m), which an owner holds there by default.
describe() {
    { psql_admin -At -f /tmp/fixture/describe.sql; psql_admin -At -f /tmp/fixture/extension_facts.sql; } |
        sed -e 's/acl={=X\/\([a-z_]*\),\1=X\/\1}/acl=/' -e 's/=\([a-zA-Z]*\)m\//=\1\//g' \
            -e 's/acl={\([a-z_]*\)=arwdDxt\/\1}/acl=/' > "$work/$1.txt"
    wc -l < "$work/$1.txt"
}

echo "== a 15 cluster made like Supabase's image, the fixture, pg_realtime"
as_pg /usr/lib/postgresql/15/bin/initdb -D /tmp/old -U supabase_admin --auth=trust > /dev/null
conf old
as_pg /usr/lib/postgresql/15/bin/pg_ctl -D /tmp/old -l /tmp/old.log -w start > /dev/null
for f in 01_platform 02_realtime_schema 03_realtime_runtime 04_tutorial_app; do
    psql_admin -f "/tmp/fixture/$f.sql" > /dev/null
done
psql_admin -c "CREATE EXTENSION pg_realtime" -f /tmp/fixture/sidecar_login.sql -f /tmp/fixture/app_data.sql > /dev/null
psql_admin -At -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ', pg_realtime ' || extversion FROM pg_extension WHERE extname = 'pg_realtime'"
echo "described: $(describe before) facts"
as_pg /usr/lib/postgresql/15/bin/pg_ctl -D /tmp/old -m fast -w stop > /dev/null

echo "== pg_upgrade to 17"
as_pg /usr/lib/postgresql/17/bin/initdb -D /tmp/new -U supabase_admin --auth=trust > /dev/null
conf new
# pg_upgrade writes its logs into the current directory and the new data directory.
in_root "$dir" sh -ec 'cd /tmp && runuser -u postgres -- /usr/lib/postgresql/17/bin/pg_upgrade \
    -b /usr/lib/postgresql/15/bin -B /usr/lib/postgresql/17/bin -d /tmp/old -D /tmp/new -U supabase_admin -p 25434 -P 25435' \
    > "$work/pg_upgrade.log" 2>&1 || { tail -n 40 "$work/pg_upgrade.log" >&2; exit 1; }
grep -E '^Upgrade Complete' "$work/pg_upgrade.log"
as_pg /usr/lib/postgresql/17/bin/pg_ctl -D /tmp/new -l /tmp/new.log -w start > /dev/null
psql_admin -At -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ', pg_realtime ' || extversion FROM pg_extension WHERE extname = 'pg_realtime'"
# What pg_upgrade's dump left out, until a sidecar connects (sql/app_objects.sql).
psql_admin -At -c "SELECT 'before a sidecar connects: ' || count(*) || ' of the extension''s 3 dependencies on the app''s objects, '
        || (SELECT count(*) FROM pg_trigger WHERE tgfoid = 'realtime.deliver_inserted()'::regprocedure) || ' delivery triggers'
    FROM pg_depend WHERE classid = 'pg_extension'::regclass AND deptype = 'n'
      AND refobjid IN ('realtime.messages'::regclass, 'realtime.topic()'::regprocedure, 'realtime.messages_9999_12_31'::regclass)"

echo "== the upgraded database served: realtime-js against this tree's sidecar"
export PG_REALTIME_SUPABASE_DSN="host=127.0.0.1 port=$port user=supabase_admin dbname=postgres"
export PG_REALTIME_SUPABASE_SIDECAR_DSN="host=127.0.0.1 port=$port user=realtime_sidecar dbname=postgres"
export PG_REALTIME_SIDECAR_DSN=$PG_REALTIME_SUPABASE_SIDECAR_DSN
(cd "$root/sidecar/e2e" && SIDECAR_BIN="$root/target/debug/realtime-sidecar" \
    node --test --test-concurrency=1 --test-timeout=60000 supabase_database.test.mjs) > "$work/e2e.log" 2>&1 ||
    { cat "$work/e2e.log" >&2; exit 1; }
grep -E '^# (pass|fail)' "$work/e2e.log"
# The sidecar made the delivery triggers pg_upgrade left out, one per leaf.
psql_admin -At -c "SELECT count(*) FILTER (WHERE t.oid IS NOT NULL) || ' of ' || count(*) || ' leaves of realtime.messages have their delivery trigger'
    FROM pg_inherits i LEFT JOIN pg_trigger t ON t.tgrelid = i.inhrelid AND t.tgisinternal
        AND t.tgfoid = 'realtime.deliver_inserted()'::regprocedure
    WHERE i.inhparent = 'realtime.messages'::regclass"
echo "described: $(describe after) facts"
if ! diff "$work/before.txt" "$work/after.txt" > "$work/catalog.diff"; then
    echo "the catalog changed across pg_upgrade and the sidecar's first connection:" >&2
    cat "$work/catalog.diff" >&2
    exit 1
fi
echo "the catalog is the same after pg_upgrade and the sidecar's first connection"
as_pg /usr/lib/postgresql/17/bin/pg_ctl -D /tmp/new -m fast -w stop > /dev/null
