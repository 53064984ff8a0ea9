#!/usr/bin/env bash
# Set-up for the tests that need Fashion-MNIST's real files (tests/test_fashion_mnist.py's real-file
# test, tests/test_fashion_mnist_grid.py): its SHA-256 check admits no stand-in. When neither
# datasets/fashion_mnist/ nor Debian's package folder holds them, fetch Debian's package
# (dataset-fashion-mnist, 30 MB; `apt-get download` needs no root) and put its four .gz in
# datasets/fashion_mnist/ (git-ignored), route 1 of structinit/data/fashion_mnist.py.
# Called by `./run.sh test`. What it cannot set up, it says, and those tests skip; with
# STRUCTINIT_REQUIRE_DATA=1 (CI, .ci/run) it fails instead, so CI never goes green without them.
set -uo pipefail
cd "$(dirname "$0")/.."

DEST=datasets/fashion_mnist
FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

give_up() {
  echo "setup_data: $1; Fashion-MNIST's real-file tests will skip" >&2
  [ "${STRUCTINIT_REQUIRE_DATA:-}" = 1 ] && { echo "setup_data: STRUCTINIT_REQUIRE_DATA=1: failing" >&2; exit 1; }
  exit 0
}

have() {
  local folder=$1 f
  for f in $FILES; do [ -s "$folder/$f.gz" ] || [ -s "$folder/$f" ] || return 1; done
}

have "$DEST" && exit 0
have /usr/share/datasets/fashion-mnist && exit 0
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || give_up "no apt-get/dpkg-deb"
tmp=$(mktemp -d) || give_up "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
echo "setup_data: fetching Debian's dataset-fashion-mnist into $DEST ..." >&2
fetch() { (cd "$tmp" && apt-get download -q dataset-fashion-mnist >"$tmp/apt.log" 2>&1); }
# a fresh machine's package lists may be empty or stale: refresh them once (needs root) and retry
if ! fetch && ! { apt-get update -q >>"$tmp/apt.log" 2>&1 && fetch; }; then
  tail -3 "$tmp/apt.log" >&2
  give_up "apt-get download failed"
fi
dpkg-deb -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/root" || give_up "dpkg-deb failed"
mkdir -p "$DEST"
for f in $FILES; do cp "$tmp/root/usr/share/datasets/fashion-mnist/$f.gz" "$DEST/" || give_up "copying $f.gz failed"; done
echo "setup_data: $DEST holds Fashion-MNIST's four files (each checked by SHA-256 when read)" >&2
