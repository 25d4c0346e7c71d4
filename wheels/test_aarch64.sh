#!/usr/bin/env bash
# `make test-aarch64`: the core and the package on aarch64, under qemu-user.
#
#  1. The C tier (tests/c), cross-built three ways and run on several -cpu
#     models:  llsc     -march=armv8-a -mno-outline-atomics  (LDAXR/STLXR loops)
#              lse      -march=armv8.1-a                     (CAS/LDADD inline)
#              outline  -march=armv8-a -moutline-atomics     (runtime choice)
#     The object code is checked to really use the atomics named.
#  2. A cp311 manylinux_2_17_aarch64 wheel, cross-compiled from the sdist
#     against Debian's arm64 libpython3.11-dev, repaired by auditwheel.
#  3. The Python suite against that wheel, run by Debian's arm64 python3.11
#     under qemu-aarch64 (packages unpacked into a private root, not installed).
#
# qemu runs guest threads on host threads with x86's strong ordering, so none
# of this can catch a too-weak memory order; the model check (`make
# model-check`) and the per-site comments in csrc/plim_sem.c argue those.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/wheels/work/aarch64
SYSROOT=$WORK/root
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$WORK"

need_apt=()
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.a ] || need_apt+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "apt: installing ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# ---- 1. C tier ---------------------------------------------------------------
declare -A FLAGS=(
    [llsc]="-march=armv8-a -mno-outline-atomics"
    [lse]="-march=armv8.1-a"
    [outline]="-march=armv8-a -moutline-atomics"
)
# cortex-a53/a72 are ARMv8.0 (no LSE); neoverse-n1 and max have LSE.
declare -A CPUS=(
    [llsc]="cortex-a53 cortex-a72 neoverse-n1"
    [lse]="neoverse-n1 max"
    [outline]="cortex-a53 max"
)
CWORK=$WORK/ctier
mkdir -p "$CWORK"
for v in llsc lse outline; do
    # shellcheck disable=SC2086
    aarch64-linux-gnu-gcc -std=c11 -O2 -Wall -Wextra -Werror ${FLAGS[$v]} -Icsrc \
        -c csrc/plim_sem.c -o "$CWORK/plim_sem_$v.o"
    dis=$(aarch64-linux-gnu-objdump -d "$CWORK/plim_sem_$v.o")
    lse_n=$(grep -cE $'\t(cas|casa|casl|casal|ldadd|ldadda|ldaddl|ldaddal|ldclral|ldsetal)\t' <<<"$dis" || true)
    llsc_n=$(grep -cE $'\t(ldxr|ldaxr|stxr|stlxr)\t' <<<"$dis" || true)
    helper_n=$(grep -cE '__aarch64_(cas|ldadd|ldclr|ldset|swp)' <<<"$dis" || true)
    case $v in
        llsc) [ "$lse_n" -eq 0 ] && [ "$llsc_n" -gt 0 ] ;;
        lse) [ "$lse_n" -gt 0 ] && [ "$llsc_n" -eq 0 ] ;;
        outline) [ "$helper_n" -gt 0 ] ;;
    esac || { echo "FAIL: $v build does not use the atomics it should (lse=$lse_n llsc=$llsc_n helpers=$helper_n)"; exit 1; }
    echo "atomics $v: LSE instructions=$lse_n, LL/SC instructions=$llsc_n, outline helper calls=$helper_n"
    for t in test_sem test_stress; do
        # shellcheck disable=SC2086
        aarch64-linux-gnu-gcc -std=c11 -O2 -g -Wall -Wextra -Werror ${FLAGS[$v]} -static \
            -Icsrc "tests/c/$t.c" csrc/plim_sem.c csrc/plim_waitq.c \
            -o "$CWORK/${t}_$v" -lpthread
        for cpu in ${CPUS[$v]}; do
            out=$(timeout 600 qemu-aarch64 -cpu "$cpu" "$CWORK/${t}_$v" 2>&1) \
                || { echo "$out"; echo "FAIL: $t/$v on -cpu $cpu"; exit 1; }
            grep -q " 0 failed" <<<"$out" || { echo "$out"; echo "FAIL: $t/$v on $cpu"; exit 1; }
            echo "ok   C tier $t [$v] -cpu $cpu: $(tail -1 <<<"$out")"
        done
    done
done

# ---- 2. sysroot: Debian's arm64 python3.11, unpacked ------------------------
PKGS=(libc6 libgcc-s1 libcrypt1 python3.11-minimal libpython3.11-minimal
      libpython3.11-stdlib libpython3.11-dev libexpat1 zlib1g libffi8 libssl3
      libbz2-1.0 liblzma5 libsqlite3-0 libuuid1 libncursesw6 libtinfo6
      libreadline8 libnsl2 libtirpc3 libdb5.3 libgssapi-krb5-2 libkrb5-3
      libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1)
if [ ! -x "$SYSROOT/usr/bin/python3.11" ]; then
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
    fi
    apt-get update -qq
    rm -rf "$WORK/debs" "$SYSROOT"
    mkdir -p "$WORK/debs" "$SYSROOT"
    (cd "$WORK/debs" && apt-get download -qq "${PKGS[@]/%/:arm64}" 2>/dev/null)
    for d in "$WORK"/debs/*.deb; do dpkg -x "$d" "$SYSROOT"; done
fi
# A wrapper that is its own sys.executable, so tests that start a child
# interpreter start an arm64 one (no binfmt_misc here).
GUESTPY=$WORK/bin/python3.11
mkdir -p "$WORK/bin"
cat >"$GUESTPY" <<EOF
#!/bin/sh
exec qemu-aarch64 -L "$SYSROOT" -0 "\$0" "$SYSROOT/usr/bin/python3.11" "\$@"
EOF
chmod +x "$GUESTPY"
"$GUESTPY" -c "import platform; assert platform.machine() == 'aarch64', platform.machine()"

# ---- 3. the cp311 aarch64 wheel, cross-compiled from the sdist ---------------
rm -rf "$WORK/sdist" "$WORK/src" "$WORK/raw" "$WORK/dist" "$WORK/sysconf"
"$PY" -m build --sdist --outdir "$WORK/sdist" . >"$WORK/sdist.log" 2>&1 \
    || { tail -20 "$WORK/sdist.log"; exit 1; }
mkdir -p "$WORK/src" "$WORK/sysconf"
tar xzf "$WORK"/sdist/pylimiter_pulsar-*.tar.gz -C "$WORK/src"
# The host CPython 3.11 drives setuptools, reading the arm64 interpreter's
# build variables (CC=aarch64-linux-gnu-gcc, EXT_SUFFIX, SOABI) instead of
# its own; the Cython output is the same C for every target.
cp "$SYSROOT"/usr/lib/python3.11/_sysconfigdata__linux_aarch64-linux-gnu.py "$WORK/sysconf/"
(
    cd "$WORK"/src/pylimiter_pulsar-*/
    CFLAGS=-g0 LDFLAGS=-s _PYTHON_HOST_PLATFORM=linux-aarch64 \
    _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu \
    PYTHONPATH="$WORK/sysconf" \
        "$PY" setup.py -q build_ext -I "$SYSROOT/usr/include/python3.11:$SYSROOT/usr/include" \
        bdist_wheel -d "$WORK/raw" >"$WORK/build.log" 2>&1
) || { tail -30 "$WORK/build.log"; exit 1; }
source wheels/tools.sh
auditwheel repair -w "$WORK/dist" "$WORK"/raw/*.whl >"$WORK/repair.log" 2>&1 \
    || { cat "$WORK/repair.log"; exit 1; }
WHL=$(ls "$WORK"/dist/*.whl)
case $WHL in
    *manylinux_2_17_aarch64.whl) echo "ok   wheel $(basename "$WHL")" ;;
    *) echo "FAIL: $(basename "$WHL") is not manylinux_2_17_aarch64"; exit 1 ;;
esac
mkdir -p "$ROOT/wheels/dist"
cp "$WHL" "$ROOT/wheels/dist/"

# ---- 4. the Python suite on the installed wheel, under qemu -----------------
SITE=$WORK/site
SUITE=$WORK/suite
rm -rf "$SITE" "$SUITE"
"$PY" -m pip install -q --target "$SITE" --platform manylinux2014_aarch64 \
    --python-version 3.11 --implementation cp --abi cp311 --only-binary=:all: \
    "$WHL" "pytest>=8" "hypothesis>=6.100" >"$WORK/pip.log" 2>&1 \
    || { tail -20 "$WORK/pip.log"; exit 1; }
mkdir -p "$SUITE"
cp -r tests "$SUITE/" && rm -rf "$SUITE/tests/c" "$SUITE/tests/model" && cp pyproject.toml "$SUITE/"
find "$SUITE" -name __pycache__ -prune -exec rm -rf {} +
cd "$SUITE"
PYTHONPATH=$SITE "$GUESTPY" -c "
import pathlib, platform, pylimiter
assert pylimiter.IMPLEMENTATION == 'c', pylimiter.IMPLEMENTATION
print('guest:', platform.machine(), platform.python_version(), pathlib.Path(pylimiter.__file__).parent)"
# Emulation is ~4x slower: give the watchdog room.
PYTHONPATH=$SITE "$GUESTPY" -m pytest -q -p no:cacheprovider \
    -o faulthandler_timeout=300 tests
echo "aarch64: C tier, wheel and Python suite passed"
