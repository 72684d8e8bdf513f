# Sourced, not run: the minimal Debian roots the packages are tested in
# (scripts/package.sh) and pg_upgrade is run in (scripts/pg_upgrade.sh).

# A pristine Debian root of release $1 at $2, made once.
pristine() {
    local release=$1 dir=$2
    [ -e "$dir/debootstrap.done" ] && return
    rm -rf --one-file-system "$dir"
    mkdir -p "$(dirname "$dir")"
    debootstrap --variant=minbase "$release" "$dir" http://deb.debian.org/debian > "$dir.debootstrap.log" 2>&1 ||
        { tail -n 40 "$dir.debootstrap.log" >&2; exit 1; }
    printf '#!/bin/sh\nexit 101\n' > "$dir/usr/sbin/policy-rc.d"
    chmod +x "$dir/usr/sbin/policy-rc.d"
    mkdir -p "$dir/etc/postgresql-common"
    echo 'create_main_cluster = false' > "$dir/etc/postgresql-common/createcluster.conf"
    touch "$dir/debootstrap.done"
}

# Runs "$@" as root in the root at $1, with /proc and /dev mounted in a private mount
# namespace (gone with the command's last process) and the host's resolver for apt.
in_root() {
    local dir=$1
    shift
    unshare --mount --propagation private sh -ec '
        root=$1; shift
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        exec chroot "$root" "$@"
    ' sh "$dir" "$@"
}
