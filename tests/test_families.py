"""Model families through the sweep: a real sweep on a RoBERTa, ALBERT refused for layer-wise experiments
but probed, and models that cannot be built refused in one line before Ray starts."""
from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from analysis.results import read_results
from sweep.cli import main


def sweep_argv(model: str, storage, experiment: str = "incremental", *options: str) -> list[str]:
    return [experiment, "--model", model, "--tasks", "synthetic", "--sizes", "16", "--trials", "1", "--epochs", "1",
            "--storage", str(storage), "--name", experiment, *options]


def test_roberta_checkpoint_sweeps_and_rows_record_its_family(ray_local, tiny_family, tmp_path):
    # A saved RoBERTa base model carries a pooler its classifier has none of: this used to fail every trial.
    assert main(sweep_argv(tiny_family("roberta"), tmp_path, "incremental", "--k", "2", "4")) == 0
    rows = read_results(tmp_path / "incremental")
    assert len(rows) == 2 and set(rows["status"]) == {"ok"}
    assert set(rows["model_type"]) == {"roberta"}


def test_albert_is_refused_for_layer_experiments_before_any_work(tiny_family, tmp_path, capsys):
    for experiment in ("incremental", "permutation", "heads", "lr-multipliers"):
        assert main(sweep_argv(tiny_family("albert"), tmp_path, experiment)) == 2
        err = capsys.readouterr().err
        assert f"cannot run {experiment}: ALBERT shares one set of weights across all its layers" in err
        assert "only probing works" in err
        assert not (tmp_path / experiment).exists(), "refused before any row, or Ray, was made"


def test_albert_is_probed(ray_local, tiny_family, tmp_path):
    argv = ["probing", "--model", tiny_family("albert"), "--tasks", "synthetic", "--sizes", "24", "--trials", "1",
            "--layers", "0", "4", "--max-probe-epochs", "2", "--storage", str(tmp_path), "--name", "probe"]
    assert main(argv) == 0
    rows = read_results(tmp_path / "probe")
    assert sorted(rows["layer"]) == [0, 4] and set(rows["status"]) == {"ok"}
    assert set(rows["model_type"]) == {"albert"}


def test_pooler_options_are_refused_for_families_without_one(tiny_family, tmp_path, capsys):
    assert main(sweep_argv(tiny_family("electra"), tmp_path, "incremental", "--reinit-pooler")) == 2
    assert "--reinit-pooler: " in capsys.readouterr().err
    argv = ["probing", "--model", tiny_family("roberta"), "--tasks", "synthetic", "--sizes", "24", "--trials", "1",
            "--probes", "cls-pooler", "--storage", str(tmp_path), "--name", "probe"]
    assert main(argv) == 2
    assert "--probes: cls-pooler read the pooler; " in capsys.readouterr().err
    assert not (tmp_path / "probe").exists()


def test_checkpoint_whose_weights_do_not_fit_is_refused_in_one_line_before_ray(tiny_family, tmp_path, capsys):
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(tiny_family("bert"), folder)
    weights = load_file(folder / "model.safetensors")
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert main(sweep_argv(str(folder), tmp_path / "out")) == 2
    err = capsys.readouterr().err
    lines = err[err.index("cannot start the sweep:"):].strip().splitlines()  # after any progress bars
    assert len(lines) == 2
    assert f"--model: '{folder}' cannot be built" in lines[1] and "encoder.layer.1.output.dense.weight" in lines[1]


def test_unsupported_family_is_refused(tmp_path, capsys):
    from transformers import GPT2Config, GPT2Model

    GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)).save_pretrained(tmp_path / "gpt2")
    assert main(sweep_argv(str(tmp_path / "gpt2"), tmp_path / "out", "incremental", "--dry-run")) == 2
    assert "is a 'gpt2' model; supported families: bert, roberta" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["distilbert", "deberta-v3"])
def test_other_families_dry_run_with_their_shape(tiny_family, tmp_path, capsys, name):
    assert main(sweep_argv(tiny_family(name), tmp_path, "heads", "--dry-run")) == 0
    assert "(4 layers)" in capsys.readouterr().out


def test_half_precision_checkpoint_is_finetuned_in_float32(tiny_family, tmp_path):
    # transformers 5 loads a checkpoint in the dtype it was saved in: a bf16 one gave bf16 master weights, so
    # the unfused trials (every family but BERT) took AdamW steps of 2e-5 on bf16 weights (mostly rounded
    # away) and drew their surgery in bf16, while fused BERT packs copy the weights into float32 banks.
    import torch
    from transformers import AutoModel

    from trainables.ablations import Reinit, apply_ablation
    from trainables.models import build_classifier, load_pretrained

    AutoModel.from_pretrained(tiny_family("electra")).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    saved = load_file(tmp_path / "bf16" / "model.safetensors")
    assert {v.dtype for v in saved.values()} == {torch.bfloat16}
    pretrained = load_pretrained(str(tmp_path / "bf16"))
    assert {v.dtype for v in pretrained.state_dict.values() if v.is_floating_point()} == {torch.float32}
    assert all(torch.equal(pretrained.state_dict[k], v.float()) for k, v in saved.items())
    model = apply_ablation(Reinit(layers=(4,)), build_classifier(pretrained, num_labels=2, seed=0), 0)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("name", ["distilbert", "deberta-v3"])
def test_pooler_reinit_is_refused_before_any_layer_is_touched_naming_the_family(tiny_family, name):
    import torch

    from trainables.ablations import Reinit, apply_ablation
    from trainables.models import build_classifier, load_pretrained

    pretrained = load_pretrained(tiny_family(name))
    model = build_classifier(pretrained, num_labels=2, seed=0)
    with pytest.raises(ValueError, match="reinit_pooler=True but this model has no pooler") as refusal:
        apply_ablation(Reinit(layers=(3, 4), reinit_pooler=True), model, 0)
    assert f"'{name.replace('-v3', '-v2')}'" in str(refusal.value) and "allowed for: bert" in str(refusal.value)
    assert all(torch.equal(v, pretrained.state_dict[k]) for k, v in model.base_model.state_dict().items())
