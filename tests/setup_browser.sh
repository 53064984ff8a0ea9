#!/usr/bin/env bash
# Set-up for tests/test_plots_render.py, which opens `dvc plots show`'s HTML in a headless
# browser: Debian's chromium, and vega / vega-lite / vega-embed as local files (the HTML DVC
# writes loads them from a CDN, which test machines cannot reach).
#   - the JS: `npm pack` of pinned versions (the registry's own tarballs, integrity checked by
#     npm), their UMD builds kept in .cache/vega/ (git-ignored); fetched again when the pins change
#   - chromium: `apt-get install chromium` when it is missing and we are root with apt-get
# Called by `./run.sh test` (and so by CI). Never fails the run: what it cannot set up, it
# says; the test then skips, or fails where STRUCTINIT_REQUIRE_BROWSER=1 (CI, .ci/run).
set -uo pipefail
cd "$(dirname "$0")/.."

PINS="vega@5.33.1 vega-lite@5.23.0 vega-embed@6.29.0"   # Vega-Lite 5 specs (.dvc/plots/*.json)
CACHE=.cache/vega

have_js() {
  [ "$(cat "$CACHE/PINS" 2>/dev/null)" = "$PINS" ] || return 1
  for pin in $PINS; do [ -s "$CACHE/${pin%@*}.min.js" ] || return 1; done
}

fetch_js() {
  command -v npm >/dev/null || { echo "setup_browser: npm not found: cannot fetch $PINS into $CACHE" >&2; return 1; }
  local tmp; tmp=$(mktemp -d) || return 1
  echo "setup_browser: fetching $PINS into $CACHE (npm pack) ..." >&2
  # shellcheck disable=SC2086
  if ! (cd "$tmp" && npm pack $PINS --silent >/dev/null 2>"$tmp/npm.log"); then
    echo "setup_browser: npm pack failed:" >&2; tail -5 "$tmp/npm.log" >&2; rm -rf "$tmp"; return 1
  fi
  mkdir -p "$CACHE"
  for pin in $PINS; do
    local name=${pin%@*} version=${pin#*@}
    # each tarball holds package/build/<name>.min.js, the browser (UMD) build
    tar -xzf "$tmp/$name-$version.tgz" -C "$tmp" "package/build/$name.min.js" &&
      mv "$tmp/package/build/$name.min.js" "$CACHE/$name.min.js" ||
      { echo "setup_browser: no build/$name.min.js in $name-$version.tgz" >&2; rm -rf "$tmp"; return 1; }
  done
  echo "$PINS" > "$CACHE/PINS"        # written last: a half-done fetch is fetched again
  rm -rf "$tmp"
}

have_browser() {
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null
}

install_browser() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup_browser: chromium not found; install it (Debian: sudo apt-get install -y chromium)" >&2
    return 1
  fi
  echo "setup_browser: installing chromium (apt-get, a minute or two, once) ..." >&2
  local log; log=$(mktemp)
  # a fresh machine may have no package lists yet: update, then retry once
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >"$log" 2>&1; then
    apt-get update -q >>"$log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$log" 2>&1 ||
      { echo "setup_browser: apt-get install chromium failed:" >&2; tail -5 "$log" >&2; rm -f "$log"; return 1; }
  fi
  rm -f "$log"
}

have_js || fetch_js || true
have_browser || install_browser || true
exit 0
