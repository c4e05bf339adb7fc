"""A sweep's data, read and tokenized once on the driver: every task its trials train or evaluate on, shared
with the trials through Ray's object store (and read by a dry run's cost estimate, sweep.estimate)."""
from __future__ import annotations

from pathlib import Path

from sweep.experiments import GridSettings
from sweep.grid import TrialSpec, data_key


def load_raw_tasks(settings: GridSettings, tasks) -> dict:
    from trainables.tasks import load_task

    return {task: load_task(task, settings.data_dir, sources=settings.sources) for task in tasks}


def prepare_data(settings: GridSettings, specs: list[TrialSpec], raw: dict | None = None) -> dict:
    """Load and tokenize once for the whole sweep every task its trials train or evaluate on (the final and
    any intermediate task); trials share the result via Ray's object store."""
    from trainables.data import tokenize_task
    from trainables.models import load_tokenizer
    from trainables.qa import tokenize_qa_task
    from trainables.tasks import SQUAD_V2

    needed, lengths = {}, {}  # task -> the largest subset any trial draws from it, and its trials' lengths
    for spec in specs:
        for task in spec.tasks:
            needed[task] = max(needed.get(task, 0), spec.train_size)
            lengths.setdefault(task, set()).add(spec.max_length)  # as the trials resolved it
    raw = {**load_raw_tasks(settings, [t for t in needed if t not in (raw or {})]), **(raw or {})}
    for task, size in needed.items():
        if size > len(raw[task].train):
            raise SystemExit(f"--sizes: {size} is larger than the {task} train split ({len(raw[task].train):,} examples)")
    tokenizer = load_tokenizer(settings.model)
    cache = tokenized_cache()

    def tokenize(task, length):  # question answering has its own windows (trainables.qa), not cached
        if task == SQUAD_V2:
            return tokenize_qa_task(raw[task], tokenizer, settings.model, length)
        return tokenize_task(raw[task], tokenizer, settings.model, length, cache)

    return {data_key(task, length): tokenize(task, length) for task in needed for length in sorted(lengths[task])}


def tokenized_cache() -> Path:
    """Where tokenized splits are kept between sweeps: in `datasets`' cache (HF_DATASETS_CACHE moves it)."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "reinit-sweep-tokenized"
