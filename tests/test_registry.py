"""The experiment registry (trialrows.experiments) is the one list: every check here is derived from it, so an
experiment added there is tested here untouched. Each entry's surgery is the one its grid uses, applies to a
real model and round-trips through the Tune config; a reset the rows cannot show is refused; a name or a
column registered twice is refused at import."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sweep.experiments import GridSettings
from trainables.ablations import ablation_from_dict, ablation_to_dict, apply_ablation
from trainables.models import build_classifier
from trialrows import experiments as registry
from trialrows.schema import SCHEMA

GRID = GridSettings.of(model="m", tasks=("sst2",), sizes=(100,), trials=((0, 1),), layers=(1, 4), heads=(0, 3),
                       permutations=2, k=(0, 2, 4))


def grid(name):
    return registry.EXPERIMENTS[name].build(GRID, 4, 4)


def changed(model_state: dict, pretrained) -> bool:
    return any(not torch.equal(v, pretrained.state_dict[k]) for k, v in model_state.items() if k in pretrained.state_dict)


@pytest.mark.parametrize("name", sorted(registry.EXPERIMENTS))
def test_an_experiments_surgery_is_what_its_grid_uses_and_it_applies(name, pretrained):
    entry = registry.EXPERIMENTS[name]
    specs = grid(name)
    assert specs and len({s.trial_id for s in specs}) == len(specs)
    kinds = {ablation_to_dict(s.ablation)["kind"] for s in specs}
    assert kinds == set(entry.surgery), f"{name} declares surgery {entry.surgery}, its grid uses {sorted(kinds)}"
    view = entry.view
    for spec in {ablation_to_dict(s.ablation)["kind"] + repr(s.ablation): s for s in specs}.values():
        assert ablation_from_dict(ablation_to_dict(spec.ablation)) == spec.ablation
        row = spec.row()
        assert set(row) <= set(SCHEMA.names), set(row) - set(SCHEMA.names)
        assert {c for c in view.columns} <= set(SCHEMA.names)
        if not view.finetunes or name == "probing":
            continue
        model = apply_ablation(spec.ablation, build_classifier(pretrained, num_labels=2, seed=0), spec.seed)
        if changed(model.base_model.state_dict(), pretrained) and not row["reinit_layers"]:
            # Something is reset, yet no layer is: only the view's reset column can keep it apart from the full model.
            assert view.reset_column and row.get(view.reset_column) is not None, (
                f"{name}: {spec.ablation} resets part of the model with reinit_layers empty; its view needs a "
                "reset_column that its rows set")


def test_a_name_or_a_column_registered_twice_is_refused():
    entry = registry.EXPERIMENTS["alternate"]
    with pytest.raises(ValueError, match="experiment 'alternate' is registered twice"):
        registry.register(entry)
    with pytest.raises(ValueError, match="row column 'parity' is already declared by 'alternate'"):
        registry.register(dataclasses.replace(entry, name="alternate-2"))
    with pytest.raises(ValueError, match="its view's x 'nope' is not one of its columns"):
        registry.register(dataclasses.replace(entry, name="alternate-3", view=dataclasses.replace(
            entry.view, x="nope", new_columns=())))
    assert "alternate-2" not in registry.EXPERIMENTS and "alternate-3" not in registry.EXPERIMENTS


def test_a_column_declared_twice_in_one_entry_or_in_the_schema_is_refused(monkeypatch):
    # A schema holding a name twice can read no file: every row file of a store would be set aside as damaged.
    entry = registry.EXPERIMENTS["alternate"]
    twice = dataclasses.replace(entry.view, new_columns=(("zz", "string"), ("zz", "int64")))
    with pytest.raises(ValueError, match="row column 'zz' is declared twice in its new_columns"):
        registry.register(dataclasses.replace(entry, name="alternate-4", view=twice))
    assert "alternate-4" not in registry.EXPERIMENTS and "zz" not in registry.COLUMN_OWNERS

    import importlib

    import trialrows.schema as schema

    monkeypatch.setattr(registry, "NEW_COLUMNS", (*registry.NEW_COLUMNS, ("zz", "string"), ("zz", "string")))
    try:
        with pytest.raises(ValueError, match="row column 'zz' is declared twice in trialrows.schema"):
            importlib.reload(schema)
    finally:
        monkeypatch.undo()
        importlib.reload(schema)
    assert schema.SCHEMA == SCHEMA


def test_the_results_schema_document_names_every_column_once_at_its_type():
    import re
    from pathlib import Path

    import pyarrow as pa

    doc = (Path(__file__).resolve().parents[1] / "docs" / "results-schema.md").read_text()
    named = set(re.findall(r"`([a-z_0-9]+)`", doc))
    # `dev_<name>` stands for every float metric column; any other column is named.
    missing = [c for c in SCHEMA.names if c not in named and not (c.startswith("dev_") and
                                                                    SCHEMA.field(c).type == pa.float64())]
    assert not missing, f"docs/results-schema.md does not name {missing}"
    words = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
             "list[int]": pa.list_(pa.int64()), "list[float]": pa.list_(pa.float64()),
             "list[str]": pa.list_(pa.string())}
    rows: dict[str, str] = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        columns = re.findall(r"`([a-z_0-9<>]+)`", cells[0]) if len(cells) == 3 else []
        if not columns or set(columns) & set(registry.EXPERIMENTS):  # the experiments' and recipes' tables
            continue
        unknown = [c for c in columns if c not in SCHEMA.names and c != "dev_<name>"]
        assert not unknown, f"docs/results-schema.md documents {unknown}, which trialrows.schema does not declare"
        for column in columns:
            assert column not in rows, f"{column} has two rows: {rows[column]!r} and {cells[2]!r}"
            rows[column] = cells[2]
        kinds = [w.strip().removesuffix(" or null") for w in cells[1].split(",")] if cells[1] else []
        if len(kinds) in (1, len(columns)) and all(k in words for k in kinds):
            for column, kind in zip(columns, kinds * len(columns) if len(kinds) == 1 else kinds):
                if column in SCHEMA.names:
                    assert SCHEMA.field(column).type == words[kind], (column, kind, SCHEMA.field(column).type)
    assert not [e for e in registry.EXPERIMENTS if f"`{e}`" not in rows["experiment"]], rows["experiment"]
