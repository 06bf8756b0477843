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
