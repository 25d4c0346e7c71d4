#!/usr/bin/env bash
# Run a command inside a Debian sid root (wheels/pythons.sh builds them):
#
#   wheels/in_sid.sh amd64 python3.14 -c 'import sys; print(sys.version)'
#   wheels/in_sid.sh arm64 python3.15 -m pytest ...      (under qemu)
#
# The worktree is mounted at its own path and the current directory kept, so
# relative paths mean the same inside and out.  See sid_env.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/wheels/sid_env.sh"
trap binfmt_off EXIT
[ $# -ge 2 ] || { echo "usage: $0 amd64|arm64 COMMAND [ARG...]" >&2; exit 2; }
in_sid "$@"
