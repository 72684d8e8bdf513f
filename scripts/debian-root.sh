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

# The .debs apt fetches, kept on the host per release and shared by every root of that
# release (the PostgreSQL 17 root, the package tests, the pg_upgrade test): each package is
# downloaded once per machine, not once per root and run.
APT_CACHE=${APT_CACHE:-/var/cache/pg_realtime/apt}

# Runs "$@" as root in the root at $1, with /proc and /dev mounted in a private mount
# namespace (gone with the command's last process), the release's shared apt cache as its
# /var/cache/apt/archives, and the host's resolver for apt.
in_root() {
    local dir=$1 release
    shift
    release=$(sed -n 's/^VERSION_CODENAME=//p' "$dir/etc/os-release")
    mkdir -p "$APT_CACHE/${release:?no VERSION_CODENAME in $dir/etc/os-release}/partial"
    unshare --mount --propagation private sh -ec '
        root=$1; cache=$2; shift 2
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount --bind "$cache" "$root/var/cache/apt/archives"
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        exec chroot "$root" "$@"
    ' sh "$dir" "$APT_CACHE/$release" "$@"
}
