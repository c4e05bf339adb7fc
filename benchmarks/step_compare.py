"""One pack-step's profile on a GPU under several source trees in one run: a change against its baseline on the
same card (a lent GPU's minutes are few, and timings compare only on one machine).

    mkdir -p .gpu/base && git archive BASE trainables trialrows benchmarks | tar -x -C .gpu/base   # here
    python3 benchmarks/step_compare.py --trees . .gpu/base --packs 34 --tokenizer .gpu/tok --data-dir .gpu/glue

A tree may carry settings for its process: `.,REINIT_SWEEP_TRITON=0` is this tree with that variable set.

Each tree runs in a fresh process of its own, with its own trainables and its own benchmarks/fused_bench.py
(whose step_profile it calls, steps replayed as CUDA graphs). BERT-base's shape with random weights, the
paper's SST-2 trials (fused_bench's). Prints one line per tree and pack; --out writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ONE = r"""
import json, sys, types
tree, packs, tokenizer, data_dir, table = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
sys.path[:0] = [tree, tree + "/benchmarks"]
import fused_bench as fb
from transformers import AutoTokenizer
pretrained = fb.bert_base_shape()
data = fb.sst2_task(data_dir, AutoTokenizer.from_pretrained(tokenizer), "bert-base-uncased-vocab")
args = types.SimpleNamespace(size=500, epochs=5, precision="bf16", threads=1)
cfgs = fb.trial_configs(max(packs), args, pretrained.num_layers, True)
for size in packs:
    row = fb.step_profile(cfgs[:size], data, pretrained, table=table and f"{table}_pack{size}.txt", graphs=True)
    print("ROW " + json.dumps(row), flush=True)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs="+", required=True,
                   help="source trees (each with trainables/ and benchmarks/), each as TREE[,VAR=VALUE...]")
    p.add_argument("--packs", type=int, nargs="+", default=[34])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", help="JSON of every row; kernel tables beside it")
    args = p.parse_args()
    rows = []
    for n, tree in enumerate(args.trees):
        path, *settings = tree.split(",")
        table = str(Path(args.out).with_name(f"kernels_tree{n}")) if args.out else ""
        done = subprocess.run([sys.executable, "-c", ONE, str(Path(path).resolve()), json.dumps(args.packs),
                               args.tokenizer, args.data_dir, table], capture_output=True, text=True,
                              env={**os.environ, **dict(s.split("=", 1) for s in settings)})
        if done.returncode:
            print(f"{tree}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        for line in done.stdout.splitlines():
            if line.startswith("ROW "):
                row = {"tree": tree, **json.loads(line[4:])}
                rows.append(row)
                print(f"{tree}, pack {row['pack']}: {row['seconds_per_step'] * 1e3:.1f} ms a step, host "
                      f"{row['host_issue_seconds_per_step'] * 1e3:.1f} ms, kernels {row['kernel_seconds_per_step'] * 1e3:.1f} ms, "
                      f"peak {row['peak_memory_gib']:.1f} GiB", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
