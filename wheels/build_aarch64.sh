#!/usr/bin/env bash
# Cross-build manylinux_2_17_aarch64 wheels for CPython 3.10-3.15 (or the
# versions given) from the sdist, into wheels/dist/.
#
#   wheels/build_aarch64.sh              cp310 ... cp315
#   wheels/build_aarch64.sh 3.11         just cp311
#
# One recipe for every version: an x86_64 CPython of the same version drives
# setuptools on the host, reading a build configuration for aarch64
# (_PYTHON_SYSCONFIGDATA_NAME) whose compiler is aarch64-linux-gnu-gcc and
# whose SOABI/EXT_SUFFIX say aarch64-linux-gnu, and compiling against that
# version's headers with an aarch64 pyconfig.h.  The Cython output is the
# same C for every target; auditwheel then checks the glibc symbol versions
# against manylinux_2_17_aarch64.
#
# 3.10-3.13: the driver is pyenv's CPython; its own configuration is
# rewritten for aarch64 (the x86_64 build's -L/-rpath dropped) and its
# pyconfig.h adjusted.  The two differ only in what configure found about the
# CPU: HAVE_GCC_ASM_FOR_X64 and _X87 (x87/SSE inline asm, x86 only),
# HAVE_USABLE_WCHAR_T (wchar_t is unsigned on aarch64) and PY_SUPPORT_TIER;
# the data model (LP64, little endian, type sizes, alignment) is the same, so
# struct layouts match.
# 3.14, 3.15: the driver is Debian sid's amd64 interpreter made runnable on
# the host (sid_env.sh), and nothing is adjusted by hand: the configuration
# and pyconfig.h are those of the arm64 sid root's own python3.X (same
# Debian version), only the compiler swapped for the cross compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/wheels/dist
VERSIONS=("$@")
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(3.10 3.11 3.12 3.13 3.14 3.15)
source wheels/aarch64_env.sh
source wheels/tools.sh
mkdir -p "$OUT"

SDIST_DIR=$AWORK/sdist
rm -rf "$SDIST_DIR" && mkdir -p "$SDIST_DIR"
python -m build --sdist --outdir "$SDIST_DIR" . >"$AWORK/sdist.log" 2>&1 \
    || { tail -20 "$AWORK/sdist.log"; exit 1; }
SDIST=$(ls "$SDIST_DIR"/pylimiter_pulsar-*.tar.gz)

for v in "${VERSIONS[@]}"; do
    tag=cp${v/./}
    cross=$AWORK/cross-$v
    venv=$AWORK/buildenv-$v
    rm -rf "$cross" && mkdir -p "$cross/include"
    if is_sid_version "$v"; then
        for a in amd64 arm64; do
            [ -f "$(sid_root $a)/.stage-base" ] \
                || { echo "FAIL: no CPython $v for $a: run wheels/pythons.sh first"; exit 1; }
        done
        host=$(sid_host_python "$v")
        arm=$(sid_root arm64)
        # Both roots come from one sid snapshot: the same CPython release.
        hv=$("$host" -c 'import platform; print(platform.python_version())')
        av=$(awk '/^#define PY_VERSION / {gsub("\"", "", $3); print $3}' "$arm/usr/include/python$v/patchlevel.h")
        [ "$hv" = "$av" ] || { echo "FAIL: amd64 root has $v as $hv, arm64 root as $av"; exit 1; }
        if [ ! -x "$venv/bin/cython" ]; then
            pipwhl=$(ls "$(sid_root amd64)"/usr/share/python-wheels/pip-*.whl)
            { "$host" -m venv --clear --without-pip "$venv" &&
              "$venv/bin/python" "$pipwhl/pip" install -q --no-index "$pipwhl" &&
              "$venv/bin/pip" install -q "setuptools>=77" "Cython>=3.0.10" wheel; } \
                >"$AWORK/buildenv-$v.log" 2>&1 || { tail -20 "$AWORK/buildenv-$v.log"; exit 1; }
        fi
        sid_pyconfig_dir arm64 "$v" "$cross/pyconfig"
        incs=(-I "$arm/usr/include/python$v" -I "$cross/pyconfig")
        sysdata=$arm/usr/lib/python$v/_sysconfigdata__linux_aarch64-linux-gnu.py
    else
        host=$(pyenv_python "$v")
        [ -n "$host" ] || { echo "FAIL: no x86_64 CPython $v under $PYENV to drive the build"; exit 1; }
        # setuptools and Cython at the versions pyproject's build-system asks for.
        if [ ! -x "$venv/bin/cython" ]; then
            "$host" -m venv --clear "$venv"
            "$venv/bin/pip" install -q "setuptools>=77" "Cython>=3.0.10" wheel >"$AWORK/buildenv-$v.log" 2>&1 \
                || { tail -20 "$AWORK/buildenv-$v.log"; exit 1; }
        fi
        inc=$("$host" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
        cp -r "$inc" "$cross/include/"
        pyconfig=$cross/include/$(basename "$inc")/pyconfig.h
        sed -i -e '/#define HAVE_GCC_ASM_FOR_X64 /d' -e '/#define HAVE_GCC_ASM_FOR_X87 /d' \
            -e 's/^#define PY_SUPPORT_TIER .*/#define PY_SUPPORT_TIER 2/' "$pyconfig"
        grep -q '^#define HAVE_USABLE_WCHAR_T' "$pyconfig" || echo '#define HAVE_USABLE_WCHAR_T 1' >>"$pyconfig"
        incs=(-I "$cross/include/$(basename "$inc")")
        sysdata=
    fi
    "$host" - "$cross" "$sysdata" <<'EOF'
import pprint, re, runpy, sys, sysconfig
out, sysdata = sys.argv[1], sys.argv[2]
cfg = {}
if sysdata:   # an aarch64 interpreter's own configuration: kept as it is
    cfg = dict(runpy.run_path(sysdata)["build_time_vars"])
else:         # the x86_64 driver's, rewritten
    for k, v in sysconfig.get_config_vars().items():
        if isinstance(v, str):
            v = v.replace("x86_64-linux-gnu", "aarch64-linux-gnu").replace("x86_64-pc-linux-gnu",
                                                                             "aarch64-unknown-linux-gnu")
            # The x86_64 build's own library folder means nothing to an aarch64 link.
            v = re.sub(r"\s*-(L|Wl,-rpath,)\S*", "", v)
        cfg[k] = v
assert cfg["SOABI"].endswith("-aarch64-linux-gnu"), cfg["SOABI"]
cross = {"CC": "aarch64-linux-gnu-gcc", "CXX": "aarch64-linux-gnu-g++",
         "LDSHARED": "aarch64-linux-gnu-gcc -shared", "BLDSHARED": "aarch64-linux-gnu-gcc -shared",
         "LDCXXSHARED": "aarch64-linux-gnu-g++ -shared", "AR": "aarch64-linux-gnu-ar",
         "LDFLAGS": "", "CONFIGURE_LDFLAGS": "", "MACHDEP": "linux"}
cfg.update(cross)
with open(f"{out}/_sysconfigdata__linux_aarch64-linux-gnu.py", "w") as f:
    f.write("build_time_vars = " + pprint.pformat(cfg) + "\n")
EOF
    src=$AWORK/src-$v
    rm -rf "$src" "$AWORK/raw-$v" && mkdir -p "$src"
    tar xzf "$SDIST" -C "$src"
    (
        cd "$src"/pylimiter_pulsar-*/
        CFLAGS=-g0 LDFLAGS=-s _PYTHON_HOST_PLATFORM=linux-aarch64 \
        _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu \
        PYTHONPATH="$cross" \
            "$venv/bin/python" setup.py -q build_ext "${incs[@]}" \
            bdist_wheel -d "$AWORK/raw-$v" >"$AWORK/build-$v.log" 2>&1
    ) || { tail -30 "$AWORK/build-$v.log"; exit 1; }
    raw=$(ls "$AWORK/raw-$v"/*.whl)
    case $(basename "$raw") in
        *-"$tag"-"$tag"-linux_aarch64.whl) ;;
        *) echo "FAIL: $(basename "$raw") is not a $tag linux_aarch64 wheel"; exit 1 ;;
    esac
    rm -f "$OUT"/pylimiter_pulsar-*-"$tag"-*aarch64.whl
    # --plat only offers the host's architecture; the wheel's own best tag
    # (read from its symbol versions) must come out as manylinux_2_17.
    auditwheel repair -w "$OUT" "$raw" >"$AWORK/repair-$v.log" 2>&1 \
        || { cat "$AWORK/repair-$v.log"; exit 1; }
    whl=$(ls "$OUT"/pylimiter_pulsar-*-"$tag"-"$tag"-*aarch64.whl)
    case $whl in
        *manylinux_2_17_aarch64.whl) ;;
        *) echo "FAIL: $(basename "$whl") is not manylinux_2_17_aarch64"; exit 1 ;;
    esac
    so=$(unzip -l "$whl" | awk '/_limiter_c\..*\.so$/ {print $4}')
    [ "$so" = "pylimiter/_limiter_c.cpython-${v/./}-aarch64-linux-gnu.so" ] \
        || { echo "FAIL: $(basename "$whl") carries '$so'"; exit 1; }
    echo "ok   built $(basename "$whl")"
done
