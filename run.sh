#!/usr/bin/env bash
# One entry point that sets up a fresh machine, then runs the pipeline or the tests.
#   ./run.sh repro [dvc repro args]   the main job: dvc repro on the embedded default
#   ./run.sh test  [pytest args]      the test suite (what CI runs)
#   ./run.sh verify [--against REV]   after repro: the same bytes as committed, or else the
#                                     same conclusions and accuracies within tolerance
#   ./run.sh <cmd> [args]             any command inside the project's environment
# The environment is a virtualenv in .venv (override with VENV=...), built on first use and
# rebuilt when pyproject.toml changes. TORCH_SPEC picks the torch build to install.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac   # absolute: PATH below must not depend on cwd
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
if [ ! -f "$VENV/.structinit-installed" ] || [ pyproject.toml -nt "$VENV/.structinit-installed" ]; then
  echo "setting up $VENV (first run: a few minutes) ..." >&2
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q --disable-pip-version-check $TORCH_SPEC
  "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[test]'
  touch "$VENV/.structinit-installed"
fi
cmd=${1:-test}
shift || true
if [ "$cmd" = test ] && [ ! -f "$VENV/.structinit-scale-installed" -o "$VENV/.structinit-installed" -nt "$VENV/.structinit-scale-installed" ]; then
  # the tests also cover the optional scale-out extra (Ray); ./run.sh repro never needs it
  if "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[test,scale]'; then
    touch "$VENV/.structinit-scale-installed"
  else   # tests/test_fanout.py then skips (fails under .ci/run, which requires it)
    echo "warning: could not install the scale extra (Ray); its tests will skip" >&2
  fi
fi
export PATH="$VENV/bin:$PATH" DVC_NO_ANALYTICS=1
case "$cmd" in
  test)  bash tests/setup_browser.sh # chromium + local vega JS for test_plots_render (never fails)
         exec python -m pytest "$@" ;;
  repro) exec dvc repro "$@" ;;
  verify) exec python -m structinit.pipeline.verify "$@" ;;
  *)     exec "$cmd" "$@" ;;
esac
