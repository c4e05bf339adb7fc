"""The numbers the tables and figures draw, checked by hand on small frames: one line is one condition, a
reference line is the reference at the same settings, and a precision-targeted condition keeps the value it has."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import figures as F
from analysis.results import prepare
from analysis.stats import condition_table
from tests.test_analysis_trust import row
from tests.test_precision import grid, stored
from trialrows.precision import NO_SPREAD, Target, precision_table


def lines(plot, panel=0) -> dict:
    """{label: (x, y)} of a figure panel's labelled lines."""
    ax = plot.figure.axes[panel]
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_weight_distance_pools_the_full_model_whichever_experiment_ran_it():
    # The heads baseline and the sublayer grid's full model are the same computation (nothing reset): one line,
    # one point per layer, over all six trials.
    rows = [row(f"h{t}", experiment="heads", k=None, t=t, weight_distance=[1.0 + t, 2.0, 3.0, 4.0]) for t in range(3)]
    rows += [row(f"s{t}", experiment="sublayer", k=None, t=t + 3, weight_distance=[4.0 + t, 2.0, 3.0, 4.0])
             for t in range(3)]
    plots = F.weight_distance_figure(prepare(pd.DataFrame(rows)))
    assert len(plots) == 1
    x, y = lines(plots[0])["100 examples"]
    assert x == [1, 2, 3, 4]
    assert y[0] == pytest.approx(np.mean([1, 2, 3, 4, 5, 6]))


def probing_rows():
    rows = []
    for patience, base in ((5, 0.6), (10, 0.9)):
        for layer in range(3):
            rows += [row(f"p{patience}-{layer}-{t}", experiment="probing", k=None, t=t, probe="mean-pool", layer=layer,
                         patience=patience, reinit_layers=[], value=base + 0.01 * t) for t in range(2)]
    return prepare(pd.DataFrame(rows))


@pytest.mark.parametrize("figure", [F.probing_figure, F.incremental_figure])
def test_a_probing_line_is_one_setting(figure):
    drawn = lines(figure(probing_rows())[0])
    probes = {label: xy for label, xy in drawn.items() if label.startswith("probe")}
    assert len(probes) == 2, list(drawn)  # patience 5 and patience 10: two lines, never one zigzag
    for x, y in probes.values():
        assert x == [0, 1, 2] and len(set(np.round(y, 6))) == 1
    assert any("patience=10" in label for label in probes)


def test_a_finetuned_line_beside_the_probes_is_one_setting():
    rows = [row(f"i{e}-{k}-{t}", k=k, t=t, epochs=e, value=0.5 + 0.1 * k + (0.2 if e == 10 else 0))
            for e in (3, 10) for k in (0, 4) for t in range(2)]
    rows += [row(f"p{layer}-{t}", experiment="probing", k=None, t=t, probe="mean-pool", layer=layer, reinit_layers=[],
                 value=0.6) for layer in range(2) for t in range(2)]
    drawn = lines(F.probing_figure(prepare(pd.DataFrame(rows)))[0])
    tuned = {label: xy for label, xy in drawn.items() if label.startswith("finetuned")}
    assert len(tuned) == 2, list(drawn)
    assert sorted(y for _, y in tuned.values()) == [pytest.approx([0.5, 0.9]), pytest.approx([0.7, 1.1])]


def references_at_two_settings():
    rows = [row(f"f3-{t}", t=t, value=0.80, epochs=3) for t in range(2)]
    rows += [row(f"f10-{t}", t=t, value=0.90, epochs=10) for t in range(2)]
    rows += [row(f"z3-{t}", k=0, t=t, value=0.50, epochs=3) for t in range(2)]
    rows += [row(f"z10-{t}", k=0, t=t, value=0.60, epochs=10) for t in range(2)]
    return rows


@pytest.mark.parametrize("figure", [F.localized_figure, F.single_layer_figure])
def test_reference_lines_are_at_the_settings_of_the_trials_they_stand_beside(figure):
    # The localized and single-layer trials trained 10 epochs; the full model ran at 3 and at 10 epochs.
    rows = references_at_two_settings()
    for t in range(2):
        rows.append(row(f"l{t}", experiment="localized", k=None, t=t, value=0.7, epochs=10, block_mode="block-reinit",
                        block_start=1, block_size=2, reinit_layers=[1, 2]))
        rows.append(row(f"s{t}", experiment="single-layer", k=None, t=t, value=0.7, epochs=10, layer=1,
                        reinit_layers=[1]))
    drawn = lines(figure(prepare(pd.DataFrame(rows)))[0])
    assert drawn["full model (all layers pretrained)"][1][0] == pytest.approx(0.90)
    if figure is F.localized_figure:
        assert drawn["embeddings only (all layers reinitialized)"][1][0] == pytest.approx(0.60)


def test_a_reference_missing_at_the_trials_settings_is_not_drawn_from_another():
    rows = [row(f"f3-{t}", t=t, value=0.80, epochs=3) for t in range(2)]
    rows += [row(f"s{t}", experiment="single-layer", k=None, t=t, value=0.7, epochs=10, layer=1, reinit_layers=[1])
             for t in range(2)]
    (plot,) = F.single_layer_figure(prepare(pd.DataFrame(rows)))
    assert "full model (all layers pretrained)" not in lines(plot)
    assert "No reference runs at these settings for sst2." in plot.caption


def test_a_layer_axis_is_in_numeric_order():
    rows = [row(f"s{layer}-{t}", experiment="sublayer", k=None, t=t, layer=layer, sublayer="attention",
                reinit_layers=[], value=0.5 + 0.01 * layer) for layer in (1, 2, 10) for t in range(2)]
    plot = F.experiment_figure(prepare(pd.DataFrame(rows)), "sublayer")[0]
    ax = plot.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "10"]
    x, y = lines(plot)["attention"]
    assert y == pytest.approx([0.51, 0.52, 0.60])


def test_a_precision_target_without_spread_keeps_the_one_value_it_has():
    # Two of three pilot trials diverged: no interval can be planned, but the one finished value is the mean.
    target = Target(0.02, pilot=3, max_trials=8)
    values = {(2, 0): 0.7, (2, 1): np.nan, (2, 2): np.nan, **{(0, i): v for i, v in enumerate([0.5, 0.52, 0.51])}}
    rows = prepare(stored(grid(target=target), values))
    outcome = precision_table(rows).set_index("k").loc[2]
    assert outcome["state"] == NO_SPREAD and outcome["mean"] == pytest.approx(0.7)
    assert np.isnan(outcome["ci95_low"])
    summary = condition_table(rows).set_index("k").loc[2]
    assert (summary["n"], summary["excluded"]) == (1, 2)
    assert summary["mean"] == pytest.approx(0.7) and np.isnan(summary["ci95_low"])


def test_a_figure_says_where_its_bars_are_steins_interval_not_the_t_interval_on_n_minus_1_df():
    target = Target(0.02, pilot=3, max_trials=8)
    values = {(2, i): v for i, v in enumerate([0.70, 0.71, 0.72, 0.70, 0.715])}  # reached at N = 5
    values |= {(0, i): v for i, v in enumerate([0.5, 0.52, 0.51])}
    plot = F.incremental_figure(prepare(stored(grid(target=target), values)))[0]
    assert "95% t-intervals (n-1 df)" in plot.caption and "Stein's two-stage interval" in plot.caption


def test_the_sweeps_summary_counts_a_trial_that_failed_before_reporting_in_its_own_condition(tmp_path):
    from sweep.store import write_row
    from trialrows.read import read_results
    from trialrows.summaries import condition_table as sweep_summary

    for r in [row(f"a{t}", t=t, value=0.8 + 0.01 * t) for t in range(3)] + [row("e", t=3, status="error")]:
        write_row(tmp_path, r)
    table = sweep_summary(read_results(tmp_path))  # the rows as the sweep reads them: no analysis.prepare
    assert len(table) == 1
    assert (table.loc[0, "n"], table.loc[0, "excluded"], table.loc[0, "failed"]) == (3, 1, 1)
    assert table.loc[0, "mean"] == pytest.approx(0.81)


def test_a_heads_grid_without_its_own_baseline_is_compared_with_the_full_model_of_its_settings():
    # Heads trials at 10 epochs, no unablated baseline of their own: the full model at 10 epochs is the baseline,
    # never the one at 3 epochs that happens to come first.
    from analysis.tables import heads_table

    rows = references_at_two_settings()
    rows += [row(f"h{t}", experiment="heads", k=None, t=t, value=0.7, epochs=10, layer=1, head=0, reinit_layers=[])
             for t in range(2)]
    table = heads_table(prepare(pd.DataFrame(rows)))
    assert len(table) == 1
    assert table.loc[0, "baseline"] == pytest.approx(0.90) and table.loc[0, "delta"] == pytest.approx(-0.20)


def test_each_probing_setting_keeps_its_own_mean_stopping_epoch():
    from analysis.tables import probing_table

    rows = [row(f"p{patience}-{t}", experiment="probing", k=None, t=t, probe="mean-pool", layer=1, patience=patience,
                reinit_layers=[], stop_epoch=patience + 1) for patience in (5, 10) for t in range(2)]
    table = probing_table(prepare(pd.DataFrame(rows))).set_index("patience")
    assert table["mean_stop_epoch"].to_dict() == {5: 6.0, 10: 11.0}


def test_probing_beside_finetuning_draws_every_model_of_the_store():
    # The second model's finetuned lines were picked from the first model's exhausted line generator: a crash
    # of the figure, and so of `python -m analysis report`, on any store that probed and finetuned two models.
    rows = []
    for m, shift in (("a", 0.0), ("b", 0.05)):
        rows += [row(f"{m}i{k}-{t}", k=k, t=t, model=m, value=0.5 + 0.1 * k + shift + 0.01 * t)
                 for k in (0, 4) for t in range(2)]
        rows += [row(f"{m}p{layer}-{t}", experiment="probing", k=None, t=t, model=m, probe="mean-pool", layer=layer,
                     reinit_layers=[], value=0.6 + shift) for layer in range(2) for t in range(2)]
    plots = F.probing_figure(prepare(pd.DataFrame(rows)))
    assert [p.name for p in plots] == ["probing-vs-incremental-a", "probing-vs-incremental-b"]
    x, y = lines(plots[1])["finetuned, layers 1..k pretrained"]
    assert x == [0, 4] and y == pytest.approx([0.555, 0.955])


def test_figure_5_of_a_fractions_store_draws_every_task_at_its_smallest_share():
    # At --fractions 0.01 0.1 SST-2 trains on 673 and 6,735 examples, CoLA on 86 and 855: the smallest size
    # (86) kept CoLA alone, and SST-2 was silently missing from Figure 5.
    rows = [row(f"{task}{share}-{k}-{t}", task=task, k=k, t=t, train_size=n, train_fraction=share,
                value=0.5 + 0.1 * k + share + 0.01 * t)
            for task, sizes in (("sst2", (673, 6735)), ("cola", (86, 855))) for share, n in zip((0.01, 0.1), sizes)
            for k in (0, 4) for t in range(2)]
    (plot,) = F.scatter_figure(prepare(pd.DataFrame(rows)))
    assert [ax.get_title() for ax in plot.figure.axes] == ["SST-2", "CoLA"]
    for panel in (0, 1):
        assert lines(plot, panel)["mean"] == ([0, 4], pytest.approx([0.515, 0.915]))
    assert plot.name == "fig5-scatter-f0.01" and "0.01 of each train split" in plot.caption


def test_a_series_keeps_its_colour_in_a_panel_that_lacks_another():
    # CoLA ran the feed-forward block only: drawn in the first colour, it read as "attention" by the legend.
    rows = [row(f"{task}{part}{layer}-{t}", task=task, experiment="sublayer", k=None, layer=layer, sublayer=part,
                reinit_layers=[], t=t, value=(0.6 if part == "attention" else 0.8) + 0.01 * t)
            for task, parts in (("sst2", ("attention", "feed-forward")), ("cola", ("feed-forward",)))
            for part in parts for layer in (1, 2) for t in range(2)]
    (plot,) = F.experiment_figure(prepare(pd.DataFrame(rows)), "sublayer")
    legend = {text.get_text(): handle.get_color()
              for text, handle in zip(plot.figure.legends[0].texts, plot.figure.legends[0].legend_handles)}
    for ax in plot.figure.axes:
        for line in ax.get_lines():
            if line.get_label() in ("attention", "feed-forward"):
                assert line.get_color() == legend[line.get_label()], (ax.get_title(), line.get_label())


def test_the_chance_line_names_the_constant_it_is():
    # STS-B is a regression (no class at all) and SQuAD's constant is answering nothing: neither a majority class.
    rows = [row(f"{task}{k}-{t}", task=task, k=k, t=t, metric_name=metric, dev_chance_metric=chance, value=0.3 + k / 20)
            for task, metric, chance in (("sst2", "accuracy", 0.51), ("stsb", "pearson", 0.0), ("squad_v2", "f1", 0.5))
            for k in (0, 4) for t in range(2)]
    (plot,) = F.incremental_figure(prepare(pd.DataFrame(rows)))
    chance = [{line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if "constant" in line.get_label()}
              for ax in plot.figure.axes]
    assert chance == [{"majority class (a constant prediction)": 0.51},
                      {"a constant prediction (0 by convention)": 0.0},
                      {"no answer to any question (a constant prediction)": 0.5}]
    assert [ax.get_ylabel() for ax in plot.figure.axes] == ["dev accuracy", "dev Pearson r", "dev F1"]


def test_summary_and_report_count_a_searchs_pruned_trials_alike(tmp_path, capsys):
    # ASHA's pruned trials are not failures: the report said "2 pruned", the summary "2 failed".
    from analysis.__main__ import main
    from analysis.report import build_report
    from sweep.store import write_row

    for r in [row(f"a{t}", experiment="lr-multipliers", k=2, t=t, value=0.8) for t in range(3)] + \
             [row(f"p{t}", experiment="lr-multipliers", k=2, t=t + 3, value=0.7, status="pruned") for t in range(2)]:
        write_row(tmp_path / "rows", r)
    assert main(["summary", str(tmp_path / "rows")]) == 0
    printed = capsys.readouterr().out
    assert "0 diverged, 0 failed, 2 pruned" in printed
    header = build_report(tmp_path / "rows", tmp_path / "report", formats=["png"]).header
    assert "Trials: 3 ok, 0 diverged, 2 pruned, 0 error." in header


def test_figures_split_by_a_setting_say_it_in_their_own_titles():
    # Two sweeps at 3 and 10 epochs: two Figure 4s and two matrices whose images carried the same title.
    orders = {3: [[1, 2, 3, 4], [4, 3, 2, 1], [2, 1, 4, 3]], 10: [[1, 3, 2, 4], [3, 1, 4, 2], [2, 4, 1, 3]]}
    rows = [row(f"{e}-{p}", experiment="permutation", k=None, reinit_layers=[], epochs=e, permutation=order,
                permutation_index=p, t=p, value=0.5 + 0.01 * p)
            for e, drawn in orders.items() for p, order in enumerate(drawn)]
    rows += [row(f"s{e}-{i}-{t}", experiment="sequential", k=None, reinit_layers=[], epochs=e, t=t, intermediate_task=i)
             for e in (3, 10) for i in (None, "cola") for t in range(2)]
    rows = prepare(pd.DataFrame(rows))
    for plots in (F.permutation_figure(rows), F.sequential_figure(rows)):
        assert [p.figure._suptitle.get_text().endswith(f"(epochs={e})") for p, e in zip(plots, (3, 10))] == [True] * 2


def test_a_fingerprint_each_task_implies_is_no_column_of_its_own():
    """Two tasks read two data sets: every table of a two-task sweep showed data_fingerprint beside task, a hash
    that split nothing. Data that changed within a task still splits its condition, and says so."""
    rows = [row(f"{task}{t}", task=task, t=t, data_fingerprint=f"d-{task}", model_fingerprint="m")
            for task in ("sst2", "cola") for t in range(2)]
    assert "data_fingerprint" not in condition_table(prepare(pd.DataFrame(rows))).columns
    rows.append(row("sst2-new", task="sst2", t=2, data_fingerprint="d-sst2-edited", model_fingerprint="m"))
    table = condition_table(prepare(pd.DataFrame(rows)))
    assert "data_fingerprint" in table.columns and len(table) == 3


def test_a_point_stands_at_its_tick_when_the_axis_has_one():
    # `sublayer --layers 3`: the axis spanned the series' 0.1 offset alone, so feed-forward's point stood at the
    # right edge of the panel, a whole panel away from the tick "3" that attention's point stood on.
    rows = [row(f"{part}-{t}", experiment="sublayer", k=None, t=t, layer=3, sublayer=part, reinit_layers=[],
                value=0.5 + 0.01 * t) for part in ("attention", "feed-forward") for t in range(2)]
    (plot,) = F.experiment_figure(prepare(pd.DataFrame(rows)), "sublayer")
    ax = plot.figure.axes[0]
    low, high = ax.get_xlim()
    (tick,) = ax.get_xticks()
    for label in ("attention", "feed-forward"):
        (x,), _ = lines(plot)[label]
        assert abs(x - tick) / (high - low) < 0.15, (label, x, tick, (low, high))


def test_a_caption_names_no_curve_the_store_has_no_rows_for():
    # A probing-only store's Figure 2 was captioned "Finetuning after keeping layers 1..k pretrained ..." and its
    # probing-vs-incremental figure "beside finetuning (blue)"; a reinit-lr-only store's Figure 7 "beside the same
    # cells at one rate": curves that were not drawn.
    probes = probing_rows()
    for plot in [*F.incremental_figure(probes), *F.probing_figure(probes)]:
        assert "No incremental rows yet" in plot.caption and "Finetuning after" not in plot.caption, plot.caption
        assert "(blue)" not in plot.caption, plot.caption
    faster = [row(f"r{k}-{t}", experiment="reinit-lr", k=k, t=t, lr_multiplier=5.0, value=0.6) for k in (0, 4)
              for t in range(2)]
    (plot,) = F.lr_multiplier_figure(prepare(pd.DataFrame(faster)))
    assert "Not drawn: same learning rate (the store has no such rows" in plot.caption
    two = faster + [{**r, "trial_id": r["trial_id"] + "x10", "lr_multiplier": 10.0} for r in faster]
    (plot,) = F.lr_multiplier_figure(prepare(pd.DataFrame(two)))  # two rates, still none at the base one
    assert "Not drawn: same learning rate (the store has no such rows" in plot.caption
    both = faster + [row(f"i{k}-{t}", k=k, t=t, value=0.6) for k in (0, 4) for t in range(2)]
    assert "Not drawn" not in F.lr_multiplier_figure(prepare(pd.DataFrame(both)))[0].caption


def test_categories_on_the_x_axis_are_points_not_a_line():
    # The alternate figure joined "even" and "odd" with a line, as if one led to the other; layers keep theirs.
    alternate = [row(f"{p}-{t}", experiment="alternate", k=None, t=t, parity=p, reinit_layers=[],
                     value=0.5 + 0.01 * t) for p in ("odd", "even") for t in range(2)]
    sublayer = [row(f"{layer}-{t}", experiment="sublayer", k=None, t=t, layer=layer, sublayer="attention",
                    reinit_layers=[], value=0.5 + 0.01 * t) for layer in (1, 3) for t in range(2)]
    for rows, experiment, series, style in ((alternate, "alternate", "alternate", "None"),
                                            (sublayer, "sublayer", "attention", "-")):
        (plot,) = F.experiment_figure(prepare(pd.DataFrame(rows)), experiment)
        (means,) = [line for line in plot.figure.axes[0].get_lines() if line.get_label() == series]
        assert len(means.get_xdata()) == 2 and means.get_linestyle() == style, experiment


def test_the_heads_colour_bar_reads_in_the_cells_unit():
    # The cells read "-10.0" (hundredths) beside a colour bar of "-0.10": two units for one quantity.
    rows = [row(f"b{t}", experiment="heads", k=None, t=t, value=0.8, layer=None, head=None, reinit_layers=[])
            for t in range(2)]
    rows += [row(f"h{h}-{t}", experiment="heads", k=None, t=t, value=0.8 - 0.1 * h, layer=1, head=h,
                 reinit_layers=[]) for h in range(2) for t in range(2)]
    (plot,) = F.heads_figure(prepare(pd.DataFrame(rows)))
    plot.figure.canvas.draw()
    panel, bar = plot.figure.axes
    assert {t.get_text() for t in panel.texts} == {"+0.0", "-10.0"}
    ticks = [t.get_text() for t in bar.get_yticklabels() if t.get_text()]
    assert "-10.0" in ticks and "+10.0" in ticks, ticks
    assert bar.get_ylabel() == "difference from baseline (hundredths)"


def test_a_searchs_multipliers_read_in_three_digits_in_its_tables():
    # The weight-distance table of an lr-multipliers sweep keyed each row by tuples of 17-digit floats.
    from analysis.format import readable
    from analysis.tables import weight_distance_table

    rows = [row(f"s{t}", experiment="lr-multipliers", k=2, t=t, multipliers=[1 / 3, 10.0 + t, 1.0, 1.0],
                weight_distance=[1.0 + t, 2.0, 3.0, 4.0]) for t in range(2)]
    shown = readable(weight_distance_table(prepare(pd.DataFrame(rows))))
    assert set(shown["multipliers"]) == {"(0.333, 10, 1, 1)", "(0.333, 11, 1, 1)"}, shown["multipliers"]


def test_counts_read_as_counts_where_a_condition_has_none_yet():
    # A precision condition waiting for its pilot (no N yet) made `needed`, `trials` and `values` float columns,
    # read "12.0000" in the report and the sweep's closing table; so did an lr-search's best_sample beside a cell
    # with no completed trial.
    from analysis.format import readable

    table = pd.DataFrame([{"task": "sst2", "k": 0, "needed": 12, "trials": 12, "values": 11, "best_sample": 3,
                           "completed": 8, "pruned": 2, "pilot_trials": 4, "max_trials": 20},
                          {"task": "sst2", "k": 4, "pilot_trials": 4, "max_trials": 20}])
    shown = readable(table)
    assert shown.iloc[0].tolist() == ["sst2", "0", "12", "12", "11", "3", "8", "2", "4", "20"], shown.iloc[0]
