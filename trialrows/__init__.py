"""What a trial's Parquet row is, and reading rows back: the one thing the sweep (which writes rows) and the
analysis (which reads them) share, so that neither imports the other.

- `trialrows.schema`: every column's Arrow type and role; `rows_table` makes the Arrow table a row file is.
- `trialrows.experiments`: what each experiment's rows hold (the columns that tell its conditions apart, its
  own columns), one entry per experiment.
- `trialrows.read`: the store's rows back, one per trial.
- `trialrows.summaries`: the per-condition summary (n, mean, t-interval) and a search's best trial per cell,
  which the sweep prints at its end and the analysis reports.

It imports nothing else of this project.
"""
