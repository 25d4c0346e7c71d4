#!/usr/bin/env bash
# Read back what every wheel in wheels/dist needs, as a user's pip would judge
# it: `auditwheel show`'s best platform tag, and the newest glibc symbol
# version each shared object imports (objdump -T).  Fails if a tag or a
# symbol is newer than manylinux_2_17 / GLIBC_2.17, or if one of the twelve
# cp310-cp315 x86_64/aarch64 wheels or the sdist is missing.
#
#   wheels/show_tags.sh            all of them (what `make wheels` runs)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source wheels/tools.sh
DIST=$ROOT/wheels/dist
X=$ROOT/wheels/work/show
missing=()
for v in 310 311 312 313 314 315; do
    for a in x86_64 aarch64; do
        ls "$DIST"/pylimiter_pulsar-*-cp$v-cp$v-*manylinux_2_17_$a.whl >/dev/null 2>&1 || missing+=("cp$v $a")
    done
done
ls "$DIST"/pylimiter_pulsar-*.tar.gz >/dev/null 2>&1 || missing+=("sdist")
[ ${#missing[@]} -eq 0 ] || { echo "FAIL: wheels/dist lacks: ${missing[*]}"; exit 1; }

printf '%-80s %-24s %s\n' wheel "auditwheel best tag" "newest glibc symbol (per .so)"
for whl in "$DIST"/*.whl; do
    show=$(auditwheel show "$whl")
    tag=$(tr '\n' ' ' <<<"$show" | sed -n 's/.*platform tag: *"\([^"]*\)".*/\1/p')
    case $whl in *aarch64.whl) objdump=aarch64-linux-gnu-objdump ;; *) objdump=objdump ;; esac
    rm -rf "$X" && mkdir -p "$X" && (cd "$X" && unzip -q "$whl")
    glibc=()
    while IFS= read -r so; do
        g=$("$objdump" -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
        glibc+=("$(basename "$so" | cut -d. -f1)=${g:-none}")
        "$TOOLS/bin/python" - "${g#GLIBC_}" "$so" <<'PY'
import sys
v, so = sys.argv[1], sys.argv[2]
if v and tuple(map(int, v.split("."))) > (2, 17):
    sys.exit(f"FAIL: {so} imports a GLIBC_{v} symbol: newer than manylinux_2_17")
PY
    done < <(find "$X" -name '*.so')
    printf '%-80s %-24s %s\n' "$(basename "$whl")" "$tag" "${glibc[*]}"
    "$TOOLS/bin/python" - "$tag" <<'PY'
import re, sys
tag = sys.argv[1]
m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
if not m or (int(m[1]), int(m[2])) > (2, 17):
    sys.exit(f"FAIL: wheel needs {tag!r}: newer than manylinux_2_17")
PY
done
rm -rf "$X"
echo "12 wheels + sdist present; every tag and symbol version within manylinux_2_17"
