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
# Training stages (trainer): tiny_roberta with ZeRO-1 on 2 CPU processes, checkpoint, resume, export, plot.
RUN="$OUT/run"
# torchrun --standalone binds a free port itself (a fixed default would collide with another run on the machine)
RDZV=(--standalone)
[ -n "${MASTER_PORT:-}" ] && RDZV=(--master_port "$MASTER_PORT")
TRAIN=($PY -m torch.distributed.run "${RDZV[@]}" --nproc_per_node 2 trainer/pretrain.py
       --config tiny_roberta --set "run_dir=$RUN" --set "data.corpora.0.prefix=$OUT/data/pydocs")
echo "== 4 pretrain tiny_roberta, ZeRO-1, 2 CPU processes: steps 1-10 (checkpoint at 10)"
"${TRAIN[@]}" --set train.stop_at_step=10 --set logging.progress_bar=false
grep -q '"status": "stopped", "step": 10' "$RUN/status.json"
echo "== 5 resume from the checkpoint: steps 11-20"
"${TRAIN[@]}" --resume auto --set logging.progress_bar=false
grep -q '"status": "completed", "step": 20' "$RUN/status.json"
echo "== 6 Hugging Face export"
$PY -m trainer.export_hf --checkpoint "$RUN/checkpoints" --output "$OUT/hf" --tokenizer "$OUT/tokenizer"
echo "== 7 loss and throughput plots"
$PY -m trainer.plot "$RUN"
echo "quickstart: OK"
