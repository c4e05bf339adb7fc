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


def cluster_section() -> str:
    """The README's "Running on a cluster", up to its SLURM part: what a user copies for cluster.yaml."""
    text = (ROOT / "README.md").read_text()
    return text[text.index("## Running on a cluster"):text.index("### On a SLURM cluster")]


def allows(policy: dict, action: str, resource: str) -> bool:
    import fnmatch

    statements = policy["Statement"] if isinstance(policy["Statement"], list) else [policy["Statement"]]
    for s in statements:
        actions = [s["Action"]] if isinstance(s.get("Action"), str) else s.get("Action", [])
        resources = [s["Resource"]] if isinstance(s.get("Resource"), str) else s.get("Resource", [])
        if s["Effect"] == "Allow" and "Condition" not in s and any(fnmatch.fnmatch(action, a) for a in actions) \
                and any(fnmatch.fnmatch(resource, r) for r in resources):
            return True
    return False


def test_the_head_may_launch_workers_with_their_instance_profile(config):
    """A worker type that names an instance profile is launched by the head's autoscaler, whose role must then be
    allowed iam:PassRole on that profile's role (and ssm:GetParameters on an image named by a public parameter), or
    every launch fails with UnauthorizedOperation. Ray's default head role (ray-autoscaler-v1: AmazonEC2FullAccess,
    AmazonS3FullAccess; AWS's documents of them as moto keeps them) has neither right: the README grants them."""
    import json
    import shlex

    from moto.iam.aws_managed_policies import aws_managed_policies_data

    managed = json.loads(aws_managed_policies_data)
    policies = [managed[name]["Document"] for name in ("AmazonEC2FullAccess", "AmazonS3FullAccess")]
    for command in re.finditer(r"aws iam put-role-policy ([^']*)'([^']*)'", cluster_section()):
        words = shlex.split(command.group(1).replace("\\\n", " "))
        assert words[words.index("--role-name") + 1] == "ray-autoscaler-v1", command.group(0)
        policies.append(json.loads(command.group(2)))
    types = dict(config["available_node_types"])
    assert "IamInstanceProfile" not in types.pop(config["head_node_type"])["node_config"]  # Ray's default role
    for name, node_type in types.items():
        profile = node_type["node_config"].get("IamInstanceProfile")
        if profile:
            role = f"arn:aws:iam::123456789012:role/{profile['Name']}"  # Ray names the role as its profile
            assert any(allows(p, "iam:PassRole", role) for p in policies), \
                f"the head's role may not pass {profile['Name']} to the {name} workers it launches"
        image = node_type["node_config"].get("ImageId", "")
        if image.startswith("resolve:ssm:"):  # EC2 reads the parameter as the launching principal
            parameter = f"arn:aws:ssm:{config['provider']['region']}::parameter{image.removeprefix('resolve:ssm:')}"
            assert any(allows(p, "ssm:GetParameters", parameter) for p in policies), \
                f"the head's role may not read {parameter}, the image of the {name} workers it launches"


def test_no_node_falls_back_to_rays_default_image(config):
    """Without an ImageId, `ray up` puts Ray's default AMI in (DLAMI Ubuntu 18.04 V71.0, a CUDA 11 driver): too old
    for the Ray GPU image's CUDA (its container does not start on a GPU) and torch's CUDA build."""
    import copy

    from ray.autoscaler._private.aws.config import DEFAULT_AMI, _check_ami

    prepared = copy.deepcopy(config)
    _check_ami(prepared)  # what bootstrap_aws does last, after IAM, keys, subnets and security groups
    for name, node_type in prepared["available_node_types"].items():
        image = node_type["node_config"]["ImageId"]
        assert image not in DEFAULT_AMI.values(), f"{name} runs Ray's default AMI {image}"
        assert image.startswith("resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu"), image


def test_every_process_in_the_containers_sends_the_token(config):
    """Ray's CLI and a driver given an address send the token only under RAY_AUTH_MODE=token (a driver joining
    with --address auto turns it on by itself, `ray status` does not): the containers' own environment sets it, so
    `ray exec cluster.yaml "ray status"` and a shell from `ray attach` are let in, not only `ray start`."""
    import shlex

    from ray.autoscaler._private.docker import docker_start_cmds

    docker = config["docker"]
    for role in ("head", "worker"):
        options = docker.get("run_options", []) + docker.get(f"{role}_run_options", [])
        command = docker_start_cmds("ubuntu", docker["image"], config["file_mounts"], docker["container_name"],
                                    options, config["cluster_name"], "/home/ray", "docker")
        words = shlex.split(command)
        env = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-e", "--env")]
        env += [w.split("=", 1)[1] for w in words if w.startswith("--env=")]
        assert "RAY_AUTH_MODE=token" in env, command


def test_a_local_storage_folder_is_refused_before_the_autoscaler_adds_the_workers(config, tmp_path, monkeypatch):
    """On a fresh `ray up cluster.yaml` cluster only the head is up (it runs no trial): no node to ask whether it
    sees a local --storage folder, yet every trial runs on a worker the autoscaler adds, which does not. The head's
    bootstrap config (what `ray up` leaves there) says such workers come."""
    import ray

    from sweep import checks

    bootstrap = tmp_path / "ray_bootstrap_config.yaml"
    bootstrap.write_text(yaml.safe_dump(config))
    head = {"NodeID": "head", "Alive": True, "Resources": {"memory": 1e10}, "NodeManagerAddress": "10.0.0.1"}
    monkeypatch.setattr(ray, "nodes", lambda: [head])
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"get_node_id": lambda self: "head"})())
    folder = tmp_path / "results"
    assert sys.platform != "linux" or checks.file_system_type(folder)  # the mount tmp_path lies on
    monkeypatch.setattr(checks, "file_system_type", lambda path: "ext4")  # this machine's disk, whatever tmp_path's
    [problem] = checks.unshared_storage_problems(folder, bootstrap=str(bootstrap))
    assert problem.startswith(f"--storage: {folder} is a folder of this machine's own disk (ext4)"), problem
    assert "s3://" in problem
    assert checks.unshared_storage_problems("s3://bucket/prefix", bootstrap=str(bootstrap)) == []
    assert checks.unshared_storage_problems(folder, bootstrap=str(tmp_path / "none.yaml")) == []  # no autoscaler
    monkeypatch.setattr(checks, "file_system_type", lambda path: "nfs4")  # a folder every node may mount
    assert checks.unshared_storage_problems(folder, bootstrap=str(bootstrap)) == []
