#!/usr/bin/env bash
# Check the aarch64 wheels in wheels/dist (or the versions given).
#
#   - cp314 and cp315: wheels/check_wheels.py itself, run by Debian sid's
#     arm64 python3.14 / python3.15 inside the arm64 sid root (chroot, qemu
#     through binfmt_misc: wheels/pythons.sh, sid_env.sh): a venv of that
#     interpreter, the wheel and the test dependencies pip-installed into it,
#     the suite (less the `slow` CLI-subprocess tests) and the pure pass;
#   - cp310-cp313: installed (pip --target, arm64 wheels of the test
#     dependencies) and the suite (less `slow`) and the pure pass run under
#     qemu-aarch64 by Debian's arm64 python3.11 (bookworm) / python3.13
#     (trixie), and by python.org's 3.10.12 / 3.12.3 cross-compiled here
#     (no arm64 build of those is in a reachable registry: aarch64_env.sh),
#     each from a folder holding only tests/.
#
# The two kinds run side by side, one lane each (AARCH64_LANES=1: in turn).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
VERSIONS=("$@")
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(3.10 3.11 3.12 3.13 3.14 3.15)
source wheels/aarch64_env.sh
trap binfmt_off EXIT

check_one() {
    local v=$1 tag whl name out guest site suite host where log pytest summary pure
    tag=cp${v/./}
    whl=$(ls "$ROOT"/wheels/dist/pylimiter_pulsar-*-"$tag"-"$tag"-*manylinux_2_17_aarch64.whl 2>/dev/null || true)
    [ -n "$whl" ] || { echo "FAIL: no $tag aarch64 wheel in wheels/dist (wheels/build_aarch64.sh $v)"; return 1; }
    name=$(basename "$whl")
    if is_sid_version "$v"; then
        out=$(in_sid arm64 "python$v" wheels/check_wheels.py wheels/dist --python "$v" --no-sdist \
              --emulated 2>&1) || { echo "$out"; echo "FAIL: $name under qemu"; return 1; }
        grep "^ok   $name" <<<"$out" || { echo "$out"; echo "FAIL: $name was not run"; return 1; }
        return 0
    fi
    guest=$(guest_python "$v") || { echo "FAIL: $name: no arm64 CPython $v to run it"; return 1; }
    site=$AWORK/site-$v
    suite=$AWORK/suite-$v
    rm -rf "$site" "$suite"
    # pip evaluates dependency markers against the interpreter running it,
    # not --python-version: pyenv's x86_64 CPython of the same version picks
    # the backports that version needs (exceptiongroup, tomli for 3.10).
    host=$(pyenv_python "$v")
    "${host:-$PY}" -m pip install -q --target "$site" --platform manylinux2014_aarch64 \
        --python-version "$v" --implementation cp --abi "$tag" --only-binary=:all: \
        "$whl" "pytest>=8" "hypothesis>=6.100" >"$AWORK/pip-$v.log" 2>&1 \
        || { tail -20 "$AWORK/pip-$v.log"; return 1; }
    # (errexit does not reach into a function called from `||`: each step
    # that can fail says so itself.)
    { mkdir -p "$suite" && cp -r tests "$suite/" && rm -rf "$suite/tests/c" "$suite/tests/model" \
        && cp pyproject.toml "$suite/" && find "$suite" -name __pycache__ -prune -exec rm -rf {} +; } \
        || { echo "FAIL: $name: cannot lay out $suite"; return 1; }
    # Hypothesis's too_slow health check times input generation, which under
    # emulation includes the first translation of every code path (a single
    # draw took 57 s once): a health check of the host, not of the wheel.
    cat >"$suite/qemu_hypothesis.py" <<'EOF'
from hypothesis import HealthCheck, settings

settings.register_profile("qemu", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("qemu")
EOF
    where=$(cd "$suite" && PYTHONPATH=$site "$guest" -c "
import pathlib, platform, pylimiter
assert platform.machine() == 'aarch64', platform.machine()
assert pylimiter.IMPLEMENTATION == 'c', pylimiter.IMPLEMENTATION
print(platform.python_version(), pathlib.Path(pylimiter.__file__).parent)") \
        || { echo "FAIL: $name: the C extension does not load as installed under qemu"; return 1; }
    # Emulation is 10-20x slower: give the watchdog room, and leave out the
    # `slow` tests (command-line runs in subprocesses, a minute each under
    # qemu; they test the CLIs, which the x86_64 wheels' runs cover).
    log=$AWORK/pytest-$v.log
    pytest=("$guest" -m pytest -q -rfE -p no:cacheprovider -p qemu_hypothesis -o faulthandler_timeout=600)
    if (cd "$suite" && PYTHONPATH=$site:$suite "${pytest[@]}" -m "not slow" tests >"$log" 2>&1); then
        summary=$(tail -1 "$log")
    else
        grep -E "^(FAILED|ERROR)" "$log" || tail -30 "$log"
        echo "FAIL: $name: $(tail -1 "$log")"
        return 1
    fi
    # The pure twin alone, as `make test`'s second pass.
    if (cd "$suite" && PYLIMITER_NO_EXTENSIONS=1 PYTHONPATH=$site:$suite "${pytest[@]}" --no-c-extensions \
            -m "not slow and not spark and not c_core" tests >"$log.pure" 2>&1); then
        pure=$(tail -1 "$log.pure")
    else
        grep -E "^(FAILED|ERROR)" "$log.pure" || tail -30 "$log.pure"
        echo "FAIL: $name (pure pass): $(tail -1 "$log.pure")"
        return 1
    fi
    echo "ok   $name: arm64 CPython $where | $summary | pure: $pure"
}

# Two lanes at once, one per core: the sid lane (cp314/cp315 in the arm64
# sid root, through binfmt_misc) in the background, the others (qemu-aarch64
# called directly, no binfmt) in the foreground.  Only the sid lane touches
# the binfmt entry, so neither can pull it from under the other.  Its output
# is kept in a log and printed when it ends.  AARCH64_LANES=1: one after the
# other.
sid_v=() other_v=()
for v in "${VERSIONS[@]}"; do
    if is_sid_version "$v"; then sid_v+=("$v"); else other_v+=("$v"); fi
done
lane_pid=
if [ "${AARCH64_LANES:-2}" -gt 1 ] && [ ${#sid_v[@]} -gt 0 ] && [ ${#other_v[@]} -gt 0 ]; then
    lane_log=$AWORK/lane-sid.log
    mkdir -p "$AWORK"
    ( trap binfmt_off EXIT
      for v in "${sid_v[@]}"; do check_one "$v" || exit 1; done ) >"$lane_log" 2>&1 &
    lane_pid=$!
    echo "sid lane (${sid_v[*]}) running beside the others (log: $lane_log)"
    # On a failure here the lane goes too, with what it started (chroot, qemu).
    kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
    trap '[ -z "$lane_pid" ] || { kill_tree "$lane_pid"; wait "$lane_pid" 2>/dev/null || true; }; binfmt_off' EXIT
    todo=("${other_v[@]}")
else
    todo=("${VERSIONS[@]}")
fi
for v in "${todo[@]}"; do
    check_one "$v" || exit 1
done
if [ -n "$lane_pid" ]; then
    rc=0
    wait "$lane_pid" || rc=$?
    lane_pid=
    cat "$lane_log"
    [ "$rc" = 0 ] || { echo "FAIL: the sid lane (${sid_v[*]}), exit $rc"; exit 1; }
fi
echo "aarch64 wheels checked (${#VERSIONS[@]} run under qemu)"
