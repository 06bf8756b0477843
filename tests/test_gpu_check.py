"""benchmarks/gpu_check.sh without a GPU: its dry run lists every stage with a limit inside the 8-minute budget and
every offline wheel (pytest included); its summary (benchmarks/gpu_check_summary.py) keeps what a timed-out or
still-running stage produced and computes issue 31's targets from the benchmark rows."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_lists_every_stage_limit_and_wheel():
    out = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    table = [line.split(" | ") for line in out.splitlines() if line.count(" | ") == 3][1:]
    stages = {row[0]: int(row[2]) for row in table}
    assert list(stages)[:2] == ["install", "tests_mlstm"] and "study" in stages and "fit_tiny" in stages
    total = int(next(line for line in out.splitlines() if line.startswith("total of the limits:")).split()[4])
    assert total <= 420 < 480
    for wheel in ("pytest==", "pluggy==", "iniconfig==", "mlstm_kernels==", "fla-core==", "jsonargparse=="):
        assert f"  {wheel}" in out, wheel
    assert "--- study:" in out and "train_14b --window 128" in out  # each stage's command is shown
    # The GPU window study runs apart (--study): install and its own stage, inside one 10-minute device call.
    assert next(row for row in table if row[0] == "study")[1] == "--study only"
    study = next(line for line in out.splitlines() if line.startswith("--study: install and study,"))
    assert int(study.split()[4]) <= 570 and "w_short.yaml" in study


def _stage(log: Path, name: str, text: str, rc: int | None = None, seconds: int = 5):
    (log / f"{name}.log").write_text(text)
    if rc is not None:
        (log / f"{name}.rc").write_text(f"{rc}\n")
        (log / f"{name}.s").write_text(f"{seconds}\n")


def test_summary_keeps_timed_out_and_running_stages_and_computes_targets(tmp_path):
    log = tmp_path / "logs"
    log.mkdir()
    row = lambda **kw: json.dumps(kw)
    _stage(log, "tests_mlstm", "tests/test_gpu.py::test_a PASSED\ntests/test_gpu.py::test_b FAILED\n", rc=1)
    _stage(log, "tests_flex", "tests/test_gpu.py::test_flex[x] PASSED\n", rc=124, seconds=110)  # stopped at its limit
    _stage(log, "mlstm", "\n".join([
        row(impl="triton (ours)", shape="4x256x512", T=4096, fwd_bwd_tokens_per_s=3e6),
        row(impl="tfla (NX-AI)", shape="4x256x512", T=4096, fwd_bwd_tokens_per_s=4e6)]), rc=124, seconds=60)
    _stage(log, "swa", row(impl="triton (ours)", T=4096, W=128, fwd_bwd_ms=1.0) + "\n"
           + row(impl="flex attention", T=4096, W=128, fwd_bwd_ms=1.2))  # still running: no exit code
    summary = tmp_path / "gpu_check.json"
    subprocess.run([sys.executable, "benchmarks/gpu_check_summary.py", str(log), str(summary), "0",
                    "tests_mlstm,tests_flex,mlstm,swa,train_1.4b_w128"], cwd=ROOT, check=True, timeout=60)
    result = json.loads(summary.read_text())
    stages, targets = result["stages"], result["targets"]
    assert stages["tests_mlstm"]["counts"] == {"FAILED": 1, "PASSED": 1}
    assert stages["tests_mlstm"]["failed"] == ["tests/test_gpu.py::test_b"]
    assert stages["tests_flex"]["status"] == "timed out" and stages["tests_flex"]["counts"] == {"PASSED": 1}
    assert stages["swa"]["status"] == "running" and stages["train_1.4b_w128"] == {"status": "pending"}
    assert targets["mlstm_4x256x512_T4096_own_over_tfla"] == {"ratio": 0.75, "target": 1.0, "met": False}
    assert targets["swa_T4096_W128_speed_over_flex"] == {"ratio": 1.2, "target": 0.9, "met": True}
    assert not list(tmp_path.glob("*.tmp"))
