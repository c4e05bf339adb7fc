"""Every option of every experiment is declared once (sweep.options.Option) and refused, out of range, before
any work: in a dry run too, each with a message naming the option and the value."""
from __future__ import annotations

from pathlib import Path

import pytest

from sweep.cli import build_parser, main, options_of
from sweep.experiments import EXPERIMENTS


def cases():
    for experiment in EXPERIMENTS:
        for option in options_of(experiment):
            if option.cli and not option.switch:  # a switch has no value to be out of range
                yield experiment, option


@pytest.mark.parametrize("experiment, option", [pytest.param(e, o, id=f"{e}{o.flag}") for e, o in cases()])
def test_every_option_refuses_an_out_of_range_value_before_any_work(tiny_bert, tmp_path, capsys, experiment,
                                                                    option):
    assert option.bad, f"{option.flag} declares no value it refuses"
    storage = tmp_path / "store"
    argv = [experiment, "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--trials", "1",
            "--storage", str(storage)]
    argv = [*argv, option.flag, *option.bad] if option.flag != "--storage" else [*argv[:-2], "--storage", *option.bad]
    for dry_run in (["--dry-run"], []):
        try:
            code = main([*argv, *dry_run])
        except SystemExit as exit_:  # argparse refuses what an option's type cannot read
            code = exit_.code
        err = capsys.readouterr().err
        assert code == 2, f"{option.flag} {' '.join(option.bad)} was not refused ({dry_run})"
        assert f"{option.flag}: " in err, err
        assert any(word.lstrip("-").rpartition("=")[2] in err for word in option.bad), err  # the value named
        assert not storage.exists(), "nothing may be written before the request is valid"


def test_each_experiment_lists_its_own_options_in_its_help():
    parser = build_parser()
    subcommands = parser._subparsers._group_actions[0].choices
    for name, experiment in EXPERIMENTS.items():
        text = subcommands[name].format_help()
        assert "--max-length" in text and "--storage" in text
        for other in EXPERIMENTS.values():
            for option in other.options:
                if option in experiment.options:
                    assert option.flag in text
                elif option.flag not in {o.flag for o in experiment.options}:
                    assert f"{option.flag} " not in text, f"{name}'s --help lists {option.flag}"


def test_a_length_beyond_the_models_positions_is_refused(tiny_bert, capsys):
    # The tiny BERT has 160 positions; MiniLM 512.
    assert main(["incremental", "--model", tiny_bert, "--max-length", "161", "--dry-run"]) == 2
    assert "--max-length: 161 is outside 8..160" in capsys.readouterr().err
    assert main(["incremental", "--model", tiny_bert, "--max-length", "160", "--dry-run"]) == 0
    assert main(["incremental", "--max-length", "100000", "--dry-run"]) == 2
    assert "--max-length: 100000 is outside 8..512" in capsys.readouterr().err


def test_a_dry_run_checks_storage_address_and_gpus(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["incremental", "--dry-run", "--storage", str(blocker / "store")]) == 2
    assert "--storage: " in capsys.readouterr().err
    assert main(["incremental", "--dry-run", "--address", "127.0.0.1:1"]) == 2
    assert "--address: no Ray cluster answers at 127.0.0.1:1" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert main(["incremental", "--dry-run", "--gpus-per-trial", "1"]) == 2
        assert "--gpus-per-trial: 1 asked, but this Ray cluster has no GPU" in capsys.readouterr().err


def test_the_readme_lists_every_experiment_with_an_example_line():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name in EXPERIMENTS:
        assert f"| `python -m sweep {name}` |" in text, name
        assert re.search(rf"^python -m sweep {name} ", text, re.M), name


def test_no_code_outside_the_registries_tests_an_experiments_name():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = subprocess.run(["grep", "-rn", "--include=*.py", "experiment ==", "sweep", "analysis", "trainables"],
                           cwd=root, capture_output=True, text=True).stdout
    assert found == ""


# --- every input checked before Ray starts, in a dry run too (issue 24) --------------------------------------

SQUAD_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2"


def refused(argv: list[str], capsys, storage: Path) -> str:
    """Run `argv` as a dry run and as a real run; both must refuse before any work. The refusal's text."""
    texts = []
    for dry_run in (["--dry-run"], []):
        try:
            code = main([*argv, "--storage", str(storage), *dry_run])
        except SystemExit as exit_:  # argparse's own refusals
            code = exit_.code
        assert code == 2, f"{argv} {dry_run} was not refused"
        texts.append(capsys.readouterr().err)
        assert not storage.exists(), "nothing may be written before the request is valid"
    assert texts[0] == texts[1] or all(texts)
    return texts[0]


def task_folder(root: Path, train: bytes, dev: bytes | None = None, suffix: str = ".csv") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"train{suffix}").write_bytes(train)
    (root / f"dev{suffix}").write_bytes(dev if dev is not None else train)
    return root


def glue_folder(root: Path, train: str, dev: str = "sentence\tlabel\nfine\t1\nbad\t0\n") -> Path:
    (root / "SST-2").mkdir(parents=True)
    (root / "SST-2" / "train.tsv").write_text(train)
    (root / "SST-2" / "dev.tsv").write_text(dev)
    return root


GOOD_CSV = b"text,label\nthe film was fine,good\nthe film was bad,bad\n"


@pytest.mark.parametrize("experiment, option, message", [
    ("incremental", ["--k", "0", "0"], "--k: 0 is given twice"),
    ("incremental", ["--tasks", "synthetic", "synthetic"], "--tasks: synthetic is given twice"),
    ("single-layer", ["--layers", "1", "1"], "--layers: 1 is given twice"),
    ("incremental", ["--trials", "32=2", "32=3"], "--trials: size 32 is given twice"),
    ("incremental", ["--sizes", "16", "16"], "--sizes: 16 is given twice"),
])
def test_a_value_given_twice_is_refused(tiny_bert, tmp_path, capsys, experiment, option, message):
    base = {"--tasks": "synthetic", "--sizes": "16", "--trials": "1"}
    base.pop(option[0], None)  # the option is given once, its value twice (an option given twice is refused too)
    argv = [experiment, "--model", tiny_bert, *[word for pair in base.items() for word in pair], *option]
    assert message in refused(argv, capsys, tmp_path / "store")


def test_no_option_is_read_by_an_abbreviation(tiny_bert, tmp_path, capsys):
    err = refused(["heads", "--model", tiny_bert, "--k", "2"], capsys, tmp_path / "store")  # not --keep-checkpoints
    assert "--k: an option of incremental, reinit-lr, layernorm, lr-multipliers; heads does not take it" in err


def test_an_unknown_option_or_bad_value_is_one_line_that_says_what_is_allowed(tmp_path, capsys):
    # argparse printed the experiment's 35-line usage with the error last, and an unknown option at the top level
    # ("python -m sweep: error: unrecognized arguments"), naming neither the experiment's options nor a near one.
    err = refused(["incremental", "--sizes", "abc"], capsys, tmp_path / "store")
    assert err == ("python -m sweep incremental: error: argument --sizes: invalid int value: 'abc'; its options: "
                   "python -m sweep incremental --help\n")
    err = refused(["incremental", "--lrr", "1e-4", "-x", "sst2"], capsys, tmp_path / "store")
    assert err.splitlines()[1:] == ["  - --lrr: not a setting of incremental; did you mean --lr?",
                                    "  - -x: not an option of incremental; its options: python -m sweep incremental "
                                    "--help"]
    err = refused(["incremental", "sst2"], capsys, tmp_path / "store")
    assert "sst2: not an option of incremental; its options: python -m sweep incremental --help" in err
    # argparse reads everything after a `--` as words, not options: it was "--: not a setting"
    err = refused(["incremental", "--", "--k", "3"], capsys, tmp_path / "store")
    assert err.splitlines()[1].startswith("  - --: options go without it: python -m sweep incremental --k 3 --storage")


def test_an_option_given_before_the_experiments_name_says_to_give_it_after(tmp_path, capsys):
    # The top level takes no option but --config FILE: `--seed=3 incremental` was refused with no reason at all
    # ("cannot start the sweep:" and nothing), and `--preset=paper incremental` as "not a setting; did you mean".
    for word, flag in (("--seed=3", "--seed"), ("--preset=paper", "--preset")):
        err = refused([word, "incremental"], capsys, tmp_path / "store")
        assert f"  - {flag}: an option of incremental, given before its name; give it after: python -m sweep " \
               f"incremental {flag}" in err, err


def test_an_absurd_grid_is_refused_at_once_with_its_size(capsys, tmp_path):
    err = refused(["incremental", "--trials", "10000000"], capsys, tmp_path / "store")
    assert "--trials: 10000000 make a grid of 20,000,000 trials; one sweep plans at most 1,000,000" in err
    # a precision target's grid is --max-trials indices a cell, whatever --trials says: it had named --trials 3
    err = refused(["incremental", "--target-ci", "0.02", "--max-trials", "10000000"], capsys, tmp_path / "store")
    assert "--max-trials: 10000000 makes a grid of 20,000,000 trials; one sweep plans at most 1,000,000" in err


@pytest.mark.parametrize("option, message", [
    (["--name", "x" * 300], "--name: 'xxxxxxxxxxxxxxxxxxxx...' is 300 bytes long"),
    (["--max-length", "1"], "--max-length: 1 is outside 8..160"),
    (["--task-file", "a/b=."], "--task-file: 'a/b' is not a task name"),
])
def test_values_that_used_to_end_in_a_traceback_or_an_empty_trial(tiny_bert, tmp_path, capsys, option, message):
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--trials", "1", *option]
    if option[0] == "--task-file":
        argv += ["--text-columns", "text", "--label-column", "label"]
    assert message in refused(argv, capsys, tmp_path / "store")


@pytest.mark.parametrize("storage, message", [("file://", "names no folder"), ("s3://", "names no bucket")])
def test_a_storage_uri_without_a_place_is_refused(capsys, storage, message):
    for dry_run in (["--dry-run"], []):
        assert main(["incremental", "--storage", storage, *dry_run]) == 2
        assert f"--storage: '{storage}' {message}" in capsys.readouterr().err


def test_task_file_problems_name_the_file_and_line(tiny_bert, tmp_path, capsys):
    base = ["incremental", "--model", tiny_bert, "--sizes", "2", "--trials", "1", "--k", "4"]
    cases = {
        "twice": (b"text,label,label\nfine,good,bad\nbad,bad,good\n", "train.csv, line 1: column 'label' appears 2 times"),
        "latin1": (b"text,label\ncaf\xe9 was fine,good\nbad,bad\n", "train.csv, line 2: not UTF-8 text (byte 0xe9)"),
        "empty": (b"text,label\n,good\n,bad\n", "text column 'text' is empty in all 2 examples of task 'empty'"),
        "quote": (b'text,label\n"fine,good\nbad,bad\n', "train.csv, line"),
    }
    for name, (train, message) in cases.items():
        folder = task_folder(tmp_path / name, train)
        err = refused([*base, "--tasks", name, "--task-file", f"{name}={folder}", "--text-columns", "text",
                       "--label-column", "label"], capsys, tmp_path / "store")
        assert message in err and str(folder) in err, (name, err)


def test_each_task_file_has_its_own_columns_and_must_be_named_in_tasks(tiny_bert, tmp_path, capsys):
    a = task_folder(tmp_path / "a", GOOD_CSV)
    b = task_folder(tmp_path / "b", b"review,stars\nthe film was fine,5\nthe film was bad,1\n")
    def command(tasks: list[str], files: list[str]) -> list[str]:
        return ["incremental", "--model", tiny_bert, "--sizes", "2", "--trials", "1", "--k", "4", "--tasks", *tasks,
                "--task-file", *files, "--text-columns", "text", "--label-column", "label"]

    files = [f"a={a}", f"b={b},text=review,label=stars"]
    assert main([*command(["a", "b"], files), "--storage", str(tmp_path / "store"), "--dry-run"]) == 0
    capsys.readouterr()
    err = refused(command(["a"], files), capsys, tmp_path / "store2")
    assert "--task-file: task 'b' is not named in --tasks (a)" in err
    err = refused(command(["a", "b"], [files[0], f"{files[1]},splits=train+train"]), capsys, tmp_path / "store3")
    assert "--splits: 'train' for both train and dev (task 'b')" in err


def test_local_data_is_read_whole_in_a_dry_run(tiny_bert, tmp_path, capsys):
    base = ["incremental", "--model", tiny_bert, "--tasks", "sst2", "--trials", "1", "--k", "4"]
    bad = glue_folder(tmp_path / "bad", "sentence\tlabel\nfine\t1\nodd\tX\n")
    err = refused([*base, "--sizes", "2", "--data-dir", str(bad)], capsys, tmp_path / "store")
    assert "SST-2/train.tsv, line 3: label 'X' is not one of 0, 1" in err
    small = glue_folder(tmp_path / "small", "sentence\tlabel\nfine\t1\nbad\t0\n")
    err = refused([*base, "--sizes", "3", "--data-dir", str(small)], capsys, tmp_path / "store")
    assert "--sizes: 3 is larger than the sst2 train split (2 examples)" in err


@pytest.mark.skipif(not SQUAD_DIR.is_dir(), reason="the shared SQuAD 2.0 slices are not there")
def test_question_answering_windows_and_answers_are_checked_before_any_work(tiny_bert, tmp_path, capsys):
    import json

    base = ["incremental", "--model", tiny_bert, "--tasks", "squad_v2", "--sizes", "4", "--trials", "1", "--k", "4"]
    err = refused([*base, "--data-dir", str(SQUAD_DIR), "--max-length", "24"], capsys, tmp_path / "store")
    assert "--max-length: 24 leaves no room for context in a squad_v2 window" in err and "give at least" in err
    broken = tmp_path / "squad"
    broken.mkdir()
    for name in ("train-v2.0.json", "dev-v2.0.json"):
        document = json.loads((SQUAD_DIR / name).read_text())
        answer = next(a for art in document["data"] for p in art["paragraphs"] for q in p["qas"] for a in q["answers"])
        answer["answer_start"] += 10 ** 6
        (broken / name).write_text(json.dumps(document))
    err = refused([*base, "--data-dir", str(broken), "--max-length", "128"], capsys, tmp_path / "store")
    assert "does not point at its answer" in err


def test_a_hub_that_does_not_answer_is_named_before_ray_starts(tiny_bert, tmp_path, capsys, monkeypatch):
    import ray

    import sweep.cli

    monkeypatch.setattr(sweep.cli, "hub_answers", lambda timeout=5.0: False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    argv = ["incremental", "--model", tiny_bert, "--tasks", "rte", "--sizes", "10", "--k", "4", "--trials", "1",
            "--storage", str(tmp_path / "store")]
    assert main(argv) == 2 and not ray.is_initialized() and not (tmp_path / "store").exists()
    assert "--tasks: rte come from the Hugging Face hub, which does not answer from this machine; give --data-dir" \
        in capsys.readouterr().err
    assert main([*argv, "--dry-run"]) == 0  # a dry run does not ask the hub
