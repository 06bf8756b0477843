"""The window study's one command, end to end at a few steps: two arms of configs/study train, evaluate (NIAH on
RULER's grid, answer-token loss by distance) and collect into a table and two plots; a second call skips them."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--data.batch_size", "2", "--eval.niah_lengths", "[512]", "--eval.niah_samples", "4", "--eval.niah_depths",
         "4", "--eval.recall_edges", "[1, 8, 128]", "--eval.recall_samples", "2",
         "--data.recall.documents", "50"]


@pytest.mark.slow
def test_the_study_command_trains_evaluates_collects_and_resumes(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    for name in ("_base.yaml", "w_short.yaml", "xlstm.yaml"):
        shutil.copy(ROOT / "configs/study" / name, study)
    cmd = [sys.executable, "-m", "swax_lightning.study", "run", str(study), "--seeds", "0", "--save_dir",
           str(tmp_path / "runs"), "--", *SMALL, "--data.data_dir", str(tmp_path / "data")]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "runs/study"
    table = (out / "study.md").read_text()
    for arm in ("w_short", "xlstm"):
        assert (out / f"{arm}-s0/eval/results.json").is_file()
        assert list((out / f"{arm}-s0").glob("events.out.tfevents.*"))  # TensorBoard: runs/study/<arm>-s<seed>
        row = next(line for line in table.splitlines() if line.startswith(f"| {arm} | 0 |"))
        assert row.count("|") == 7  # arm, seed, val loss, NIAH 512, two answer-loss buckets
    assert (out / "niah_vs_length.png").stat().st_size > 0 and (out / "answer_loss_vs_distance.png").stat().st_size > 0
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done before") == 2, again.stdout[-2000:]


def test_the_table_averages_the_seeds_of_each_arm():
    # Two seeds of one arm, one of another: the mean row is the seeds' average of every column, a single seed gets no
    # mean row, and a missing measurement is NaN, not a silent zero.
    from swax_lightning.study import _table

    def run(val, niah, recall):
        return {"val/loss": val,
                "results": {"niah": {"scores": {"average": {"512": {"mean": niah, "ci95": [niah - 5, niah + 5]}}}},
                            "recall": {"buckets": [{"from": 1, "to": 8, "loss": recall}]}}}

    runs = {("w_short", 0): run(2.0, 10.0, 1.0), ("w_short", 1): run(3.0, 30.0, 2.0),
            ("xlstm", 0): {"val/loss": 2.5, "results": {}}}
    lines = _table(runs).splitlines()
    assert "| **w_short** | mean | 2.500 | 20 | 1.500 |" in lines
    assert "| w_short | 1 | 3.000 | 30 [25, 35] | 2.000 |" in lines
    assert "| xlstm | 0 | 2.500 |  | nan |" in lines and not any(line.startswith("| **xlstm**") for line in lines)
