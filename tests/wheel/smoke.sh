#!/usr/bin/env bash
# The wheel as a user gets it (`make test-wheel`, run by CI).
#   bash tests/wheel/smoke.sh install PYTHON VENV TORCH_SPEC [PIP_ARGS]
#     builds the wheel from what a clone holds and installs it with its dependencies into a fresh
#     environment outside the checkout (torch from the same local wheel);
#   bash tests/wheel/smoke.sh run PYTHON VENV
#     from an empty directory, the commands a new user types first.
set -euo pipefail
step=$1 python=$2 venv=$3
checkout=$(cd "$(dirname "$0")/../.." && pwd)

if [ "$step" = install ]; then
  torch_spec=$4 pip_args=${5:-}
  src=$(mktemp -d) dist=$(mktemp -d)
  trap 'rm -rf "$src" "$dist"' EXIT
  # no stale build/ of an earlier build can slip in
  git -C "$checkout" ls-files -z --cached --others --exclude-standard \
    | tar -C "$checkout" --null -T - -cf - | tar -C "$src" -xf -
  # the environment's own setuptools where it has one (no download), else pip's isolated build
  isolation=$("$python" -c "import setuptools" 2>/dev/null && echo --no-build-isolation || true)
  "$python" -m pip wheel -q --no-deps $isolation -w "$dist" "$src"
  rm -rf "$venv" && "$python" -m venv "$venv"
  # shellcheck disable=SC2086  # the specs are word lists (a version, an --index-url)
  "$venv/bin/pip" install -q $pip_args $torch_spec
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q $pip_args "$dist"/psyrl-*.whl
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"  # an empty directory: nothing of the checkout on the path
set -x
"$venv/bin/python" -c "import psyrl; assert '$checkout' not in psyrl.__file__, psyrl.__file__"
"$venv/bin/psyrl" --help >/dev/null
"$venv/bin/psyrl" config show --config tgrpo/qwen2.5-3b >/dev/null
"$venv/bin/psyrl" plan --config tgrpo/qwen2.5-3b
"$venv/bin/psyrl" demo --quick
test -f runs/tiny-tgrpo-quick/report.html
test -f runs/tiny-tgrpo-quick/eval-mc/results.json
cmp data/demo/train.jsonl "$checkout/data/demo/train.jsonl"  # the checkout's demo set, to the byte
