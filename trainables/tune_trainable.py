"""The Ray Tune function trainable: a thin wrapper that turns a config dict into a `finetune` call.

Everything heavy (tokenized tasks, pretrained weights) arrives through `tune.with_parameters`, i.e. Ray's
object store, once per node rather than once per trial.
"""
from __future__ import annotations

from trainables.ablations import ablation_from_dict
from trainables.finetune import FinetuneConfig, finetune


def finetune_config(trial: dict, gpu_fraction: float, threads: int) -> FinetuneConfig:
    """The FinetuneConfig a trial config (as built by the sweep) describes."""
    fields = dict(trial["finetune"])
    return FinetuneConfig(
        **fields, ablation=ablation_from_dict(trial["ablation"]), gpu_fraction=gpu_fraction, threads=threads
    )


def finetune_trainable(config: dict, data: dict, pretrained: dict) -> None:
    from ray import tune

    trial = config["trial"]
    resources = tune.get_context().get_trial_resources().required_resources
    cfg = finetune_config(trial, gpu_fraction=resources.get("GPU", 0.0), threads=int(resources.get("CPU", 1)))
    intermediate = data[trial["intermediate_data_key"]] if trial.get("intermediate_data_key") else None
    finetune(cfg, data[trial["data_key"]], pretrained[trial["model_key"]], report=tune.report,
             intermediate=intermediate)
