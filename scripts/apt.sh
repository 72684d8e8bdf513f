# Sourced: apt_install PACKAGE... installs from Debian the packages not yet installed;
# returns 0 when it installed any, 1 when every one was there already.
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 1
    echo "installing Debian packages: ${missing[*]}"
    # exit, not return: called in a condition, a failure would not stop the caller.
    apt-get update -qq || exit 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" || exit 1
}
