#!/usr/bin/env bash
# Fetch what scripts/gpu_check.sh needs on a machine without network into .whl/ (ignored by
# git): the pinned pylance for CPython 3.12 on x86-64 Linux, repacked as pylance.tar.xz so it
# fits a 64 MB transfer (the wheel is 85 MB). Everything else gpu_check needs (torch, numpy,
# pyarrow, click, tokenizers, tiktoken, tqdm) is expected on a GPU image already.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=$(sed -n 's/.*"pylance==\([^"]*\)".*/\1/p' pyproject.toml | head -1)
mkdir -p .whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$tmp" "pylance==$VERSION"
mkdir "$tmp/site"
(cd "$tmp/site" && "$PY" -m zipfile -e "$tmp"/pylance-*.whl .)
XZ_OPT="-9 -T0" tar -cJf .whl/pylance.tar.xz -C "$tmp/site" .
ls -la .whl
