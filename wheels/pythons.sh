#!/usr/bin/env bash
# Get CPython 3.14 and 3.15: Debian sid roots for amd64 and arm64 under
# wheels/work/sid/, built once and kept (one line when a step is skipped).
#
#   wheels/pythons.sh              both roots
#   wheels/pythons.sh amd64        just one
#
# Each root is `debootstrap --variant=minbase sid` with python3.14, 3.15,
# their -dev and -venv packages and a C compiler (test-pythons builds the
# extension in place there; the wheels themselves are built on the host, see
# build_wheels.sh).  The amd64 root also gets a Java 17 runtime for the PySpark
# tests.  arm64: `debootstrap --arch arm64 --foreign` on the host, then the
# second stage inside the root under qemu-aarch64-static (binfmt_misc entry
# registered only for the run, sid_env.sh).  A root counts as ready only when
# its marker file is written last, so an interrupted run starts that root over.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source wheels/sid_env.sh
trap binfmt_off EXIT

ARCHES=("$@")
[ ${#ARCHES[@]} -eq 0 ] && ARCHES=(amd64 arm64)

PKGS=ca-certificates,gcc,libc6-dev
for v in "${SID_VERSIONS[@]}"; do PKGS+=",python$v,python$v-dev,python$v-venv"; done
# What the suite needs beyond that on amd64 (make test-pythons runs it all).
# google-re2 has no cp315 wheel: its sdist builds against Debian's re2, abseil and pybind11.
EXTRA_amd64="openjdk-17-jre-headless make g++ relacy-dev libre2-dev libabsl-dev pybind11-dev"
EXTRA_arm64=""

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
[[ " ${ARCHES[*]} " == *" arm64 "* ]] && ! command -v qemu-aarch64-static >/dev/null && need+=(qemu-user-static)
if [ ${#need[@]} -gt 0 ]; then
    echo "apt: installing ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
fi

for arch in "${ARCHES[@]}"; do
    root=$(sid_root "$arch")
    extra_var=EXTRA_$arch
    want="$PKGS ${!extra_var}"
    if [ -f "$root/.pylimiter-ready" ] && [ "$(cat "$root/.pylimiter-ready")" = "$want" ]; then
        echo "skip sid $arch root: ready ($(cd "$root/usr/bin" && ls python3.1[0-9] | tr '\n' ' ' | sed 's/ $//'))"
        continue
    fi
    log=$SID_WORK/debootstrap-$arch.log
    mkdir -p "$SID_WORK"
    t0=$SECONDS
    # Step 1: the base system with the interpreters.
    if [ -f "$root/.stage-base" ] && [ "$(cat "$root/.stage-base")" = "$PKGS" ]; then
        echo "skip sid $arch debootstrap: done"
    else
        rm -rf "$root"
        echo "sid $arch root: debootstrap (log: $log)"
        if [ "$arch" = amd64 ]; then
            debootstrap --variant=minbase --include="$PKGS" sid "$root" "$SID_MIRROR" >"$log" 2>&1 \
                || { tail -30 "$log"; exit 1; }
        else
            debootstrap --arch "$arch" --foreign --variant=minbase --include="$PKGS" sid "$root" \
                "$SID_MIRROR" >"$log" 2>&1 || { tail -30 "$log"; exit 1; }
            binfmt_on
            echo "sid $arch root: second stage under qemu"
            unshare --mount --propagation private -- /bin/sh -euc '
                mount -t proc proc "$1/proc"
                exec chroot "$1" /debootstrap/debootstrap --second-stage' sh "$root" >>"$log" 2>&1 \
                || { tail -30 "$log"; exit 1; }
        fi
        echo "deb $SID_MIRROR sid main" >"$root/etc/apt/sources.list"
        # The registry reachable here may serve a Release file past its
        # Valid-Until date (debootstrap does not check it; apt does).
        echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99pylimiter"
        rm -rf "$root/var/cache/apt/archives/"*.deb
        echo "$PKGS" >"$root/.stage-base"
    fi
    # Step 2: what the suite needs beyond the interpreters.
    if [ -n "${!extra_var}" ]; then
        echo "sid $arch root: apt-get install ${!extra_var}"
        in_sid "$arch" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends ${!extra_var} && apt-get clean" >>"$log" 2>&1 || { tail -30 "$log"; exit 1; }
    fi
    echo "$want" >"$root/.pylimiter-ready"
    for v in "${SID_VERSIONS[@]}"; do
        echo "sid $arch: $(in_sid "$arch" "python$v" -c 'import platform, sys; print(sys.executable, platform.python_version(), platform.machine())')"
    done
    echo "sid $arch root: ready in $((SECONDS - t0)) s"
done
