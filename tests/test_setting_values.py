"""Values a config file or the Python API can give that the command line cannot: null, YAML's booleans, an
empty list and a key spelled two ways. Each is refused naming the setting (or read as the command line
reads its word), before any work starts."""
import contextlib
import io

import pytest

from sweep.api import configure
from sweep.cli import execute, parse_command_line
from sweep.config import Refused, read_config


def dry(store, experiment="incremental", **settings):
    sweep = configure(experiment, storage=str(store), dry_run=True, **settings)
    with contextlib.redirect_stdout(io.StringIO()):
        rows, _, code = execute(sweep)
    return rows, code


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("key,flag", [
    ("tasks", "--tasks"), ("trials", "--trials"), ("lr", "--lr"), ("seed", "--seed"), ("storage", "--storage"),
    ("model", "--model"), ("gpus_per_trial", "--gpus-per-trial"), ("eval_every", "--eval-every"),
    ("batch_size", "--batch-size"), ("max_grad_norm", "--max-grad-norm"), ("weight_decay", "--weight-decay"),
    ("precision", "--precision"), ("lr_schedule", "--lr-schedule"), ("reinit_pooler", "--reinit-pooler"),
    ("max_failures", "--max-failures"), ("cpus_per_trial", "--cpus-per-trial"), ("pack", "--pack"),
    ("reinit_mode", "--reinit-mode"), ("sizes", "--sizes")])
def test_null_for_a_setting_without_a_null_meaning_is_refused(key, flag, tmp_path):
    settings = {key: None} if key == "storage" else {key: None, "storage": str(tmp_path)}
    with pytest.raises(Refused) as err:
        configure("incremental", dry_run=True, **settings)
    assert f"{flag}: null has no meaning here; allowed: " in str(err.value), str(err.value)


def test_null_for_an_own_option_with_a_default_is_refused():
    with pytest.raises(Refused, match="--block-size: null has no meaning here; allowed: a whole number"):
        configure("localized", block_size=None)


@pytest.mark.parametrize("key", ["epochs", "k", "max_length", "name", "data_dir"])
def test_null_where_none_is_the_declared_default_means_the_default(key, tmp_path):
    sweep = configure("incremental", storage=str(tmp_path), **{key: None})
    assert getattr(sweep, key) is None or key in ("max_length", "name")  # max_length, name: derived defaults


def test_null_in_a_config_file_names_the_key(tmp_path):
    path = write(tmp_path, "experiment: incremental\nbatch_size: null\n")
    with pytest.raises(Refused, match=r"--batch-size: null .*default 8"):
        parse_command_line(["--config", path])


def test_yaml_checkpoint_every_off_means_off(tmp_path):
    cli = parse_command_line(["incremental", "--checkpoint-every", "off"]).run.checkpoint_every
    assert cli is None
    path = write(tmp_path, "experiment: incremental\ncheckpoint_every: off\n")
    assert parse_command_line(["--config", path]).run.checkpoint_every is None
    assert configure("incremental", checkpoint_every=False).run.checkpoint_every is None
    assert configure("incremental", checkpoint_every=None).run.checkpoint_every is None


@pytest.mark.parametrize("text,flag", [("pack: off", "--pack"), ("pack: yes", "--pack"),
                                       ("max_failures: no", "--max-failures"), ("model: off", "--model"),
                                       ("lr_schedule: off", "--lr-schedule"), ("trials: [off]", "--trials")])
def test_yaml_boolean_for_an_option_that_is_not_a_switch_is_refused(text, flag, tmp_path):
    path = write(tmp_path, f"experiment: incremental\n{text}\n")
    with pytest.raises(Refused) as err:
        parse_command_line(["--config", path])
    message = str(err.value)
    assert f"{flag}: " in message and "is not a value here; allowed: " in message, message
    assert "object has no attribute" not in message


def test_pack_off_in_yaml_says_what_is_allowed(tmp_path):
    path = write(tmp_path, "experiment: incremental\npack: off\n")
    with pytest.raises(Refused) as err:
        parse_command_line(["--config", path])
    assert "--pack: false" in str(err.value) and "auto" in str(err.value), str(err.value)


@pytest.mark.parametrize("experiment,settings,flag", [
    ("incremental", {"k": []}, "--k"), ("incremental", {"tasks": []}, "--tasks"),
    ("incremental", {"trials": []}, "--trials"), ("incremental", {"sizes": []}, "--sizes"),
    ("single-layer", {"layers": []}, "--layers"), ("heads", {"heads": []}, "--heads")])
def test_empty_list_is_refused_as_on_the_command_line(experiment, settings, flag, tmp_path):
    with pytest.raises(Refused, match=f"{flag}: \\[\\] names nothing; give at least one value"):
        dry(tmp_path, experiment, **settings)


def test_empty_layers_in_config_is_refused_not_every_layer(tmp_path):
    path = write(tmp_path, f"experiment: single-layer\nlayers: []\nstorage: {tmp_path}\ndry_run: true\n")
    with pytest.raises(Refused, match="--layers: \\[\\] names nothing"):
        parse_command_line(["--config", path])


def test_empty_list_where_none_is_meant_is_taken(tmp_path):
    sweep = configure("incremental", storage=str(tmp_path), task_files=[], fractions=[], logger=[], skip=[])
    assert (sweep.task_files, sweep.fractions, sweep.run.logger, sweep.skip) == ((), (), (), ())
    # fractions replace the sizes: the resolved config writes `sizes: []`, and reads it back
    sweep = configure("incremental", storage=str(tmp_path), fractions=[0.1])
    written = {k: v for k, v in sweep.settings().items() if k not in ("experiment", "preset")}
    assert written["sizes"] == []
    assert configure("incremental", **written).grid == sweep.grid


@pytest.mark.parametrize("text,keys", [("max_grad_norm: 0.5\nmax-grad-norm: 2\n", ("max_grad_norm", "max-grad-norm")),
                                       ("task_file: [a=/x]\ntask_files: [b=/y]\n", ("task_file", "task_files"))])
def test_config_key_given_twice_in_two_spellings_is_refused(text, keys, tmp_path):
    path = write(tmp_path, text)
    with pytest.raises(Refused) as err:
        read_config(path)
    assert all(f"'{key}'" in str(err.value) for key in keys), str(err.value)


def test_trials_given_twice_names_the_word_as_written(tmp_path):
    with pytest.raises(Refused) as err:
        dry(tmp_path, trials=["3", "3"])
    assert "--trials: 3 is given twice" in str(err.value) and "[0, 3]" not in str(err.value), str(err.value)
    with pytest.raises(Refused, match="--trials: 500=2 is given twice"):
        dry(tmp_path, trials=["500=2", "500=2"])


@pytest.mark.parametrize("key,value", [("name", "a\\0b"), ("storage", "/tmp/s\\0t"), ("name", "a\\nb")])
def test_a_folder_name_with_a_control_character_is_refused_not_a_traceback(key, value, tmp_path, capsys):
    from sweep.cli import main

    path = tmp_path / "c.yaml"
    store = "" if key == "storage" else f"storage: {tmp_path / 'store'}\n"
    path.write_text(f'experiment: incremental\n{store}{key}: "{value}"\n')
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--{key}: " in err and "control character" in err, err
    assert not (tmp_path / "store").exists()
