# Sourced by build_aarch64.sh and check_aarch64.sh: the aarch64 toolchain,
# qemu-user, and arm64 CPython interpreters to test wheels with.
#
# Debian ships arm64 python3.11 (bookworm) and python3.13 (trixie): their
# packages are fetched with a private apt configuration (nothing is added to
# the host's sources or architectures) and unpacked into
# wheels/work/aarch64/root-3.X, kept between runs.  CPython 3.10 and 3.12 are
# in no Debian suite any more, neither as arm64 binaries nor as sources, and
# python.org is not reachable; Ubuntu's archive (archive.ubuntu.com, whose
# arm64 binaries live on ports.ubuntu.com, not reachable here) serves their
# source packages, whose .orig tarballs are python.org's release tarballs.
# Those are pinned by sha256 (GUEST_SOURCE), cross-compiled with Debian's
# aarch64 gcc against bookworm's arm64 libraries and installed into
# root-3.X beside those libraries.  They are plain python.org builds (no
# Ubuntu patches), without PGO/LTO: correct, not representative for speed.
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# The sid roots and pyenv's interpreters (pyenv_python).
source "$ROOT/wheels/sid_env.sh"
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
# Python version -> "Ubuntu source package, version, suite, sha256 of the
# .orig tarball (from Ubuntu's Sources index)" for the ones built from source.
declare -A GUEST_SOURCE=(
    [3.10]="python3.10 3.10.12 jammy afb74bf19130e7a47d10312c8f5e784f24e0527981eab68e20546cfb865830b8"
    [3.12]="python3.12 3.12.3 noble 56bfef1fdfc1221ce6720e43a661e3eb41785dd914ce99698d8c7896af4bdaa1"
)
declare -A GUEST_PKGS=(
    [3.11]="libc6 libgcc-s1 libcrypt1 python3.11-minimal libpython3.11-minimal
            libpython3.11-stdlib libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5
            libsqlite3-0 libuuid1 libncursesw6 libtinfo6 libreadline8 libnsl2 libtirpc3
            libdb5.3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2
            libkeyutils1"
    # Built from source: the runtime libraries and the -dev packages of the
    # modules the suite imports (_ssl, _ctypes, zlib, _bz2, _lzma, _uuid, ...).
    [source]="libc6 libgcc-s1 libcrypt1 libcrypt-dev zlib1g zlib1g-dev libffi8 libffi-dev
              libssl3 libssl-dev libbz2-1.0 libbz2-dev liblzma5 liblzma-dev libuuid1 uuid-dev
              libexpat1 libexpat1-dev libsqlite3-0 libsqlite3-dev"
    [3.13]="libc6 libgcc-s1 gcc-14-base libcrypt1 python3.13-minimal libpython3.13-minimal
            libpython3.13-stdlib libexpat1 zlib1g libffi8 libssl3t64 libbz2-1.0 liblzma5
            libsqlite3-0 libuuid1 libncursesw6 libtinfo6 libreadline8t64 libdb5.3t64
            libzstd1 libselinux1 libpcre2-8-0"
)

# unpack_debs SUITE VERSION SYSROOT PACKAGES...: fetch the arm64 packages from
# Debian's SUITE (private apt state) and unpack them into SYSROOT.
unpack_debs() {
    local suite=$1 v=$2 sysroot=$3; shift 3
    local apt=$AWORK/apt-$suite
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$AWORK/debs-$v"
    echo "deb [arch=arm64] http://deb.debian.org/debian $suite main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
                -o Dir::State::status=/dev/null -o APT::Architecture=arm64
                -o APT::Architectures::=arm64 -o Debug::NoLocking=1)
    apt-get "${opts[@]}" update -qq >/dev/null
    (cd "$AWORK/debs-$v" && apt-get "${opts[@]}" download -qq "$@" 2>/dev/null)
    rm -rf "$sysroot" && mkdir -p "$sysroot"
    for d in "$AWORK/debs-$v"/*.deb; do dpkg -x "$d" "$sysroot"; done
    # Merged /usr (trixie): the loader is looked up as /lib/ld-linux-aarch64.so.1.
    [ -e "$sysroot/lib" ] || ln -s usr/lib "$sysroot/lib"
}

# build_cpython VERSION SYSROOT: python.org's CPython VERSION (GUEST_SOURCE)
# cross-compiled for aarch64 and installed into SYSROOT (/usr), which holds
# bookworm's arm64 libraries.  The build interpreter is pyenv's CPython of
# the same minor version, as a cross build needs.
build_cpython() {
    local v=$1 sysroot=$2 pkg ver suite sum
    read -r pkg ver suite sum <<<"${GUEST_SOURCE[$v]}"
    local tarball=$AWORK/${pkg}_$ver.orig.tar.xz src=$AWORK/cpython-$ver log=$AWORK/cpython-$v.log
    local build_py
    build_py=$(pyenv_python "$v")
    [ -n "$build_py" ] || { echo "FAIL: cross-building CPython $v needs a CPython $v to build with (pyenv)"; return 1; }
    if ! echo "$sum  $tarball" | sha256sum -c --status 2>/dev/null; then
        curl -fsS -m 300 -o "$tarball" \
            "http://archive.ubuntu.com/ubuntu/pool/main/p/$pkg/${pkg}_$ver.orig.tar.xz" \
            || { echo "FAIL: ${pkg}_$ver.orig.tar.xz ($suite) from archive.ubuntu.com"; return 1; }
        echo "$sum  $tarball" | sha256sum -c --status \
            || { echo "FAIL: ${pkg}_$ver.orig.tar.xz: sha256 differs from the pinned one"; return 1; }
    fi
    # shellcheck disable=SC2086
    unpack_debs bookworm "$v" "$sysroot" ${GUEST_PKGS[source]}
    # The -dev packages' .so links are absolute (/lib/...): point them into
    # the sysroot, or the cross linker finds nothing and the module is skipped.
    (cd "$sysroot" && find . -type l -lname '/*' | while read -r l; do
        ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" ".$(readlink "$l")")" "$l"; done)
    rm -rf "$src" && tar -xf "$tarball" -C "$AWORK" && mv "$AWORK/Python-$ver" "$src"
    local inc="-I$sysroot/usr/include -I$sysroot/usr/include/aarch64-linux-gnu"
    local lib=$sysroot/usr/lib/aarch64-linux-gnu:$sysroot/lib/aarch64-linux-gnu
    echo "arm64 CPython $v: cross-building python.org's $ver (log: $log)"
    (
        cd "$src"
        PATH=$(dirname "$build_py"):$PATH
        export PKG_CONFIG_LIBDIR=$sysroot/usr/lib/aarch64-linux-gnu/pkgconfig:$sysroot/usr/share/pkgconfig
        export PKG_CONFIG_SYSROOT_DIR=$sysroot
        # A cross build cannot run the configure probes that need the target.
        ./configure --build=x86_64-linux-gnu --host=aarch64-linux-gnu --prefix=/usr \
            --without-ensurepip --with-build-python="$build_py" \
            CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ AR=aarch64-linux-gnu-ar \
            READELF=aarch64-linux-gnu-readelf ac_cv_file__dev_ptmx=yes ac_cv_file__dev_ptc=no \
            ac_cv_buggy_getaddrinfo=no CPPFLAGS="$inc" \
            LDFLAGS="-L${lib//:/ -L} -Wl,-rpath-link,$lib"
        # 3.10's setup.py looks for ffi.h in LIBFFI_INCLUDEDIR alone, which
        # pkg-config gives as /usr/include; Debian keeps it in the multiarch folder.
        sed -i "s|^LIBFFI_INCLUDEDIR=.*|LIBFFI_INCLUDEDIR=	$sysroot/usr/include/aarch64-linux-gnu|" Makefile
        make -j"$(nproc)"
        make install DESTDIR="$sysroot"
    ) >"$log" 2>&1 || { tail -30 "$log"; echo "FAIL: cross-building CPython $v (log: $log)"; return 1; }
    rm -rf "$src"
}

# guest_python VERSION: prints the path of a wrapper that runs an arm64
# pythonVERSION under qemu (Debian's, or python.org's built from source),
# making its root first if needed.  The wrapper is its own sys.executable
# (-0), so tests that start a child interpreter start an arm64 one (there is
# no binfmt_misc here).
guest_python() {
    local v=$1 sysroot=$AWORK/root-$1 wrapper=$AWORK/bin/python$1
    if [ ! -x "$sysroot/usr/bin/python$v" ]; then
        if [ -n "${GUEST_SUITE[$v]:-}" ]; then
            # shellcheck disable=SC2086
            unpack_debs "${GUEST_SUITE[$v]}" "$v" "$sysroot" ${GUEST_PKGS[$v]} >&2
        elif [ -n "${GUEST_SOURCE[$v]:-}" ]; then
            build_cpython "$v" "$sysroot" >&2 || return 1
        else
            echo "no arm64 CPython $v here" >&2
            return 1
        fi
    fi
    mkdir -p "$AWORK/bin"
    cat >"$wrapper" <<EOF
#!/bin/sh
exec qemu-aarch64 -L "$sysroot" -0 "\$0" "$sysroot/usr/bin/python$v" "\$@"
EOF
    chmod +x "$wrapper"
    echo "$wrapper"
}
