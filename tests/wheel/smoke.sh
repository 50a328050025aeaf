#!/usr/bin/env bash
# The wheel as a user gets it (`make test-wheel`, run by CI): build it, install it with its
# dependencies into a fresh environment outside the checkout (torch from the same local wheel),
# then, from an empty directory, the commands a new user types first.
#   bash tests/wheel/smoke.sh PYTHON VENV_DIR TORCH_SPEC [PIP_ARGS]
set -euo pipefail
python=$1 venv=$2 torch_spec=$3 pip_args=${4:-}
checkout=$(cd "$(dirname "$0")/../.." && pwd)
src=$(mktemp -d) dist=$(mktemp -d) work=$(mktemp -d)
trap 'rm -rf "$src" "$dist" "$work"' EXIT

# built from what a clone holds (no stale build/ of an earlier build can slip in)
git -C "$checkout" ls-files -z --cached --others --exclude-standard \
  | tar -C "$checkout" --null -T - -cf - | tar -C "$src" -xf -
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$dist" "$src"
wheel=$(ls "$dist"/psyrl-*.whl)
rm -rf "$venv" && "$python" -m venv "$venv"
# shellcheck disable=SC2086  # the specs are word lists (a version, an --index-url)
"$venv/bin/pip" install -q $pip_args $torch_spec
# shellcheck disable=SC2086
"$venv/bin/pip" install -q $pip_args "$wheel"

cd "$work"  # an empty directory: nothing of the checkout on the path
set -x
"$venv/bin/python" -c "import psyrl, sys; assert '$checkout' not in psyrl.__file__, psyrl.__file__"
"$venv/bin/psyrl" --help >/dev/null
"$venv/bin/psyrl" config show --config tgrpo/qwen2.5-3b >/dev/null
"$venv/bin/psyrl" plan --config tgrpo/qwen2.5-3b
"$venv/bin/psyrl" demo --quick
test -f runs/tiny-tgrpo-quick/report.html
test -f runs/tiny-tgrpo-quick/eval-mc/results.json
cmp data/demo/train.jsonl "$checkout/data/demo/train.jsonl"  # the same demo set as the checkout's
