"""A review of `--resume` (earlier fused packs formed again, the precision sweep's stages) and of a sequential
trial's intermediate-round checkpoints: each test failed before its mend."""
from __future__ import annotations

from sweep.cli import main
from sweep.store import write_row
from trainables.rows import make_row


def test_a_precision_sweep_whose_pilot_is_retried_resumes_its_second_stage_too(tiny_bert, tmp_path, monkeypatch):
    """A condition whose pilot is in runs its stage 2 while another's failed pilot waits ("run the command again
    to retry them"). Run again with --resume, the retried pilot runs first: stage 2 must still go on from the
    checkpoints its trials left, not start them over."""
    from sweep.cli import RaySession

    values = {(0, 0): 0.5, (0, 1): 0.9, (4, 0): 0.6, (4, 1): 0.7}  # k=0's far apart: N well past the pilot
    runs, calls = [], []

    def fake_run(self, todo, sweep, folder, raw, known=()):
        runs.append((sorted(s.trial_id for s in todo), sweep.run.resume))
        calls.append(sweep.run.resume)
        for spec in todo:
            if spec.trial_index >= 2:  # stage 2: stopped before any row landed
                continue
            failed = len(calls) == 1 and spec.k == 4 and spec.trial_index == 1
            figures = {} if failed else {"dev_metric": values[spec.k, spec.trial_index]}
            write_row(folder, make_row(spec.row(), figures, "error" if failed else "ok", "lost" if failed else None))

    monkeypatch.setattr(RaySession, "run", fake_run)
    argv = ["incremental", "--model", tiny_bert, "--tasks", "synthetic", "--sizes", "24", "--k", "0", "4",
            "--epochs", "1", "--target-ci", "0.05", "--pilot-trials", "2", "--max-trials", "4", "--pack", "2",
            "--storage", str(tmp_path), "--name", "stages"]
    main(argv)
    assert len(runs) == 2 and len(runs[1][0]) == 2  # the pilot, then k=0's stage 2 (k=4's waits)
    stage_two = runs[1][0]
    runs.clear()
    main([*argv, "--resume"])
    assert len(runs) == 2 and len(runs[0][0]) == 1 and runs[0][1]  # k=4's pilot retried, resumed
    assert set(stage_two) <= set(runs[1][0]) and runs[1][1], "stage 2 must go on from its earlier checkpoints"
