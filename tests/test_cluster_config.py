"""cluster.yaml, checked offline against Ray's own cluster-config schema (no cloud is reached)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


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
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"].get("CPU") == 0
    assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values())
