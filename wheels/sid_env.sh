# Sourced by pythons.sh and the build/check scripts: where the Debian sid
# roots live and how to run a command inside one.
#
# CPython 3.14 and 3.15 reach this machine only as Debian sid packages
# (python.org is not reachable, PyPI ships no interpreters).  pythons.sh
# builds one sid root per architecture with debootstrap under
# wheels/work/sid/<arch>; `in_sid ARCH CMD...` runs CMD there through chroot,
# in a private mount namespace (unshare -m), so the /proc, /dev, worktree and
# cache mounts it needs vanish with the command and the host is left as it
# was.  The arm64 root runs under qemu-aarch64-static through a binfmt_misc
# entry registered only while an arm64 command runs (see binfmt_on).
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
SID_WORK=$ROOT/wheels/work/sid
SID_VERSIONS=(3.14 3.15)
# Whether version $1 comes from the sid roots (the others from pyenv).
is_sid_version() { [[ " ${SID_VERSIONS[*]} " == *" $1 "* ]]; }
SID_MIRROR=${SID_MIRROR:-http://deb.debian.org/debian}

sid_root() { echo "$SID_WORK/$1"; }

# pyenv_python VERSION: the newest of pyenv's x86_64 CPythons VERSION under
# $PYENV (PYENV_VERSIONS, else /root/.pyenv/versions), or nothing.
PYENV=${PYENV_VERSIONS:-/root/.pyenv/versions}
pyenv_python() { ls -d "$PYENV"/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1 || true; }

# The binfmt_misc entry that lets the kernel run arm64 ELF files through the
# static qemu.  'F' opens the interpreter at registration, so it works inside
# the chroot without a copy of qemu there; the entry has its own name and is
# removed by binfmt_off, so nothing is left registered after a run (so: one
# arm64 command at a time; the first to end removes it).  An existing
# qemu-aarch64 entry (binfmt-support, systemd-binfmt) is used as is.
BINFMT=/proc/sys/fs/binfmt_misc
BINFMT_NAME=pylimiter-aarch64
_binfmt_mounted=0
_binfmt_ours=0
binfmt_on() {
    if [ ! -e "$BINFMT/register" ]; then
        mount -t binfmt_misc binfmt_misc "$BINFMT" || {
            echo "FAIL: cannot mount binfmt_misc (needs root); arm64 roots need it" >&2; return 1; }
        _binfmt_mounted=1
    fi
    if [ -e "$BINFMT/qemu-aarch64" ] || [ -e "$BINFMT/$BINFMT_NAME" ]; then return 0; fi
    local qemu
    qemu=$(command -v qemu-aarch64-static) || { echo "FAIL: qemu-aarch64-static missing" >&2; return 1; }
    # The ELF header of an AArch64 executable (e_machine 0xb7), as Debian's
    # qemu-user-static registers it.
    printf '%s' ":$BINFMT_NAME:M::\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:$qemu:OCF" \
        >"$BINFMT/register"
    _binfmt_ours=1
}
binfmt_off() {
    if [ "$_binfmt_ours" = 1 ] && [ -e "$BINFMT/$BINFMT_NAME" ]; then echo -1 >"$BINFMT/$BINFMT_NAME"; fi
    _binfmt_ours=0
    if [ "$_binfmt_mounted" = 1 ]; then umount "$BINFMT" 2>/dev/null || true; fi
    _binfmt_mounted=0
}

# in_sid ARCH CMD...: run CMD in the sid root of ARCH, with the worktree
# mounted at its own path (so paths are the same inside and out) and the
# current directory kept.  The environment is the host's minus anything
# naming host-only paths (pyenv, the host's pip find-links).
in_sid() {
    local arch=$1; shift
    local root
    root=$(sid_root "$arch")
    [ -f "$root/.stage-base" ] || { echo "FAIL: no sid $arch root; run wheels/pythons.sh" >&2; return 1; }
    [ "$arch" = amd64 ] || binfmt_on || return 1
    # Name lookups as on the host (the JVM resolves its own host name).
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    cp -L /etc/hosts "$root/etc/hosts" 2>/dev/null || true
    local rc=0
    unshare --mount --propagation private -- /bin/sh -euc '
        root=$1 tree=$2 cwd=$3; shift 3
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mkdir -p "$root/dev/shm" && mount -t tmpfs -o size=1g tmpfs "$root/dev/shm"
        mount --rbind /sys "$root/sys"
        mkdir -p "$root$tree" && mount --bind "$tree" "$root$tree"
        # pip inside trusts what pip outside trusts (a site may add its own
        # authority to the host bundle, as PIP_CERT points to).
        ca=/etc/ssl/certs/ca-certificates.crt
        if [ -f "$ca" ] && [ -f "$root$ca" ]; then mount --bind -o ro "$ca" "$root$ca"; fi
        exec chroot "$root" /usr/bin/env -C "$cwd" "$@"
    ' in_sid "$root" "$ROOT" "$PWD" \
        env -u PYENV_ROOT -u PIP_FIND_LINKS -u PYTHONPATH \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        "$@" || rc=$?
    [ "$arch" = amd64 ] || binfmt_off
    return $rc
}

# sid_host_python VERSION: prints the path of a copy of the amd64 root's
# pythonVERSION that runs on the host itself, outside the chroot: its ELF
# interpreter and library path are pointed at the root's own loader and
# libraries (patchelf; DT_RPATH, so the stdlib's extension modules find them
# too).  It is a real CPython VERSION (its own sysconfig, tags, headers under
# the root) whose child processes are host programs: setuptools drives the
# host's compiler with it, so a wheel is compiled against that version's
# headers but the host's glibc (2.36) headers and libc, and links nothing
# from sid.  Needs patchelf (tools.sh).
sid_host_python() {
    local v=$1 root
    root=$(sid_root amd64)
    local py=$root/usr/bin/python$v-host loader=$root/usr/lib64/ld-linux-x86-64.so.2
    [ -x "$root/usr/bin/python$v" ] || { echo "FAIL: no python$v in the sid amd64 root" >&2; return 1; }
    if [ ! -x "$py" ] || [ "$(patchelf --print-interpreter "$py")" != "$loader" ]; then
        cp "$root/usr/bin/python$v" "$py.tmp"
        patchelf --set-interpreter "$loader" --force-rpath \
            --set-rpath '$ORIGIN/../lib/x86_64-linux-gnu' "$py.tmp"
        mv "$py.tmp" "$py"
    fi
    echo "$py"
}

# sid_pyconfig_dir ARCH VERSION DIR: Debian's <pythonX.Y/pyconfig.h> only
# includes <MULTIARCH/pythonX.Y/pyconfig.h>; DIR gets that one file, so
# `-I DIR` makes the root's real configuration (for ARCH) what compiles,
# shadowing nothing else (the host's own headers, glibc's above all, stay).
sid_pyconfig_dir() {
    local arch=$1 v=$2 dir=$3 multi
    case $arch in amd64) multi=x86_64-linux-gnu ;; arm64) multi=aarch64-linux-gnu ;; esac
    rm -rf "$dir" && mkdir -p "$dir/$multi/python$v"
    cp "$(sid_root "$arch")/usr/include/$multi/python$v/pyconfig.h" "$dir/$multi/python$v/"
}
