"""Every option of every experiment is declared once (sweep.options.Option) and refused, out of range, before
any work: in a dry run too, each with a message naming the option and the value."""
from __future__ import annotations

import pytest

from sweep.cli import build_parser, main, options_of
from sweep.experiments import EXPERIMENTS


def cases():
    for experiment in EXPERIMENTS:
        for option in options_of(experiment):
            if option.action != "store_true":  # a switch has no value to be out of range
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
    assert "--max-length: 161 is outside 1..160" in capsys.readouterr().err
    assert main(["incremental", "--model", tiny_bert, "--max-length", "160", "--dry-run"]) == 0
    assert main(["incremental", "--max-length", "100000", "--dry-run"]) == 2
    assert "--max-length: 100000 is outside 1..512" in capsys.readouterr().err


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
