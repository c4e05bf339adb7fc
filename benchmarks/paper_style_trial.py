"""One trial the way the original code ran it, for comparison: a fresh process that loads the model from
disk, tokenizes the whole task padded to max_length (as run_glue did), finetunes with static padding and
the default (unfused) AdamW, evaluates, and saves the finetuned model. Same subset, same surgery as ours.

    python benchmarks/paper_style_trial.py --model minilm --task sst2 --data-dir ../shared/data/glue --k 3
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F


def main() -> None:
    started = time.perf_counter()
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="minilm")
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir")
    p.add_argument("--size", type=int, default=500)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainables.ablations import Reinit, apply_ablation
    from trainables.data import draw_subset
    from trainables.metrics import compute_metrics
    from trainables.models import layer_stack, resolve_model_path
    from trainables.tasks import load_task

    path = resolve_model_path(args.model)
    raw = load_task(args.task, args.data_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)

    def encode(split):
        pair = "text_b" in split.column_names
        enc = tokenizer(list(split["text_a"]), list(split["text_b"]) if pair else None, truncation=True,
                        max_length=128, padding="max_length", return_tensors="pt")
        return enc, torch.as_tensor(np.asarray(split["label"]))

    (train, train_y), (dev, dev_y) = encode(raw.train), encode(raw.validation)
    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=raw.task.num_labels)
    apply_ablation(Reinit.incremental(args.k, len(layer_stack(model))), model, args.seed)
    rows = torch.as_tensor(draw_subset(len(train_y), args.size, args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    compute = 0.0
    for _ in range(args.epochs):
        tick = time.perf_counter()
        model.train()
        for batch in rows[torch.randperm(len(rows))].split(8):
            logits = model(**{k: v[batch] for k, v in train.items()}).logits
            loss = F.cross_entropy(logits, train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        preds = []
        with torch.no_grad():
            for batch in torch.arange(len(dev_y)).split(8):
                preds.append(model(**{k: v[batch] for k, v in dev.items()}).logits.argmax(-1))
        metrics = compute_metrics(raw.task, torch.cat(preds).numpy(), dev_y.numpy())
        compute += time.perf_counter() - tick
    with tempfile.TemporaryDirectory() as out:
        model.save_pretrained(out)  # the original kept a full model per trial
    print(json.dumps({"metrics": metrics, "compute_seconds": compute, "wall_seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
