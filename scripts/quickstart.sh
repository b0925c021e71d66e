#!/usr/bin/env bash
# The whole pipeline on the embedded default corpus (builtin:pydocs), no downloads. Grows as stages land.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-quickstart_out}
rm -rf "$OUT" && mkdir -p "$OUT"
echo "== 1/3 tokenizer (byte-level BPE) on builtin:pydocs"
$PY data_prep/train_tokenizer.py --kind bbpe --input builtin:pydocs --vocab-size 8000 --output "$OUT/tokenizer"
echo "== 2/3 indexed shards"
$PY data_prep/build_indexed.py --input builtin:pydocs --tokenizer "$OUT/tokenizer" --output-prefix "$OUT/data/pydocs" --workers 2 \
    --split-sentences --chunk-size-mb 2
echo "== 3/3 inspect"
$PY data_prep/inspect_indexed.py "$OUT/data/pydocs"
echo "quickstart: OK"
