"""cluster.yaml, checked offline: against Ray's own cluster-config schema, and by doing what `ray up` does on a
node with it (its rsync filter, then its setup commands in a clean virtualenv); no cloud is reached."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
PROJECT_PACKAGES = {"sweep", "trainables", "analysis", "trialrows", "tests"}  # pyproject's [tool.setuptools]


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_cluster_yaml_passes_rays_schema(config):
    from ray.autoscaler._private.util import prepare_config, validate_config

    # What `ray up` does before it contacts the cloud: fill in the provider's defaults, then validate.
    validate_config(prepare_config(config))


def test_image_matches_the_installed_ray_and_is_a_gpu_image(config):
    import ray

    image = config["docker"]["image"]
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3\d+-gpu", image)
    assert match, f"{image} is not a rayproject/ray:<version>-pyXY-gpu image"
    assert match.group(1) == ray.__version__, "the cluster must run the Ray version the project pins"


def test_no_credentials_in_the_file(config):
    text = CLUSTER_YAML.read_text().lower()
    for secret in ("aws_access_key_id", "aws_secret_access_key", "secret_key", "password", "ray_auth_token"):
        assert secret not in text
    # Ray's token travels as the user's own ~/.ray folder, and every node demands it.
    assert config["file_mounts"]["/home/ray/.ray"] == "~/.ray"
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts)


def test_every_node_installs_this_project_and_may_write_the_bucket(config):
    [(target, source)] = [(t, s) for t, s in config["file_mounts"].items() if s == "."]
    assert any(c.split()[:2] == ["pip", "install"] and c.rstrip().endswith(f"-e {target}")
               for c in config["setup_commands"])
    assert (Path(__file__).resolve().parents[1] / "pyproject.toml").is_file(), "run `ray up` from the repository root"
    # Trials on workers write checkpoints and TensorBoard events to the bucket themselves.
    worker = config["available_node_types"]["gpu_worker"]["node_config"]
    assert worker["IamInstanceProfile"] == {"Name": "ray-autoscaler-v1"}


def test_gpu_workers_declare_gpus_and_the_head_runs_no_trials(config):
    types = dict(config["available_node_types"])
    head = types.pop(config["head_node_type"])
    assert head["resources"] == {"CPU": 0} and head["max_workers"] == 0  # no GPU, no trial
    assert types and all(t["resources"].get("GPU", 0) >= 1 and t["max_workers"] > 0 for t in types.values())


def test_torch_is_pinned_as_the_install_script_pins_it(config):
    pins = re.findall(r"torch==[\w.]+", (ROOT / "scripts" / "install.sh").read_text())
    assert pins and set(pins) == set(re.findall(r"torch==[\w.]+", " ".join(config["setup_commands"])))


def test_every_local_folder_the_nodes_get_exists_here(config):
    # `ray up` stops at a file mount whose source is missing; "~" ones are the user's own (the token folder).
    for source in config["file_mounts"].values():
        assert source.startswith("~") or (ROOT / source).is_dir(), source


def rsync_options(config) -> list[str]:
    """The filter options `ray up` gives rsync for every file mount, made by Ray's own code from the config."""
    from ray.autoscaler._private.command_runner import SSHCommandRunner

    return SSHCommandRunner._create_rsync_filter_args(None, options=config)


def sync(config, source: Path, target: Path) -> Path:
    """What `ray up` copies of the folder `source` (it syncs folders with a trailing slash, filtered)."""
    if not shutil.which("rsync"):
        pytest.skip("rsync, with which `ray up` copies file mounts, is not installed (apt-get install rsync)")
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["rsync", "-a", *rsync_options(config), f"{source}/", f"{target}/"], check=True, timeout=120)
    return target


def test_the_rsync_filter_leaves_out_environments_results_caches_and_data(config, tmp_path):
    checkout = tmp_path / "checkout"
    for name in ("sweep/cli.py", ".venv/bin/python", "results/demo/rows/a.parquet", "sweep/__pycache__/cli.pyc",
                 "reinit_sweep.egg-info/PKG-INFO", ".git", "data/README.md", "data/glue/SST-2/train.tsv",
                 ".pytest_cache/v/cache"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("x")
    shutil.copy(ROOT / ".gitignore", checkout / ".gitignore")
    code = sync(config, checkout, tmp_path / "node" / "code")
    assert sorted(str(p.relative_to(code)) for p in code.rglob("*") if p.is_file()) == [".gitignore", "sweep/cli.py"]
    data = sync(config, checkout / "data", tmp_path / "node" / "data")  # data/ has a file mount of its own
    assert sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()) == [
        "README.md", "glue/SST-2/train.tsv"]


def test_the_setup_commands_install_the_project_from_the_synced_checkout(config, tmp_path):
    """The setup commands as written, in a clean virtualenv, on what `ray up` would copy of this checkout.

    The virtualenv stands for the node's image: it sees this environment's packages (Ray, torch and the rest,
    as the image brings Ray) except this project, which the commands must install from the synced files. pip
    runs with no index (PIP_NO_INDEX): the run takes seconds and needs no network, a requirement pinned or named
    otherwise than what scripts/install.sh installed fails to resolve (torch's pin, the MiniLM's package, which
    without --no-deps would need sentence-transformers), and the project installs for real, editable, built
    with the environment's setuptools (no build isolation: it would fetch setuptools from an index)."""
    [(target, _)] = [(t, s) for t, s in config["file_mounts"].items() if s == "."]
    code = sync(config, ROOT, tmp_path / "node" / "code")
    assert (code / "pyproject.toml").is_file() and not (code / ".venv").exists() and not (code / ".git").exists()
    assert not list(code.rglob("__pycache__")) and not list(code.glob("*.egg-info"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    image = tmp_path / "image"
    image.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not ("reinit_sweep" in entry.name or entry.name in PROJECT_PACKAGES):
            (image / entry.name).symlink_to(entry)
    purelib = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "image.pth").write_text(f"{image}\n")
    pip = venv / "bin" / "pip"  # the image's `pip`: this environment's pip, run by the clean venv's python
    pip.write_text(f"#!{venv}/bin/python\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n")
    pip.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv}/bin:{os.environ['PATH']}", PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull,
               PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    for command in config["setup_commands"]:
        done = subprocess.run(["bash", "-c", command.replace(target, str(code))], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}:\n{done.stderr[-3000:]}"

    # The node's python runs the project from the synced files, and --model minilm loads. (A hub task: a dry run
    # reads no data of it. The stand-in image's symlinked packages break `datasets`' fingerprinting (dill cannot
    # place pyarrow's MonthDayNano through them), which a node's own site-packages do not.)
    dry = subprocess.run([venv / "bin" / "python", "-c", "import sys, sweep; print(sweep.__file__); "
                          "from sweep.cli import main; sys.exit(main(sys.argv[1:]))", "incremental", "--model",
                          "minilm", "--tasks", "sst2", "--sizes", "100", "--dry-run"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert dry.stdout.splitlines()[0] == str(code / "sweep" / "__init__.py")
    assert "incremental: minilm (6 layers)" in dry.stdout
