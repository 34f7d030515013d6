#!/usr/bin/env bash
# Run a command against the code of one commit, from a frozen git worktree, with the repo's .venv.
#   bash bench/frozen_worktree.sh REV DIR -- .venv/bin/python bench/trace_identity.py --out runs/bench/identity-REV
# Measured jobs run from the commit they measure while the working tree moves on. The editable install of
# .venv points at this checkout, so the command runs with a shim first on PYTHONPATH: `simplan.*` resolves to
# DIR's folders (the package-dir mapping of pyproject.toml) and the editable finder is taken off sys.meta_path.
# The command runs in DIR; relative paths in it are DIR's. The example plugins of DIR (examples/*) are on the path.
set -euo pipefail
rev=$1 dir=$2; shift 2; [ "${1:-}" = "--" ] && shift
repo=$(cd "$(dirname "$0")/.." && pwd)
[ -d "$dir" ] || git -C "$repo" worktree add --detach "$dir" "$rev" >/dev/null
dir=$(cd "$dir" && pwd)
shim="$dir/.frozen-shim"
mkdir -p "$shim/simplan"
"$repo/.venv/bin/python" - "$dir" "$shim" <<'PY'
import os, sys, tomllib
dir, shim = sys.argv[1:]
mapping = tomllib.load(open(os.path.join(dir, "pyproject.toml"), "rb"))["tool"]["setuptools"]["package-dir"]
for package, folder in mapping.items():
    parts = package.split(".")
    if len(parts) == 2:  # top-level subpackages of the namespace; nested ones follow their folder
        link = os.path.join(shim, "simplan", parts[1])
        if not os.path.islink(link):
            os.symlink(os.path.join(dir, folder), link)
open(os.path.join(shim, "sitecustomize.py"), "w").write(
    "import sys\nsys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')"
    " and 'editable' not in repr(f)]\n"
)
PY
ln -sfn "$repo/.venv" "$dir/.venv"
# The example plugins (pip install -e examples/NAME) are editable installs too, hidden with the rest: DIR's own
# copies go on the path, so a measured run of the example shop runs the shop of the commit it measures.
examples=""
for p in "$dir"/examples/*/; do [ -f "$p/pyproject.toml" ] && examples="$examples:${p%/}"; done
cd "$dir"
PYTHONPATH="$shim$examples${PYTHONPATH:+:$PYTHONPATH}" exec "$@"
