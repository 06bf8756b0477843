"""Carrying a GGUF to the lent GPU machine in parts (benchmarks/gpu_carry.py) and the GPU check's retrofit mode
(`bash benchmarks/gpu_check.sh --retrofit MODEL`), rehearsed on CPU with the real SmolLM2 GGUF:

- every planned device call carries at most --call_mib with the working tree, the first one the wheels too;
- the parts join into the very file (its SHA-256); a second join leaves it alone; a damaged or missing part is named
  and leaves no joined file behind;
- the retrofit mode as the device runs it (the parts joined by the script, the experiment run, its results copied to
  the logs without checkpoints, the summary's stages done), on a config of the smallest budgets and grid on CPU;
- the shipped GPU configs train only LoLCATs' student, at LoLCATs' budget.

Skipped without the pretrained group (bash setup.sh pretrained).
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_carry  # noqa: E402

from swax_lightning.pretrained import hf_import  # noqa: E402
from swax_lightning.pretrained.experiment import read_config  # noqa: E402

needs_smollm2 = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in (*hf_import.GGUF_PACKAGES, hf_import.SMOLLM2_PACKAGE)),
    reason="needs the pretrained group: bash setup.sh pretrained")
MIB = gpu_carry.MIB


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(folder, manifest) of SmolLM2's GGUF packed with a 3 MiB stand-in wheels folder, at 40 MiB a call."""
    folder = tmp_path_factory.mktemp("carry")
    (folder / "wheels").mkdir()
    (folder / "wheels" / "a.whl").write_bytes(b"w" * 3 * MIB)
    return folder, gpu_carry.pack("smollm2", folder, 40.0, folder / "wheels")


@needs_smollm2
def test_every_call_fits_its_budget_and_the_parts_join_into_the_file(packed):
    folder, manifest = packed
    source = hf_import.smollm2_gguf()
    assert manifest["sha256"] == gpu_carry.sha256(source) and manifest["bytes"] == source.stat().st_size
    assert manifest["calls"][0][0] == str(folder / "wheels") and manifest["calls"][-1][-1].endswith(".carry.json")
    for carry in manifest["calls"]:
        sent = manifest["tree_bytes"] + sum(gpu_carry.folder_bytes(Path(p)) if Path(p).is_dir()
                                            else Path(p).stat().st_size for p in carry)
        assert sent <= 40 * MIB
    assert len(manifest["calls"]) == len(manifest["parts"]) >= 3
    joined = gpu_carry.join(folder / "smollm2.carry.json")
    assert joined == folder / source.name and gpu_carry.sha256(joined) == manifest["sha256"]
    stamp = joined.stat().st_mtime_ns
    assert gpu_carry.join(folder / "smollm2.carry.json") == joined and joined.stat().st_mtime_ns == stamp


@needs_smollm2
def test_a_damaged_or_missing_part_is_named_and_nothing_is_joined(packed, tmp_path):
    folder, manifest = packed
    copy = tmp_path / "carry"
    copy.mkdir()
    parts = [Path(p["path"]) for p in manifest["parts"]]
    for part in parts:
        (copy / part.name).write_bytes(part.read_bytes())
    moved = {**manifest, "file": str(copy / "model.gguf"),
             "parts": [{**p, "path": str(copy / Path(p["path"]).name)} for p in manifest["parts"]]}
    (copy / "m.carry.json").write_text(json.dumps(moved))
    damaged = copy / parts[1].name
    data = bytearray(damaged.read_bytes())
    data[1000] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=re.escape(f"{damaged}: damaged part")):
        gpu_carry.join(copy / "m.carry.json")
    damaged.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"{damaged}: part missing")):
        gpu_carry.join(copy / "m.carry.json")
    assert not (copy / "model.gguf").exists() and not list(copy.glob("*.joining"))
    result = subprocess.run([sys.executable, "benchmarks/gpu_carry.py", "join", str(copy / "m.carry.json")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.strip() == f"error: {damaged}: part missing (each device call " \
        "carries the parts the plan gives it, to the same warm machine)"


def test_a_call_without_room_for_a_part_is_refused():
    assert gpu_carry.part_sizes(10 * MIB, 4 * MIB, 5 * MIB) == [4 * MIB, 5 * MIB, MIB]
    with pytest.raises(ValueError, match="less than 1 MiB left"):
        gpu_carry.part_sizes(10 * MIB, MIB // 2, 5 * MIB)


@pytest.mark.slow
@needs_smollm2
def test_the_retrofit_mode_joins_runs_and_copies_the_results_on_cpu(packed, tmp_path):
    folder, manifest = packed
    (folder / Path(manifest["file"]).name).unlink(missing_ok=True)  # the script joins it
    (tmp_path / "text").mkdir()
    for i in range(10):
        (tmp_path / "text" / f"doc{i}.txt").write_text(f"Document {i}. " + "The grass is green. " * 80)
    config = tmp_path / "rehearsal.yaml"
    config.write_text(yaml.safe_dump({
        "source": manifest["file"], "out": str(tmp_path / "smollm2_rehearsal"), "device": "cpu",
        "data": {"source": str(tmp_path / "text"), "seq_len": 64, "batch_size": 2, "val_fraction": 0.2,
                 "test_fraction": 0.2},
        "students": {"lolcats": {"pattern": "L"}},
        "transfer": {"tokens": 2 * 2 * 64, "save_every": 1}, "lora": {"tokens": 2 * 64, "save_every": 1},
        "evaluate": {"windows": [64], "sinks": [4], "choice_items": 0, "suite": {
            "niah": {"tasks": ["niah_single_2"], "lengths": [512], "depths": [0.5, 1.0], "samples": 2,
                     "max_new_tokens": 12},
            "babilong": {"tasks": ["qa1"], "lengths": [0], "samples": 1},
            "perplexity": {"length": 128, "samples": 1}}}}))
    logs = tmp_path / "logs"
    env = {"GPU_CHECK_CARRY": str(folder), "GPU_CHECK_RETROFIT_CONFIG": str(config), "GPU_CHECK_LOGS": str(logs),
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--retrofit", "smollm2", str(tmp_path / "s.json")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    stages = json.loads((tmp_path / "s.json").read_text())["stages"]
    assert list(stages) == ["install", "retrofit"] and {s["rc"] for s in stages.values()} == {0}, stages
    copied = logs / "smollm2_rehearsal"
    summary = json.loads((copied / "summary.json").read_text())
    assert list(summary["variants"]) == ["full", "swa64-sink4", "retrofit-lolcats"]
    assert (copied / "report.md").is_file() and (copied / "students" / "lolcats" / "transfer.json").is_file()
    assert not list(copied.rglob("*.ckpt")) and not (copied / "import").exists()


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_the_gpu_configs_train_lolcats_student_at_lolcats_budget(model):
    cfg = read_config(ROOT / "configs" / "retrofit" / f"{model}_gpu.yaml")
    large = read_config(ROOT / "configs" / "retrofit" / f"{model}_large.yaml")
    assert list(cfg.students) == ["lolcats"] and cfg.students["lolcats"] == large.students["lolcats"]
    assert (cfg.transfer, cfg.lora, cfg.data, cfg.device) == (large.transfer, large.lora, large.data, "cuda")
    assert cfg.transfer.tokens == cfg.lora.tokens == 20 * 2**20 and cfg.batch_size == 8 and cfg.seq_len == 1024
    assert Path(cfg.source).parent == Path("benchmarks/.carry") and cfg.evaluate.choice_items == 0
