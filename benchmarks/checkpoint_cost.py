"""What an epoch-end checkpoint costs: the numbers behind `--checkpoint-every`'s default (docs/benchmarks.md).

    .venv/bin/python benchmarks/checkpoint_cost.py [--storage DIR] [--repeats 3]

For the offline MiniLM and for a random BERT-base-size model (bert-base-uncased's shape: 110M parameters),
each with its AdamW state after one step, it times what a checkpoint does in a trial: build the training
state (trainables.finetune.training_state), write it to a fresh temporary folder (trainables.state.save_state:
safetensors and JSON, as trainables.tune_trainable.EpochCheckpoints does), copy that folder to the storage folder (what Tune does on
tune.report with a local storage path; a bucket upload takes the place of the copy) and, for a resume, load it
back. It prints one JSON line per model: sizes and median seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainables.finetune import Progress, training_state  # noqa: E402
from trainables.state import load_state, save_state  # noqa: E402


def models():
    from transformers import BertConfig, BertForSequenceClassification

    from trainables.models import build_classifier, load_pretrained

    yield "minilm", build_classifier(load_pretrained("minilm"), 2, seed=0)
    torch.manual_seed(0)
    yield "bert-base-size (random)", BertForSequenceClassification(BertConfig(num_labels=2))


def with_adam_state(model):
    """AdamW after one step: its two moment buffers exist for every parameter, as after any real step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return optimizer, scheduler


def measure(model, storage: Path, repeats: int) -> dict:
    optimizer, scheduler = with_adam_state(model)
    rng = np.random.default_rng(0)
    times = {"state": [], "save": [], "copy": [], "load": []}
    size = 0
    for i in range(repeats):
        tick = time.perf_counter()
        state = training_state(1, model, optimizer, scheduler, rng, Progress(by_epoch=[0.5], dev_epochs=[1]))
        times["state"].append(time.perf_counter() - tick)
        folder = tempfile.mkdtemp(prefix="checkpoint-cost-")
        tick = time.perf_counter()
        save_state(folder, state)
        times["save"].append(time.perf_counter() - tick)
        size = sum(f.stat().st_size for f in Path(folder).iterdir())
        target = storage / f"checkpoint_{i:06d}"
        tick = time.perf_counter()
        shutil.copytree(folder, target)
        os.sync()  # the copy is on disk, not in the page cache
        times["copy"].append(time.perf_counter() - tick)
        shutil.rmtree(folder)
        tick = time.perf_counter()
        load_state(target)
        times["load"].append(time.perf_counter() - tick)
        shutil.rmtree(target)
    params = sum(p.numel() for p in model.parameters())
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"parameters": params, "checkpoint_bytes": size, **{f"{k}_s": round(v, 3) for k, v in medians.items()},
            "checkpoint_s": round(medians["state"] + medians["save"] + medians["copy"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", type=Path, default=None,
                        help="a folder on the disk to measure (default: the system's temporary folder)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.storage) as storage:
        for name, model in models():
            print(json.dumps({"model": name, **measure(model, Path(storage), args.repeats)}), flush=True)


if __name__ == "__main__":
    main()
