#!/usr/bin/env bash
# One entry point that sets up a fresh machine, then runs the pipeline or the tests.
#   ./run.sh repro [dvc repro args]   the main job: dvc repro on the embedded default
#   ./run.sh test  [pytest args]      the test suite (what CI runs)
#   ./run.sh quick [--dry-run ...]    a quick look in minutes: the pipeline on 30 epochs and 2 seeds in a
#                                     temporary copy (python -m tools.quick; not the result)
#   ./run.sh verify [--against REV]   after repro: the same bytes as committed, or else the
#                                     same conclusions and accuracies within tolerance
#   ./run.sh pins                     rewrite constraints.txt from the environment (after a change
#                                     of pyproject.toml's dependencies; see docs/reproducibility.md)
#   ./run.sh <cmd> [args]             any command inside the project's environment
#   ./run.sh help                     this text (also with no argument), before any set-up
# The environment is a virtualenv in .venv (override with VENV=...), built on first use and
# rebuilt when pyproject.toml or constraints.txt changes, every package at the version
# constraints.txt pins (STRUCTINIT_CONSTRAINTS= to install unpinned). TORCH_SPEC picks the
# torch build to install.
set -euo pipefail
cd "$(dirname "$0")"
usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Needs: Python >= 3.11 (the pinned numpy, SciPy and scikit-learn need it) with its venv module (Debian/Ubuntu: apt install python3-venv), git, and
for `dvc exp run` a git identity (git config user.name / user.email). CPU-only machines can
skip CUDA's wheels: TORCH_SPEC="torch==2.14.1 torchvision==0.29.1 --index-url
https://download.pytorch.org/whl/cpu" ./run.sh repro (TORCH_SPEC counts when .venv is built:
delete .venv to rebuild it).
EOF
}
case "${1:-help}" in help|-h|--help) usage; exit 0 ;; esac   # before any set-up: answers at once
# prerequisites, each with what to do (before minutes of set-up, not after)
command -v python3 >/dev/null || { echo "run.sh: python3 not found: install Python >= 3.11" >&2; exit 2; }
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  { echo "run.sh: $(python3 --version 2>&1) found; ./run.sh needs Python >= 3.11 (constraints.txt pins releases that need it)" >&2; exit 2; }
command -v git >/dev/null || { echo "run.sh: git not found: install git (DVC needs it)" >&2; exit 2; }
VENV=${VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac   # absolute: PATH below must not depend on cwd
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
CONSTRAINTS=${STRUCTINIT_CONSTRAINTS-constraints.txt}   # every package's version, transitive ones included
PIN=()
[ -n "$CONSTRAINTS" ] && PIN=(-c "$CONSTRAINTS")
# What .venv was built from, by content (pyproject.toml and the constraints file), kept in its
# stamp file: an edit, a pull or a checkout of either rebuilds it; a touch or a copy that keeps
# an older date changes nothing (file dates would get both wrong).
SETUP_KEY=$({ cat pyproject.toml; [ -z "$CONSTRAINTS" ] || cat "$CONSTRAINTS"; } |
  python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
BUILT_FROM=$(cat "$VENV/.structinit-installed" 2>/dev/null || true)
if [ "${1:-}" = setup-state ]; then   # what the next command would do to .venv (tests/test_pins.py)
  if [ "$BUILT_FROM" = "$SETUP_KEY" ]; then echo "up to date"; else echo "would rebuild"; fi
  exit 0
fi
if [ "$BUILT_FROM" != "$SETUP_KEY" ]; then
  echo "setting up $VENV (first run, or pyproject.toml / $CONSTRAINTS changed: a few minutes) ..." >&2
  python3 -c 'import venv, ensurepip' 2>/dev/null ||
    { echo "run.sh: Python's venv module is missing (Debian/Ubuntu: apt install python3-venv)" >&2; exit 2; }
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q --disable-pip-version-check $TORCH_SPEC ${PIN[@]+"${PIN[@]}"}
  "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[pipeline,test]' ${PIN[@]+"${PIN[@]}"}
  echo "$SETUP_KEY" > "$VENV/.structinit-installed"
fi
cmd=$1
shift
if { [ "$cmd" = test ] || [ "$cmd" = pins ]; } &&
   [ "$(cat "$VENV/.structinit-scale-installed" 2>/dev/null || true)" != "$SETUP_KEY" ]; then
  # the tests also cover the optional scale-out extra (Ray); ./run.sh repro never needs it
  if "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[pipeline,test,scale]' ${PIN[@]+"${PIN[@]}"}; then
    echo "$SETUP_KEY" > "$VENV/.structinit-scale-installed"
  else   # tests/test_fanout.py then skips (fails under .ci/run, which requires it)
    echo "warning: could not install the scale extra (Ray); its tests will skip" >&2
  fi
fi
export PATH="$VENV/bin:$PATH" DVC_NO_ANALYTICS=1
case "$cmd" in
  test)  bash tests/setup_browser.sh # chromium + local vega JS for test_plots_render (never fails)
         bash tests/setup_data.sh    # Fashion-MNIST's files for its real-file tests (fails only with STRUCTINIT_REQUIRE_DATA=1)
         exec python -m pytest "$@" ;;
  repro) exec dvc repro "$@" ;;
  quick) exec python -m tools.quick "$@" ;;
  verify) exec python -m structinit.pipeline.verify "$@" ;;
  pins)  # pip freeze: every installed distribution but this project, each at its version
         { echo "# Every package the environment holds, transitive ones included, at the version tested:"
           echo "# ./run.sh installs with -c constraints.txt. Written by ./run.sh pins (pip freeze of the"
           echo "# environment with the pipeline, test and scale extras); tests/test_pins.py compares."
           # local labels dropped: torch 2.14.1+cpu and +cu130 are one pin, which either build meets
           python -m pip freeze --all --exclude-editable --disable-pip-version-check | grep -v '^-e \|^pip==' |
             sed 's/^\([^=]*==[^+]*\)+.*$/\1/'
         } > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt
         echo "constraints.txt: $(grep -c '==' constraints.txt) packages pinned" ;;
  *)     exec "$cmd" "$@" ;;
esac
