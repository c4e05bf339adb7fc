"""The results store under concurrent writers and readers: never a half-written or corrupt file."""
from __future__ import annotations

import multiprocessing as mp

import pytest

from analysis.results import read_results
from sweep.store import finished_trial_ids, write_row


def write_many(folder, writer: int, n: int) -> None:
    for i in range(n):
        # Both writers write the same ids: the same trial landing twice must still be one row.
        write_row(folder, {"trial_id": f"t{i}", "status": "ok", "dev_metric": float(writer), "payload": "x" * 5000})


def test_two_writers_and_a_reader_never_meet_a_partial_file(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    ctx = mp.get_context("spawn")
    writers = [ctx.Process(target=write_many, args=(folder, w, 150)) for w in (1, 2)]
    for p in writers:
        p.start()
    reads = 0
    while any(p.is_alive() for p in writers):
        table = read_results(folder)  # raises on a truncated or half-renamed Parquet file
        assert table["trial_id"].is_unique
        reads += 1
    for p in writers:
        p.join()
        assert p.exitcode == 0
    table = read_results(folder)
    assert len(table) == 150 and set(table["dev_metric"]) <= {1.0, 2.0}
    assert reads > 1
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "no temporary file is left behind"
    assert finished_trial_ids(folder) == {f"t{i}" for i in range(150)}


def test_model_folder_without_safetensors_is_refused(tmp_path):
    from trainables.models import resolve_model_path

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickled weights could run code")
    with pytest.raises(ValueError, match="holds no \\*.safetensors weights"):
        resolve_model_path(str(tmp_path))
