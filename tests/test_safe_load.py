"""Checkpoints load as data, never as code: a crafted pickle given to every command that takes a checkpoint is refused
in one line naming the file, and its payload never runs (it would write a marker file); a real checkpoint still
loads (tests/fixtures/pre_move.ckpt, written by main.py fit)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "pre_move.ckpt"


class Payload:
    """Unpickled with weights_only=False, it writes `marker`: what a hostile checkpoint would do, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def crafted(path: Path, marker: Path) -> Path:
    state = torch.load(FIXTURE, weights_only=True)
    state["hyper_parameters"]["payload"] = Payload(marker)
    torch.save(state, path)
    return path


def run(tmp_path, *args):
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)


CONFIG = ["--config", str(ROOT / "configs" / "tiny.yaml")]


@pytest.mark.parametrize("command", ["test", "validate", "fit", "generate", "export", "consolidate"])
def test_a_crafted_checkpoint_is_refused_before_its_code_runs(tmp_path, command):
    marker = tmp_path / "marker"
    ckpt = crafted(tmp_path / "crafted.ckpt", marker)
    if command == "consolidate":  # a distributed checkpoint: meta.pt is read first
        folder = tmp_path / "dist"
        folder.mkdir()
        shutil.copy(ckpt, folder / "meta.pt")
        args = ["-m", "swax_lightning", "consolidate", str(folder), "--out", str(tmp_path / "one.ckpt")]
    elif command in ("generate", "export"):
        extra = ["--prompt", "x"] if command == "generate" else ["--out", str(tmp_path / "hf")]
        args = ["-m", "swax_lightning", command, "--ckpt_path", str(ckpt), *extra]
    else:
        args = [str(ROOT / "main.py"), command, *CONFIG, "--ckpt_path", str(ckpt), "--data.data_dir",
                str(tmp_path / "data"), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    out = run(tmp_path, *args)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2 and len(errors) == 1 and str(tmp_path) in errors[0], out.stderr[-2000:]
    assert "holds more than data" in errors[0]
    assert not marker.exists()  # the payload never ran


def test_the_same_payload_runs_under_a_plain_torch_load(tmp_path):
    # The oracle of the test above: the crafted file is hostile (torch.load without weights_only runs it).
    marker = tmp_path / "marker"
    torch.load(crafted(tmp_path / "crafted.ckpt", marker), weights_only=False)
    assert marker.read_text() == "ran"


def test_a_real_checkpoint_still_loads_as_data():
    from swax_lightning.core.safe_load import load_as_data

    state = load_as_data(FIXTURE)
    assert state["global_step"] == 3 and "model.embed.weight" in state["state_dict"]
