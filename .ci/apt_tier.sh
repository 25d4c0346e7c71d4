#!/usr/bin/env bash
# .ci/apt_tier.sh TIER WHY PACKAGE...
#
# Installs the Debian packages one test tier of `make test` needs, saying
# first what it will install and why, and never changing the system beyond
# that: apt is asked first (apt-get -s, a simulation) and, if installing them
# would upgrade or remove any installed package, nothing is installed and one
# line says so (Debian's python3.11-dbg pins the exact python3.11 it was
# built with, so on an image older than the archive it upgrades the system
# Python: that is the user's call, not a test's).
#
# Exit 0: the packages are installed (or already were).  Exit 1: the tier
# cannot run here; the line printed says why and what to run instead.
#
#   PYLIMITER_NO_APT=1           never run apt-get: skip the tier instead
#   PYLIMITER_APT_UPGRADE=1      allow the upgrades apt says it needs
set -uo pipefail

tier=$1 why=$2
shift 2
missing=()
for pkg in "$@"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get install --no-install-recommends ${missing[*]}"
echo "== $tier needs ${missing[*]} ($why), not installed"
skip() {
    echo "== $tier NOT run: $1"
    exit 1
}
[ "${PYLIMITER_NO_APT:-}" = 1 ] && skip "PYLIMITER_NO_APT=1 (install them yourself: $cmd)"
command -v apt-get >/dev/null 2>&1 || skip "no apt-get here (install ${missing[*]} by other means)"
[ "$(id -u)" = 0 ] || skip "installing them needs root (sudo $cmd)"

echo "   asking apt what that would change (apt-get update, then apt-get -s install)..."
apt-get update -qq >/dev/null 2>&1 || skip "apt-get update failed (no network?); $cmd when it works"
sim=$(apt-get -s install --no-install-recommends --no-upgrade "${missing[@]}" 2>&1) \
    || skip "apt cannot install them: $(printf '%s\n' "$sim" | grep -m1 '^E:' || echo "$sim" | tail -1)"
# "Inst NAME (NEW ...)" installs, "Inst NAME [OLD] (NEW ...)" upgrades,
# "Remv NAME [OLD]" removes.
new=$(printf '%s\n' "$sim" | awk '/^Inst / && $3 !~ /^\[/ {print $2}' | xargs)
changed=$(printf '%s\n' "$sim" | awk '
    /^Inst / && $3 ~ /^\[/ {gsub(/[][()]/, "", $3); gsub(/[()]/, "", $4); printf "%s %s -> %s, ", $2, $3, $4}
    /^Remv / {printf "%s removed, ", $2}' | sed 's/, $//')
if [ -n "$changed" ] && [ "${PYLIMITER_APT_UPGRADE:-}" != 1 ]; then
    n=$(printf '%s\n' "$sim" | grep -cE '^(Inst [^ ]+ \[|Remv )')
    skip "installing ${missing[*]} would also upgrade or remove $n installed package(s): $changed.  PYLIMITER_APT_UPGRADE=1 allows it, or run: $cmd"
fi
echo "   installing $(wc -w <<<"$new") new package(s): $new"
[ -n "$changed" ] && echo "   and changing (PYLIMITER_APT_UPGRADE=1): $changed"
start=$(date +%s)
log=$(mktemp)
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade \
        "${missing[@]}" >"$log" 2>&1; then
    tail -5 "$log"
    rm -f "$log"
    skip "apt-get install failed (above)"
fi
rm -f "$log"
echo "   installed in $(( $(date +%s) - start )) s"
