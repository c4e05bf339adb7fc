"""The lr-multipliers search: per-layer optimizer groups, the held-out objective, a real Optuna search
through Ray Tune on a tiny model, and a killed search that a rerun continues."""
from __future__ import annotations

import argparse
import json
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pyarrow.fs
import pytest

from analysis.results import read_results
from analysis.search import best_table, importance_table
from sweep.cli import main
from sweep.experiments import GridSettings
from tests.commands import overridden
from trialrows.experiments import lr_multipliers
from tests.conftest import run_then_sigkill
from sweep.search import MultiplierSpace, layer_params, run_searches, trial_config
from trainables.ablations import Reinit
from trainables.data import draw_subset, tokenize_task
from trainables.finetune import FinetuneConfig, finetune, hold_out, make_optimizer
from trainables.models import build_classifier, layer_stack, load_pretrained, load_tokenizer
from trainables.tasks import load_task

NUM_SAMPLES = 4
LR = 1e-2  # large enough that a tiny model's objective moves with its multipliers
# A base seed whose 4 proposals do not all tie on the 8 held-out examples (with --seed 0 they do, and ASHA
# then has nothing to stop): the pruning assertions need a study where a later trial falls below a rung.
SEED = 3


@pytest.fixture(scope="module")
def pretrained(tiny_bert):
    return load_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def synthetic(tiny_bert):
    return tokenize_task(load_task("synthetic"), load_tokenizer(tiny_bert), tiny_bert, 128)


def test_each_layer_gets_its_multiplier_in_the_optimizer_exactly(pretrained):
    model = build_classifier(pretrained, 2, seed=0)
    multipliers = (0.1, 0.5, 2.0, 7.3)
    cfg = FinetuneConfig(task="synthetic", train_size=40, subset_seed=0, seed=0, lr=3e-5, epochs=1,
                         layer_lr_multipliers=list(multipliers))  # a Tune config carries a list
    optimizer, _ = make_optimizer(model, cfg, np.arange(40))
    groups = {g["name"]: g for g in optimizer.param_groups}
    for i, (layer, m) in enumerate(zip(layer_stack(model), multipliers), start=1):
        assert {id(p) for p in groups[f"layer_{i}"]["params"]} == {id(p) for p in layer.parameters()}
        assert groups[f"layer_{i}"]["lr"] == 3e-5 * m
    assert groups["base"]["lr"] == 3e-5  # embeddings, pooler, head
    base = {id(p) for p in groups["base"]["params"]}
    assert {id(p) for p in model.bert.embeddings.parameters()} <= base
    assert {id(p) for p in model.classifier.parameters()} <= base
    everything = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(everything) == sorted(id(p) for p in model.parameters()), "every parameter exactly once"

    with pytest.raises(ValueError, match="3 layer learning-rate multipliers for a model of 4 layers"):
        make_optimizer(model, dataclasses.replace(cfg, layer_lr_multipliers=(1.0, 1.0, 1.0)), np.arange(40))
    with pytest.raises(ValueError, match="must all be positive"):
        FinetuneConfig(task="synthetic", train_size=40, subset_seed=0, seed=0, layer_lr_multipliers=(1.0, 0.0))
    with pytest.raises(ValueError, match="not both"):
        FinetuneConfig(task="synthetic", train_size=40, subset_seed=0, seed=0, lr_multiplier=5.0,
                       layer_lr_multipliers=(1.0,) * 4)


def test_held_out_part_is_never_trained_on_and_reported_apart_from_dev(pretrained, synthetic):
    subset = draw_subset(len(synthetic.train), 40, 3)
    train, held = hold_out(subset, 8, 3)
    assert len(held) == 8 and len(train) == 32 and not set(train) & set(held)
    assert sorted([*train, *held]) == sorted(subset)
    assert np.array_equal(hold_out(subset, 8, 3)[1], held), "the carve has a seed: the subset seed"
    assert np.array_equal(hold_out(subset, 0, 3)[0], subset)

    cfg = FinetuneConfig(task="synthetic", train_size=40, subset_seed=3, seed=3, epochs=2, val_size=8,
                         ablation=Reinit(layers=(3, 4)), layer_lr_multipliers=(1, 1, 2, 2))
    result = finetune(cfg, synthetic, pretrained)
    assert len(result["val_metrics_by_epoch"]) == 2 and result["val_metric"] == result["val_metrics_by_epoch"][-1]
    assert result["val_size"] == 8 and result["dev_metric"] == result["dev_accuracy"]
    assert result["layer_lrs"] == [cfg.lr * m for m in (1, 1, 2, 2)]
    plain = finetune(dataclasses.replace(cfg, val_size=0, layer_lr_multipliers=None, epochs=1), synthetic, pretrained)
    assert "val_metric" not in plain and "layer_lrs" not in plain, "no carve unless asked"


def test_grouped_space_gives_two_multipliers_and_the_baseline_first():
    assert layer_params("reinit-vs-kept", 2, 4) == ("kept", "kept", "reinit", "reinit")
    assert layer_params("layer", 2, 3) == ("layer_1", "layer_2", "layer_3")
    settings = GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 1),), k=(2,),
                            multiplier_group="reinit-vs-kept", multiplier_range=(0.5, 4.0))
    (cell,) = lr_multipliers(settings, 4)
    space = MultiplierSpace(layer_params("reinit-vs-kept", 2, 4), 0.5, 4.0, cell.to_config())
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    study.enqueue_trial(space.baseline)
    first, second = study.ask(), study.ask()
    assert space(first)["trial"]["finetune"]["layer_lr_multipliers"] == [1.0] * 4
    config = space(second)["trial"]
    kept, reinit = second.params["kept"], second.params["reinit"]
    assert config["finetune"]["layer_lr_multipliers"] == [kept, kept, reinit, reinit]
    assert 0.5 <= kept <= 4.0 and 0.5 <= reinit <= 4.0 and set(second.params) == {"kept", "reinit"}
    assert config["trial_id"] == f"{cell.trial_id}-s1" and config["row"]["cell"] == cell.trial_id
    assert config["finetune"]["val_size"] == 20  # 0.2 of the subset, held out
    assert trial_config(cell.to_config(), 0, [1.0] * 4)["row"]["sample"] == 0


def search_argv(model, storage, name, *extra):
    return overridden(["lr-multipliers", "--model", model, "--tasks", "synthetic", "--sizes", "40", "--trials", "1",
                       "--k", "2", "--epochs", "2", "--lr", str(LR), "--seed", str(SEED), "--cpus-per-trial", "2",
                       "--storage", str(storage), "--name", name], extra)


def searched_study(cell_folder) -> optuna.Study:
    """The Optuna study of a cell's newest run, as Tune saved it with that experiment (OptunaSearch's own
    state; read here only to check what the study learned, never by a rerun)."""
    from ray.tune.search.optuna import OptunaSearch

    searcher = OptunaSearch()
    searcher.restore_from_dir(str(sorted(Path(cell_folder).glob("tune-*"))[-1]))
    return searcher._ot_study


@pytest.mark.slow  # two searches of 4 trials through Tune: about a minute on 2 idle cores
def test_real_search_through_tune_never_reads_dev(ray_local, tiny_bert, synthetic, pretrained, tmp_path, capsys):
    argv = search_argv(tiny_bert, tmp_path, "real", "--num-samples", str(NUM_SAMPLES))
    assert main(argv) == 0
    rows = read_results(tmp_path / "real").sort_values("sample").reset_index(drop=True)
    (cell,) = set(rows["cell"])
    assert list(rows["trial_id"]) == [f"{cell}-s{n}" for n in range(NUM_SAMPLES)]
    assert list(rows["multipliers"][0]) == [1.0] * 4, "the study starts with its cell's baseline"
    assert set(rows["status"]) <= {"ok", "pruned"} and "pruned" in set(rows["status"]), "ASHA stopped a trial"
    pruned = rows[rows["status"] == "pruned"]
    assert (pruned["epochs_run"] < 2).all() and pruned["val_objective"].notna().all()
    for _, row in rows.iterrows():  # the optimizer got exactly the proposed multipliers, layer by layer
        assert list(row["layer_lrs"]) == [LR * m for m in row["multipliers"]]
        assert all(0.1 <= m <= 10 for m in row["multipliers"])

    study = searched_study(tmp_path / "real" / "searches" / cell)
    assert len(study.trials) == NUM_SAMPLES
    for trial in study.trials:  # rows hold what Optuna proposed and what it was told
        row = rows.iloc[trial.number]
        assert list(row["multipliers"]) == [trial.params[f"layer_{i}"] for i in range(1, 5)]
        assert trial.value == row["val_objective"]

    # The same search with every dev label changed: the proposals and objectives cannot move, dev must.
    poisoned = dataclasses.replace(synthetic, validation=dataclasses.replace(
        synthetic.validation, labels=np.zeros_like(synthetic.validation.labels)))
    settings = GridSettings.of(model=tiny_bert, tasks=("synthetic",), sizes=(40,), trials=((0, 1),), k=(2,),
                            epochs=2, lr=LR, seed=SEED)
    specs = lr_multipliers(settings, 4)  # as a dry run builds them: the sweep's cell adds its fingerprints
    prints = rows.iloc[0][["data_fingerprint", "model_fingerprint"]].to_dict()
    specs = [dataclasses.replace(s, **prints) for s in specs]
    assert [s.trial_id for s in specs] == [cell]
    run_searches(specs, data={"synthetic@128": poisoned}, pretrained={tiny_bert: pretrained},
                 folder=tmp_path / "poisoned" / "rows", tune_dir=tmp_path / "poisoned", cpus_per_trial=2,
                 gpus_per_trial=0, options=argparse.Namespace(num_samples=NUM_SAMPLES))
    other = read_results(tmp_path / "poisoned").sort_values("sample").reset_index(drop=True)
    assert list(other["trial_id"]) == list(rows["trial_id"])
    assert other["multipliers"].map(list).tolist() == rows["multipliers"].map(list).tolist()
    assert other["val_metrics_by_epoch"].map(list).tolist() == rows["val_metrics_by_epoch"].map(list).tolist()
    assert list(other["status"]) == list(rows["status"])
    assert other["dev_metric"].tolist() != rows["dev_metric"].tolist(), "the poisoned dev split was evaluated"

    # A finished study runs nothing again; a different budget for it is refused.
    capsys.readouterr()
    assert main(argv) == 0 and "0 to run" in capsys.readouterr().out
    assert main(search_argv(tiny_bert, tmp_path, "real", "--num-samples", "6")) == 2
    assert f"--num-samples: 6 differs from the {NUM_SAMPLES}" in capsys.readouterr().err

    best = best_table(rows)
    assert len(best) == 1 and best.loc[0, "baseline_val"] == rows.loc[0, "val_objective"]
    assert best.loc[0, "best_val"] == rows.loc[rows["status"] == "ok", "val_objective"].max()
    importances = importance_table(rows)
    assert len(importances) in (1, 4) and set(importances["cell"]) == {cell}


@pytest.mark.parametrize("argv, message", [
    (["--multiplier-range", "2", "10"], "--multiplier-range: 2 10 must be positive, finite and contain 1"),
    (["--num-samples", "0"], "--num-samples: 0 must be at least 1"),
    (["--val-fraction", "1.5"], "--val-fraction: 1.5 must be in (0, 1)"),
])
def test_bad_search_options_are_refused_before_any_work(tiny_bert, tmp_path, capsys, argv, message):
    assert main([*search_argv(tiny_bert, tmp_path, "bad"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_killed_search_then_rerun_continues_the_study(tiny_bert, tmp_path):
    budget = 5
    argv = [sys.executable, "-m", "sweep", *search_argv(tiny_bert, tmp_path, "kill", "--num-samples", str(budget))]
    rows = tmp_path / "kill" / "rows"
    run_then_sigkill(argv, ready=lambda: len(list(rows.glob("*.parquet"))) >= 2)
    before = {p.name: p.stat().st_mtime_ns for p in rows.glob("*.parquet")}
    assert 2 <= len(before) < budget, f"the kill should land mid-search; {len(before)} rows were written"

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Restoring the run" not in rerun.stdout + rerun.stderr, "Tune's pickled state is never restored"
    assert rerun.stdout.count("had landed in an earlier run") == len(before), "each landed trial replays, once"
    table = read_results(tmp_path / "kill")
    assert len(table) == budget and table["trial_id"].is_unique
    assert sorted(table["sample"]) == list(range(budget)), "the numbering went on, no second study"
    again = [name for name, mtime in before.items() if (rows / name).stat().st_mtime_ns != mtime]
    assert again == [], f"finished trials ran again: {again}"
    (cell,) = set(table["cell"])
    study = searched_study(tmp_path / "kill" / "searches" / cell)
    assert len(study.trials) == budget, "the rebuilt study learned every landed trial and ran the rest"
    landed = table.set_index("trial_id").loc[[Path(name).stem for name in before]]
    learned = {tuple(sorted(t.params.values())): t.value for t in study.trials}
    for row in landed.itertuples():  # the study was told each landed trial's own held-out figure
        assert learned[tuple(sorted(map(float, row.multipliers)))] == pytest.approx(row.val_objective)


def test_a_landed_trial_that_a_restored_study_runs_again_is_replayed_not_trained(ray_local, tiny_bert, tmp_path,
                                                                                capsys):
    from ray import tune

    from sweep.runner import make_tuner
    from sweep.search import SearchRowWriter, landed_reports
    from sweep.store import write_row
    from trainables.rows import make_row
    from trainables.tune_trainable import finetune_trainable, replay_key

    settings = GridSettings.of(model=tiny_bert, tasks=("synthetic",), sizes=(40,), trials=((0, 1),), k=(2,), epochs=3)
    (spec,) = lr_multipliers(settings, 4)
    folder = tmp_path / "rows"
    landed_config = trial_config(spec.to_config(), 1, [0.5, 1.0, 2.0, 3.0])
    write_row(folder, make_row(landed_config["row"], {"val_metric": 0.7, "val_metrics_by_epoch": [0.6, 0.7],
                                                      "epochs_run": 2}, "pruned", val_objective=0.7))
    (row_file,) = folder.glob("*.parquet")
    written = row_file.stat().st_mtime_ns

    landed = landed_reports([spec], folder)
    assert list(landed) == [replay_key(landed_config)]
    assert replay_key(trial_config(spec.to_config(), 1, [0.5, 1.0, 2.0, 2.9])) not in landed, \
        "the same trial number at another point of the space is trained"
    assert landed_reports([], folder) == {}, "only the cells of this run"

    # No data and no weights: a trial that trained would fail.
    trainable = tune.with_parameters(finetune_trainable, data={}, pretrained={}, landed=landed)
    tuner = make_tuner(trainable, name="replay", storage_path=tmp_path / "tune", max_failures=0,
                       param_space={"trial": landed_config}, callbacks=[SearchRowWriter(folder, spec.trial_id, 4)])
    (result,) = tuner.fit()
    assert result.error is None
    assert result.metrics["replayed"] and result.metrics["epoch"] == 2 and result.metrics["val_metric"] == 0.7
    assert list(result.metrics_dataframe["val_metric"]) == [0.6, 0.7], "the scheduler sees every epoch again"
    assert row_file.stat().st_mtime_ns == written and len(list(folder.glob("*.parquet"))) == 1, "its row stands"
    assert "s1 had landed in an earlier run" in capsys.readouterr().out


def test_search_on_object_storage_lands_rows_and_reruns_nothing(ray_local, tiny_bert, s3_bucket, capsys):
    from sweep.store import join, sweep_dir

    argv = search_argv(tiny_bert, s3_bucket, "on-s3", "--num-samples", "2", "--epochs", "1")
    assert main(argv) == 0
    rows = read_results(sweep_dir(s3_bucket, "on-s3"))
    assert sorted(rows["sample"]) == [0, 1] and set(rows["status"]) == {"ok"}
    (cell,) = set(rows["cell"])
    assert searched_study_uri(join(sweep_dir(s3_bucket, "on-s3"), "searches", cell)) == 2
    capsys.readouterr()
    assert main(argv) == 0 and "0 to run" in capsys.readouterr().out


def searched_study_uri(cell_folder: str) -> int:
    """How many trials the Tune experiment of a cell's newest run under a storage URI holds."""
    fs, path = pyarrow.fs.FileSystem.from_uri(cell_folder)
    (run,) = [f.path for f in fs.get_file_info(pyarrow.fs.FileSelector(path)) if f.base_name.startswith("tune-")]
    saved = [f for f in fs.get_file_info(pyarrow.fs.FileSelector(run)) if f.base_name.startswith("experiment_state")]
    return len(json.loads(fs.open_input_stream(saved[-1].path).read())["trial_data"])


def test_the_same_search_suggests_the_same_multipliers_whichever_trial_ends_first():
    from sweep.search import VAL_METRIC, search_options

    settings = GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 1),), k=(2,))
    (cell,) = lr_multipliers(settings, 4)

    def suggested(newest_ends_first: bool) -> list[list[float]]:
        """Tune's loop with room for two trials: it asks while a slot is free, and one running trial ends."""
        searcher = search_options(cell, 4, 6)["search_alg"]
        running, asked = {}, []
        while len(asked) < 6:
            while len(running) < 2 and len(asked) < 6:
                config = searcher.suggest(f"t{len(asked)}")
                if config is None:
                    break
                running[f"t{len(asked)}"] = config["trial"]["finetune"]["layer_lr_multipliers"]
                asked.append(running[f"t{len(asked)}"])
            ended = list(running)[-1 if newest_ends_first else 0]
            objective = -float(np.sum(np.log(running.pop(ended)) ** 2))
            searcher.on_trial_complete(ended, {VAL_METRIC: objective})
        return asked

    assert suggested(newest_ends_first=False) == suggested(newest_ends_first=True)


def test_the_study_learns_an_asha_stopped_trial_as_pruned_and_a_diverged_one_as_failed():
    from sweep.search import VAL_METRIC, search_options

    settings = GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 1),), k=(2,), epochs=2)
    (cell,) = lr_multipliers(settings, 4)
    searcher = search_options(cell, 4, 6)["search_alg"]
    endings = {  # what Tune passes: the epoch reports it let through, then the last report
        "ran": ([0.6], {"epoch": 2, VAL_METRIC: 0.7}),
        "stopped": ([], {"epoch": 1, VAL_METRIC: 0.9}),  # ASHA's stopping report reaches on_trial_complete only
        "diverged": ([0.8], {"epoch": 2, VAL_METRIC: float("nan")}),
    }
    for trial_id, (reports, last) in endings.items():
        assert searcher.suggest(trial_id) is not None
        for epoch, value in enumerate(reports, start=1):
            searcher.on_trial_result(trial_id, {"epoch": epoch, "training_iteration": epoch, VAL_METRIC: value})
        searcher.on_trial_complete(trial_id, {**last, "training_iteration": last["epoch"]})
    study = searcher.searcher._ot_study
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                      optuna.trial.TrialState.FAIL]
    assert study.trials[1].intermediate_values == {1: 0.9} and study.trials[1].value == 0.9, "the rung's figure"
    assert study.best_value == 0.7, "an epoch-1 figure is not a finished trial's objective"


QUIET_SCRIPT = """
import inspect, logging, sys
import optuna
import ray.tune.tune as tune_module

logging.basicConfig(level=logging.INFO)  # as a Ray task's process logs
# The line quieted is the one Tune's closing sync writes: a Ray that moved it fails here.
assert tune_module.logger.name == "ray.tune.tune" and "Wrote the latest version of all result files" in \\
    inspect.getsource(tune_module)
if sys.argv[1] == "quiet":
    from sweep.search import quiet_cell
    quiet_cell()
optuna.create_study()
tune_module.logger.info("Wrote the latest version of all result files")
tune_module.logger.warning("a real warning")
"""


def test_a_cells_study_forwards_no_optuna_or_tune_info_lines_to_the_driver():
    # Every cell's task printed "A new study created in memory" and Tune's closing "Wrote the latest version of all
    # result files ..." among the sweep's own lines.
    loud, quiet = (subprocess.run([sys.executable, "-c", QUIET_SCRIPT, mode], capture_output=True, text=True,
                                  timeout=120, cwd=Path(__file__).resolve().parents[1]) for mode in ("plain", "quiet"))
    assert loud.returncode == 0 and "A new study created" in loud.stderr and "Wrote the latest" in loud.stderr
    assert quiet.returncode == 0 and "A new study created" not in quiet.stderr, quiet.stderr
    assert "Wrote the latest" not in quiet.stderr and "a real warning" in quiet.stderr


def test_a_searchs_dry_run_prices_every_trial_of_its_studies_less_those_landed(tiny_bert, tmp_path, capsys):
    # A search's dry run printed no cost at all: its cells are studies of --num-samples finetuning trials each.
    import pyarrow as pa
    import pyarrow.parquet as pq

    argv = ["lr-multipliers", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "2", "--trials",
            "1", "--num-samples", "3", "--storage", str(tmp_path), "--name", "lrm", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (cell,) = [line.split()[0] for line in out.splitlines() if line.startswith("lr-multipliers-")]
    assert "\ntotal: 3 trials," in out, out
    # Two of the study's trials landed (their rows name the cell by its fingerprinted id, and its settings id).
    (tmp_path / "lrm" / "rows").mkdir(parents=True)
    pq.write_table(pa.table({"trial_id": [f"{cell}ff-s0", f"{cell}ff-s1"], "status": ["ok", "pruned"],
                             "cell": [f"{cell}ff"] * 2, "settings_id": [cell] * 2}),
                   tmp_path / "lrm" / "rows" / "part.parquet")
    assert main(argv) == 0
    assert "\ntotal (2 of 3 already done at these settings): 1 trials," in capsys.readouterr().out
