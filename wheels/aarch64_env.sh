# Sourced by build_aarch64.sh and check_aarch64.sh: the aarch64 toolchain,
# qemu-user, and arm64 CPython interpreters to test wheels with.
#
# Debian is the only source of arm64 interpreters here (python.org is not
# reachable, and PyPI ships no interpreters): bookworm has python3.11 and
# trixie python3.13.  Their packages are fetched with a private apt
# configuration (nothing is added to the host's sources or architectures)
# and unpacked into wheels/work/aarch64/root-3.X, kept between runs.
# CPython 3.10 and 3.12 exist in no Debian suite any more, neither as arm64
# binaries nor as source packages, so there is no interpreter to run their
# wheels with: GUEST_VERSIONS lists what can be tested.
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
AWORK=$ROOT/wheels/work/aarch64
mkdir -p "$AWORK"

need_apt=()
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.a ] || need_apt+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "apt: installing ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Python version -> Debian suite that ships it for arm64.
declare -A GUEST_SUITE=([3.11]=bookworm [3.13]=trixie)
GUEST_VERSIONS=(3.11 3.13)
declare -A GUEST_PKGS=(
    [3.11]="libc6 libgcc-s1 libcrypt1 python3.11-minimal libpython3.11-minimal
            libpython3.11-stdlib libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5
            libsqlite3-0 libuuid1 libncursesw6 libtinfo6 libreadline8 libnsl2 libtirpc3
            libdb5.3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2
            libkeyutils1"
    [3.13]="libc6 libgcc-s1 gcc-14-base libcrypt1 python3.13-minimal libpython3.13-minimal
            libpython3.13-stdlib libexpat1 zlib1g libffi8 libssl3t64 libbz2-1.0 liblzma5
            libsqlite3-0 libuuid1 libncursesw6 libtinfo6 libreadline8t64 libdb5.3t64
            libzstd1 libselinux1 libpcre2-8-0"
)

# guest_python VERSION: prints the path of a wrapper that runs Debian's arm64
# pythonVERSION under qemu, unpacking its packages first if needed.  The
# wrapper is its own sys.executable (-0), so tests that start a child
# interpreter start an arm64 one (there is no binfmt_misc here).
guest_python() {
    local v=$1 suite=${GUEST_SUITE[$1]:-}
    [ -n "$suite" ] || { echo "no arm64 CPython $v in Debian" >&2; return 1; }
    local sysroot=$AWORK/root-$v apt=$AWORK/apt-$suite wrapper=$AWORK/bin/python$v
    if [ ! -x "$sysroot/usr/bin/python$v" ]; then
        mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$AWORK/debs-$v"
        echo "deb [arch=arm64] http://deb.debian.org/debian $suite main" >"$apt/sources.list"
        local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
                    -o Dir::State::status=/dev/null -o APT::Architecture=arm64
                    -o APT::Architectures::=arm64 -o Debug::NoLocking=1)
        apt-get "${opts[@]}" update -qq >/dev/null
        # shellcheck disable=SC2086
        (cd "$AWORK/debs-$v" && apt-get "${opts[@]}" download -qq ${GUEST_PKGS[$v]} 2>/dev/null)
        rm -rf "$sysroot" && mkdir -p "$sysroot"
        for d in "$AWORK/debs-$v"/*.deb; do dpkg -x "$d" "$sysroot"; done
        # Merged /usr (trixie): the loader is looked up as /lib/ld-linux-aarch64.so.1.
        [ -e "$sysroot/lib" ] || ln -s usr/lib "$sysroot/lib"
    fi
    mkdir -p "$AWORK/bin"
    cat >"$wrapper" <<EOF
#!/bin/sh
exec qemu-aarch64 -L "$sysroot" -0 "\$0" "$sysroot/usr/bin/python$v" "\$@"
EOF
    chmod +x "$wrapper"
    echo "$wrapper"
}
