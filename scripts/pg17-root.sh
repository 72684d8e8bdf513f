# Sourced, not run: where the PostgreSQL 17 root lives and how to run a command in it.
# Debian 12 ships only PostgreSQL 15; Debian 13's postgresql-17 packages need its libc, so
# they live in a minimal Debian 13 root made by scripts/install-pg17.sh.

PG17_ROOT=${PG17_ROOT:-/var/lib/pg_realtime/pg17-root}
# pgrx reads this pg_config: it answers for the root's PostgreSQL 17 with the root's path
# prefixed, so pgrx finds the headers and installs into the root.
PG17_PG_CONFIG=${PG17_PG_CONFIG:-/var/lib/pg_realtime/pg17-bin/pg_config}

# Runs "$@" as root inside the root, with /proc and /dev mounted in a private mount
# namespace: the mounts vanish with the command's last process, so nothing is ever left
# mounted on the host (a later `rm -rf` of the root or a second run cannot trip on them).
in_pg17_root() {
    unshare --mount --propagation private sh -ec '
        root=$1; shift
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        exec chroot "$root" "$@"
    ' sh "$PG17_ROOT" "$@"
}
