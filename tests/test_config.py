"""A sweep is one value: each setting declared once, and the command line, a config file (YAML or TOML), the
Python API, the trial's Tune config and its row all made from that declaration; every sweep writes its
resolved config, which reruns it exactly; every README example also runs from a config file."""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

import sweep.cli
import sweep.store
from sweep.api import configure
from sweep.cli import build_parser, main, parse_command_line
from sweep.config import CONFIG_FILE, Refused, options_of, read_config, resolve, to_yaml
from sweep.experiments import EXPERIMENTS
from sweep.store import sweep_dir, write_row
from trialrows.recipe import RECIPE, Recipe
from trialrows.schema import ROLES, SCHEMA, SETTING

ROOT = Path(__file__).resolve().parents[1]


def other_value(option):
    """A value of the option other than its default, as a config file writes it."""
    if option.choices:
        return next(c for c in reversed(option.choices) if c != option.default)
    if option.type is int:
        return 2 if option.default != 2 else 3
    if option.type is float:
        return 0.5 if option.default != 0.5 else 0.25
    raise AssertionError(f"no other value for {option.flag}")


def toml_value(value):
    return f'"{value}"' if isinstance(value, str) else repr(value)


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_no_setting_is_declared_twice(experiment):
    options = options_of(experiment)
    names, flags = [o.name for o in options], [o.flag for o in options]
    assert len(set(names)) == len(names) and len(set(flags)) == len(flags)
    assert "preset" not in names and "config" not in names and "experiment" not in names


@pytest.mark.parametrize("option", RECIPE, ids=lambda o: o.flag)
def test_a_training_setting_reads_the_same_from_every_route_and_reaches_the_row(option, tiny_bert, tmp_path):
    """One declaration (trialrows.recipe) gives the flag, the config key, the API keyword, the Tune config's
    field and the row's column, at its declared type."""
    value = other_value(option)
    base = dict(model=tiny_bert, tasks=["synthetic"], sizes=[16], trials=["1"], k=[4])
    yaml_file, toml_file = tmp_path / "s.yaml", tmp_path / "s.toml"
    yaml_file.write_text("".join(f"{k}: {v}\n" for k, v in {**base, option.name: value}.items()))
    toml_file.write_text("".join(f"{k} = {toml_value(v) if not isinstance(v, list) else '[' + ', '.join(map(toml_value, v)) + ']'}\n"
                                 for k, v in {**base, option.name.replace('_', '-'): value}.items()))
    command = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--trials", "1",
               "--k", "4", option.flag, str(value)]
    routes = {
        "command line": parse_command_line(command),
        "yaml": parse_command_line(["incremental", "--config", str(yaml_file)]),
        "toml": parse_command_line(["incremental", "--config", str(toml_file)]),
        "python": configure("incremental", **base, **{option.name: value}),
    }
    grids = {route: s.grid for route, s in routes.items()}
    assert len(set(grids.values())) == 1, grids
    (spec,) = EXPERIMENTS["incremental"].build(routes["python"].grid, 4, 4)
    assert getattr(spec, option.name) == value
    assert spec.to_config()["finetune"][option.name] == value  # what the trainable's FinetuneConfig gets
    assert spec.row()[option.name] == value and option.name in SCHEMA.names
    assert (ROLES[option.name] == SETTING) == option.identity
    assert (option.name in spec.identity()) == option.identity
    assert option.flag in build_parser()._subparsers._group_actions[0].choices["incremental"].format_help()


def test_recipe_fields_are_the_trainables_and_the_trials():
    import dataclasses

    from sweep.grid import TrialSpec
    from trainables.finetune import FinetuneConfig

    recipe = {f.name for f in dataclasses.fields(Recipe)}
    assert recipe <= {f.name for f in dataclasses.fields(FinetuneConfig)}
    assert recipe <= {f.name for f in dataclasses.fields(TrialSpec)}
    assert issubclass(FinetuneConfig, Recipe) and issubclass(TrialSpec, Recipe)


def test_trial_ids_are_the_same_from_a_config_file(tmp_path):
    """Stores written before still skip what they hold: the ids pinned by test_experiments, through a file."""
    path = tmp_path / "paper.yaml"
    path.write_text("experiment: incremental\nmodel: bert-base-uncased\ntasks: [sst2]\nsizes: [500]\ntrials: [2]\n"
                    "k: [0, 12]\nlr: 2e-5\n")  # YAML reads 2e-5 as a string: the declared type makes it 2e-05
    grid = parse_command_line(["--config", str(path)]).grid
    ids = [s.trial_id for s in EXPERIMENTS["incremental"].build(grid, 12, 12)]
    assert ids == ["incremental-sst2-n500-k0-t0-a21dd0bd02", "incremental-sst2-n500-k12-t0-6937124c60",
                   "incremental-sst2-n500-k0-t1-b4fff5147f", "incremental-sst2-n500-k12-t1-6d06f3224a"]


def test_the_command_line_overrides_the_file_and_unknown_keys_are_named(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("experiment: heads\nlayers: [1]\nlr: 1e-4\nbatch_size: 4\n")
    got = parse_command_line(["heads", "--config", str(path), "--lr", "3e-4"])
    assert got.grid.lr == 3e-4 and got.grid.batch_size == 4 and got.grid.layers == (1,)
    path.write_text("experiment: heads\nblock_size: 2\nlearning_rate: 1\n")
    with pytest.raises(Refused) as refused:
        parse_command_line(["--config", str(path)])
    assert "--block-size: an option of localized; heads does not take it" in str(refused.value)
    assert "--learning-rate: not a setting of heads" in str(refused.value)
    with pytest.raises(Refused, match="is a 'heads' sweep; run it as python -m sweep heads"):
        parse_command_line(["incremental", "--config", str(path)])


def test_a_preset_never_overrides_what_was_given_and_the_demo_picks_go_with_own_data():
    demo = resolve("incremental", {})
    assert (demo.grid.k, demo.grid.trials, demo.grid.epochs) == ((0, 6), ((0, 1),), 3)
    own = resolve("incremental", {"sizes": [200]})
    assert (own.grid.k, own.grid.trials, own.grid.epochs, own.grid.sizes) == (None, ((0, 3),), None, (200,))
    assert set(own.dropped) == {"k", "trials", "epochs"} and "sizes" not in own.filled
    paper = resolve("incremental", {"trials": ["2"]}, "paper")
    assert paper.grid.trials == ((0, 2),) and paper.grid.model == "bert-base-uncased"


def test_the_dry_run_shows_the_resolved_grid_and_the_preset(capsys):
    assert main(["incremental", "--sizes", "200", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "preset demo: filled --model minilm, --tasks synthetic; its picks" in out
    assert "--k all · --trials 3 · --epochs 5 (5 up to 500 examples, else 3) · --lr 2e-05" in out
    assert "--precision fp32 · --pack auto" in out and "total: 21 trials" in out


def fake_run(todo, settings, options, folder, pretrained, raw=None, **_):
    for spec in todo:
        write_row(folder, {**spec.row(), "status": "ok", "metric_name": "accuracy", "dev_metric": 0.5})


def test_a_sweep_writes_its_resolved_config_and_that_file_reruns_it_exactly(tiny_bert, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep.cli, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    argv = ["heads", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "16", "--layers", "2", "--heads", "1",
            "--trials", "2", "--lr", "1e-4", "--storage", "store", "--name", "h"]
    assert main(argv) == 0
    assert "0 already done, 4 to run" in capsys.readouterr().out
    written = sweep_dir(str(tmp_path / "store"), "h") / CONFIG_FILE
    experiment, preset, settings = read_config(written)
    assert experiment == "heads" and settings["lr"] == 1e-4 and settings["storage"] == str(tmp_path / "store")
    assert settings["trials"] == ["2"] and settings["max_length"] == 128 and "dry_run" not in settings
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the file names its store absolutely
    assert main(["--config", str(written)]) == 0
    assert "4 already done, 0 to run" in capsys.readouterr().out
    assert main(["--config", str(written), "--trials", "3"]) == 0  # a widened grid runs only its new trials
    assert "4 already done, 2 to run" in capsys.readouterr().out


def readme_commands() -> list[list[str]]:
    """Every `python -m sweep EXPERIMENT ...` line of the README's code blocks (continuations joined)."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    found = []
    for line in (line.strip() for block in blocks for line in block.splitlines()):
        for command in re.findall(r"python -m sweep ((?:[a-z-]+)(?: [^&#|]*)?)", line):
            words = shlex.split(command)
            if words and words[0] in EXPERIMENTS:
                found.append(words)
    return found


def test_every_readme_example_also_runs_from_a_config_file(tmp_path, capsys, monkeypatch):
    import datasets.config  # imported before the variable is set: it copies it once, at import
    import huggingface_hub.constants

    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository
    # This machine has no internet: the hub examples meet offline mode at once instead of 23 s of retries each
    # (their configs still parse, plan and refuse what this machine lacks, as below).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    # Nor can a bucket's region be asked: pyarrow's retries take 6 s an example to raise the OSError this raises
    real_filesystem = sweep.store.filesystem

    def no_network(where):
        if str(where).startswith("s3://") and "endpoint_override" not in str(where):
            raise OSError(f"When resolving region for bucket of '{where}': AWS Error NETWORK_CONNECT (no internet)")
        return real_filesystem(where)

    monkeypatch.setattr(sweep.store, "filesystem", no_network)
    commands = readme_commands()
    assert len(commands) >= 15
    for i, words in enumerate(commands):
        try:
            value = parse_command_line(words)
        except Refused:
            continue  # an example about a file of the user's own (reviews=./reviews)
        path = tmp_path / f"example{i}.yaml"
        path.write_text(to_yaml(value))
        from_file = parse_command_line(["--config", str(path)])
        assert from_file.grid == value.grid and from_file.settings() == value.settings(), words
        # The same value runs the same (execute is made from the value alone): the file's dry run plans its grid,
        # or is refused only for what this machine lacks (a cluster at --address auto, its GPUs, a bucket, the
        # hub's models, the user's own folders).
        code = main(["--config", str(path), "--dry-run"])
        out, err = capsys.readouterr()
        if code == 2:
            assert all(line.startswith(("  - --address", "  - --gpus-per-trial", "  - --storage", "  - --model",
                                        "  - --task-file"))
                       for line in err.splitlines()[1:] if line.startswith("  - ")), (words, err)
        else:
            assert code == 0 and re.search(r"total: [\d,]+ trials", out), words


@pytest.mark.parametrize("experiment,flags", [
    ("heads", ["--reinit-pooler"]), ("sublayer", ["--reinit-pooler"]), ("permutation", ["--reinit-pooler"]),
    ("permutation", ["--reinit-mode", "paper-code"]), ("embeddings", ["--reinit-mode", "paper-code"]),
    ("probing", ["--epochs", "7"]), ("probing", ["--lr", "1e-3"]), ("probing", ["--max-grad-norm", "0.5"]),
    ("probing", ["--lr-schedule", "constant"]), ("probing", ["--max-failures", "4"]),
    ("lr-multipliers", ["--checkpoint-every", "0"]), ("lr-multipliers", ["--keep-checkpoints"])])
def test_a_setting_the_experiments_trials_never_read_is_refused_not_ignored(experiment, flags, capsys, tmp_path):
    """heads' and sublayer's surgeries have no pooler (their baseline's would have been reset alone), a
    permutation resets nothing, probing has its own --max-probe-epochs and --probe-lr, a constant rate and no
    clipping; probing and searches run each unit once, without checkpoints."""
    argv = [experiment, "--model", "minilm", "--tasks", "synthetic", "--storage", str(tmp_path), "--dry-run"]
    assert main([*argv, *flags]) == 2
    assert f"{flags[0]}: {experiment}'s trials do not read it (given: " in capsys.readouterr().err
    if len(flags) > 1:  # the default itself, as a config file shared by several experiments may give it
        default = {"--reinit-mode": "intended", "--epochs": None, "--lr": "2e-5", "--max-grad-norm": "1.0",
                   "--lr-schedule": "linear", "--max-failures": "2", "--checkpoint-every": None}[flags[0]]
        if default is not None:
            assert main([*argv, flags[0], default]) == 0
    if flags[0] in ("--max-failures", "--checkpoint-every"):  # asking for what such units do is no mistake
        assert main([*argv, flags[0], {"--max-failures": "0", "--checkpoint-every": "off"}[flags[0]]]) == 0


@pytest.mark.parametrize("experiment", list(EXPERIMENTS))
def test_every_experiments_resolved_config_reads_back_without_a_setting_it_ignores(experiment, tmp_path):
    """The demo preset sets --epochs for every experiment; probing never reads it, so its resolved config leaves
    it out, or rerunning that file would be refused."""
    from sweep.cli import cell_problems, ignored_problems

    sweep = configure(experiment, storage=str(tmp_path))
    assert not set(sweep.settings()) & set(EXPERIMENTS[experiment].ignores)
    path = tmp_path / "sweep.yaml"
    path.write_text(to_yaml(sweep))
    assert ignored_problems(parse_command_line(["--config", str(path)])) == []
    # nor the paper preset's --trials and --skip words for the sizes and tasks left out (500=50, cola=50000)
    path.write_text(to_yaml(configure(experiment, preset="paper", tasks=["sst2"], sizes=[5000], storage=str(tmp_path))))
    assert cell_problems(parse_command_line(["--config", str(path)])) == []


@pytest.mark.parametrize("flags,said", [
    (["--sizes", "500", "5000", "--trials", "500=3"], "--trials: no count for size 5000 (given: 500=3)"),
    (["--sizes", "500", "--trials", "700=3"], "--trials: 700=3 names a size not in --sizes (500)"),
    (["--sizes", "500", "skip: [synthtic=500]"], "--skip: synthtic=500 is no cell of the grid"),
    (["--sizes", "500", "skip: [synthetic=500]"], "the grid holds no trial (--tasks synthetic; --trials 3; "
                                                  "--skip synthetic=500"),
    (["--seed", str(2**63 - 1)], "--seed: 9223372036854775807 must be at least 0 and below 2**32")])
def test_a_grid_that_would_lose_cells_or_rows_is_refused_before_any_work(flags, said, capsys, tmp_path):
    """Cells a --trials or --skip word leaves out without a word, a grid left empty, a seed whose rows could not
    be stored (permutation_seed = seed + index, a 64-bit column): refused before Ray starts, in a dry run too."""
    argv = ["incremental", "--model", "minilm", "--tasks", "synthetic", "--storage", str(tmp_path)]
    if flags[-1].startswith("skip:"):  # a config file's setting (no flag)
        (tmp_path / "skip.yaml").write_text(flags[-1] + "\n")
        argv, flags = [*argv, "--config", str(tmp_path / "skip.yaml")], flags[:-1]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "starting Ray" not in err
    assert not (tmp_path / "incremental").exists()


def test_an_intermediate_task_larger_than_its_split_is_refused_in_a_dry_run(glue_dir, capsys, tmp_path):
    argv = ["sequential", "--model", "minilm", "--tasks", "sst2", "--intermediate-tasks", "cola", "--sizes", "9000",
            "--data-dir", str(glue_dir), "--storage", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    assert "--sizes: 9000 is larger than the cola train split (8,551 examples), which --intermediate-tasks trains " \
           "on first" in capsys.readouterr().err


def test_probings_dry_run_shows_no_setting_its_trials_never_read(capsys, tmp_path):
    argv = ["probing", "--model", "minilm", "--tasks", "synthetic", "--storage", str(tmp_path), "--dry-run"]
    assert main(argv) == 0
    (line,) = [s for s in capsys.readouterr().out.splitlines() if s.startswith("settings: ")]
    assert "--max-probe-epochs" in line and "--probe-lr" in line and "--batch-size" in line
    assert "--epochs" not in line and "--lr " not in line, line


@pytest.mark.parametrize("experiment", ["probing", "lr-multipliers"])
def test_a_fraction_too_small_to_hold_out_from_is_refused_before_any_trial(experiment, glue_dir, capsys, tmp_path):
    """Sizes from --fractions are known once the splits are read; the held-out part's check runs on them then,
    where a subset of one example had failed inside each trial."""
    argv = [experiment, "--model", "minilm", "--tasks", "sst2", "--data-dir", str(glue_dir), "--trials", "1",
            "--storage", str(tmp_path), "--dry-run"]
    assert main([*argv, "--fractions", "0.00001"]) == 2
    assert "--fractions: 1e-05 (sst2: 1 examples) leaves nothing to train" in capsys.readouterr().err
    assert main([*argv, "--fractions", "0.0001"]) == 0  # 7 examples: enough


def test_a_list_or_mapping_for_one_value_is_refused_not_read_as_its_text(tmp_path):
    """`name: [a]` (a list of one, as `tasks: [sst2]` is written) had become a sweep named "['a']", `storage: [x]`
    a folder "['x']", `lr: [1e-4]` a refusal naming neither the value nor what is allowed."""
    for key, value, allowed in [("name", ["a"], "sweep name"), ("storage", ["./x"], "where rows"),
                                ("model", {"path": "minilm"}, "hub name"), ("lr", [1e-4], "a number"),
                                ("tasks", [["synthetic"]], "GLUE names")]:
        with pytest.raises(Refused) as refused:
            configure("incremental", **{key: value})
        said = str(refused.value)
        assert f"--{key}: {value[0] if key == 'tasks' else value!r}" in said and f"allowed: {allowed}" in said, said
    path = tmp_path / "c.yaml"
    path.write_text("experiment: incremental\nname: [a]\n")
    with pytest.raises(Refused, match=r"--name: \['a'\] is a list"):
        parse_command_line(["--config", str(path)])
    # Python's own sequences are lists: k=range(0, 13, 6) is k 0 6 12
    assert configure("incremental", k=range(0, 13, 6), sizes=(500,)).grid.k == (0, 6, 12)


def test_a_yaml_key_given_twice_is_refused_not_the_last_one_taken(tmp_path):
    """TOML refuses a key given twice; YAML's loader kept the last (an `lr: 1e-4` added at the end of a file that
    already had `lr: 2e-5` above ran whichever came last, without a word)."""
    path = tmp_path / "c.yaml"
    path.write_text("experiment: incremental\nlr: 1e-4\nk: [0, 3]\nlr: 2e-5\n")
    with pytest.raises(Refused, match=r"--config: .*c\.yaml gives lr twice \(lines 2 and 4\); keep one"):
        read_config(path)
    path.write_text("experiment: incremental\nbase: &b {lr: 1e-4}\n")  # anchors and merges still read
    assert read_config(path)[2] == {"base": {"lr": "1e-4"}}


def test_run_applies_the_settings_given_beside_a_resolved_sweep(monkeypatch, tmp_path):
    """run(sweep, trials=5) ran `sweep` as it was, dropping trials=5 without a word; the settings given beside it
    override its own (as `--config <its sweep.yaml> --trials 5` does), and a dry run stays a dry run."""
    import sweep.api

    ran = []
    monkeypatch.setattr(sweep.cli, "execute", lambda value, callbacks=(): ran.append(value) or (None, None, 0))
    monkeypatch.setattr(sweep.cli, "quiet_console", lambda: None)
    first = configure("incremental", sizes=[16], k=[0], storage=str(tmp_path), dry_run=True)
    sweep.api.run(first)
    sweep.api.run(first, trials=5, lr=1e-4)
    assert ran[0] is first
    assert ran[1].grid.trials == ((0, 5),) and ran[1].grid.lr == 1e-4 and ran[1].run.dry_run
    assert ran[1].grid == dataclasses.replace(first.grid, trials=((0, 5),), lr=1e-4)
    with pytest.raises(Refused, match="config: give a config file or a resolved Sweep, not both"):
        sweep.api.run(first, config=str(tmp_path / "x.yaml"))


def test_the_api_takes_the_flags_spelling_of_task_files_as_a_config_file_does(tmp_path):
    """`task_file=[...]` (the flag's and a config file's spelling) was refused as "--task-file: not a setting ...;
    did you mean --task-files?", a flag that does not exist."""
    word = f"own={tmp_path},text=t,label=l"
    given = configure("incremental", tasks=["own"], task_file=[word])
    assert given.grid == configure("incremental", tasks=["own"], task_files=[word]).grid and "task_files" in given.given
    with pytest.raises(Refused) as refused:
        configure("incremental", tasks=["own"], task_filez=[word])
    assert "--task-filez: not a setting of incremental; did you mean --task-file?" in str(refused.value)
    with pytest.raises(Refused, match="task_files: given twice, as task_file and as task_files; keep one"):
        configure("incremental", tasks=["own"], task_file=[word], task_files=[word])


def test_an_option_given_twice_on_the_command_line_is_refused_not_its_last_value_kept(capsys, tmp_path):
    # argparse keeps the last of a repeated option: `--k 0 3 --k 6` ran k = 6 alone, without a word.
    assert main(["incremental", "--k", "0", "3", "--k=6", "--storage", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--k: given 2 times (0 3; 6), and only the last would count; give it once, with all its values " \
           "(--k 0 3 6)" in err
    assert main(["incremental", "--k", "0", "3", "--storage", str(tmp_path), "--dry-run"]) == 0


def test_a_dry_run_reads_the_built_in_task_and_refuses_a_size_beyond_it(capsys, tmp_path):
    # A dry run never read the synthetic task, so it planned and priced sizes its real run refused.
    argv = ["incremental", "--tasks", "synthetic", "--sizes", "6000", "--storage", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    assert "--sizes: 6000 is larger than the synthetic train split (5,000 examples)" in capsys.readouterr().err


def test_a_config_files_task_file_takes_the_command_lines_short_keys_and_names_what_is_allowed(tmp_path):
    # `text: review` in a task file's mapping was refused with Python's "unexpected keyword argument 'text'".
    folder = str(tmp_path)
    short = configure("incremental", tasks=["own"], task_files=[{"name": "own", "location": folder,
                                                                 "text": "a+b", "label": "stars"}])
    full = configure("incremental", tasks=["own"], task_files=[{"name": "own", "location": folder,
                                                                "text_columns": ["a", "b"], "label_column": "stars"}])
    assert short.grid.task_files == full.grid.task_files
    assert full.grid.task_files[0].text_columns == ("a", "b") and full.grid.task_files[0].label_column == "stars"
    with pytest.raises(Refused, match=r"'columns' is not a key of a task file; allowed: name, location, text_columns"):
        configure("incremental", tasks=["own"], task_files=[{"name": "own", "location": folder, "columns": "a"}])


def test_a_file_key_like_no_setting_says_where_the_settings_are_listed(tmp_path):
    # `learning_rate` resembles no setting closely enough for a "did you mean": the refusal named the key and
    # nothing about what is allowed.
    path = tmp_path / "s.yaml"
    path.write_text("experiment: incremental\nlearning_rate: 1e-4\n")
    with pytest.raises(Refused, match=r"--learning-rate: not a setting of incremental; its settings: "
                                      r"python -m sweep incremental --help"):
        parse_command_line(["--config", str(path)])
