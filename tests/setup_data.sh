#!/usr/bin/env bash
# Set-up for the tests that need Fashion-MNIST's real files (tests/test_fashion_mnist.py's real-file
# test, tests/test_fashion_mnist_grid.py): its SHA-256 check admits no stand-in. When neither
# datasets/fashion_mnist/ nor Debian's package folder holds them, fetch Debian's package
# (dataset-fashion-mnist, 30 MB; `apt-get download` needs no root) and put its four .gz in
# datasets/fashion_mnist/ (git-ignored), route 1 of structinit/data/fashion_mnist.py.
# Called by `./run.sh test` (and so by CI). Never fails the run: what it cannot set up, it says,
# and those tests skip.
set -uo pipefail
cd "$(dirname "$0")/.."

DEST=datasets/fashion_mnist
FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

have() {
  local folder=$1 f
  for f in $FILES; do [ -s "$folder/$f.gz" ] || [ -s "$folder/$f" ] || return 1; done
}

have "$DEST" && exit 0
have /usr/share/datasets/fashion-mnist && exit 0
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
  { echo "setup_data: no apt-get/dpkg-deb: Fashion-MNIST's real-file tests will skip" >&2; exit 0; }
tmp=$(mktemp -d) || exit 0
trap 'rm -rf "$tmp"' EXIT
echo "setup_data: fetching Debian's dataset-fashion-mnist into $DEST ..." >&2
if ! (cd "$tmp" && apt-get download -q dataset-fashion-mnist >"$tmp/apt.log" 2>&1); then
  echo "setup_data: apt-get download failed; Fashion-MNIST's real-file tests will skip:" >&2
  tail -3 "$tmp/apt.log" >&2
  exit 0
fi
dpkg-deb -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/root" || { echo "setup_data: dpkg-deb failed" >&2; exit 0; }
for f in $FILES; do cp "$tmp/root/usr/share/datasets/fashion-mnist/$f.gz" "$DEST/" || exit 0; done
echo "setup_data: $DEST holds Fashion-MNIST's four files (each checked by SHA-256 when read)" >&2
