#!/usr/bin/env bash
# Cross-build manylinux_2_17_aarch64 wheels for CPython 3.10-3.13 (or the
# versions given) from the sdist, into wheels/dist/.
#
#   wheels/build_aarch64.sh              cp310 cp311 cp312 cp313
#   wheels/build_aarch64.sh 3.11         just cp311
#
# One recipe for every version, so a wheel that can be run here (cp311 and
# cp313, see check_aarch64.sh) vouches for the ones that cannot: the x86_64
# CPython of the same version (pyenv) drives setuptools, reading a build
# configuration rewritten for aarch64:
#   - a _sysconfigdata module whose compiler is aarch64-linux-gnu-gcc and
#     whose SOABI/EXT_SUFFIX say aarch64-linux-gnu (with the x86_64 build's
#     own -L/-rpath to its lib folder dropped);
#   - that version's headers with pyconfig.h adjusted for aarch64.  The two
#     differ only in what configure found about the CPU: HAVE_GCC_ASM_FOR_X64
#     and _X87 (x87/SSE inline asm, x86 only), HAVE_USABLE_WCHAR_T (wchar_t is
#     unsigned on aarch64) and PY_SUPPORT_TIER; the data model (LP64, little
#     endian, type sizes, alignment) is the same, so struct layouts match.
# The Cython output is the same C for every target; auditwheel then checks
# the glibc symbol versions against manylinux_2_17_aarch64.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYENV=${PYENV_VERSIONS:-/root/.pyenv/versions}
OUT=$ROOT/wheels/dist
VERSIONS=("$@")
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(3.10 3.11 3.12 3.13)
source wheels/aarch64_env.sh
source wheels/tools.sh
mkdir -p "$OUT"

SDIST_DIR=$AWORK/sdist
rm -rf "$SDIST_DIR" && mkdir -p "$SDIST_DIR"
python -m build --sdist --outdir "$SDIST_DIR" . >"$AWORK/sdist.log" 2>&1 \
    || { tail -20 "$AWORK/sdist.log"; exit 1; }
SDIST=$(ls "$SDIST_DIR"/pylimiter_pulsar-*.tar.gz)

for v in "${VERSIONS[@]}"; do
    host=$(ls -d "$PYENV"/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$host" ] || { echo "FAIL: no x86_64 CPython $v under $PYENV to drive the build"; exit 1; }
    tag=cp${v/./}
    cross=$AWORK/cross-$v
    venv=$AWORK/buildenv-$v
    # setuptools and Cython at the versions pyproject's build-system asks for.
    if [ ! -x "$venv/bin/cython" ]; then
        "$host" -m venv --clear "$venv"
        "$venv/bin/pip" install -q "setuptools>=77" "Cython>=3.0.10" wheel >"$AWORK/buildenv-$v.log" 2>&1 \
            || { tail -20 "$AWORK/buildenv-$v.log"; exit 1; }
    fi
    rm -rf "$cross" && mkdir -p "$cross/include"
    inc=$("$host" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    cp -r "$inc" "$cross/include/"
    pyconfig=$cross/include/$(basename "$inc")/pyconfig.h
    sed -i -e '/#define HAVE_GCC_ASM_FOR_X64 /d' -e '/#define HAVE_GCC_ASM_FOR_X87 /d' \
        -e 's/^#define PY_SUPPORT_TIER .*/#define PY_SUPPORT_TIER 2/' "$pyconfig"
    grep -q '^#define HAVE_USABLE_WCHAR_T' "$pyconfig" || echo '#define HAVE_USABLE_WCHAR_T 1' >>"$pyconfig"
    "$host" - "$cross" <<'EOF'
import pprint, re, sys, sysconfig
out = sys.argv[1]
cfg = {}
for k, v in sysconfig.get_config_vars().items():
    if isinstance(v, str):
        v = v.replace("x86_64-linux-gnu", "aarch64-linux-gnu").replace("x86_64-pc-linux-gnu",
                                                                         "aarch64-unknown-linux-gnu")
        # The x86_64 build's own library folder means nothing to an aarch64 link.
        v = re.sub(r"\s*-(L|Wl,-rpath,)\S*", "", v)
    cfg[k] = v
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
            "$venv/bin/python" setup.py -q build_ext -I "$cross/include/$(basename "$inc")" \
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
