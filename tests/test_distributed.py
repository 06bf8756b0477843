"""Sharded training is one model: K processes under FSDP2 compute what one process computes.

The oracle: K ranks with batch b per rank against one process trained in this test on exactly the global batches the
ranks consumed (the K batches of a step concatenated in rank order): the same per-step loss (the mean of the ranks'
losses) within 1e-5 in fp32, the same all-gathered parameters on every rank after every step, and final weights (from
the consolidated distributed checkpoint) equal to the 1-process run's within 1e-5. Run for K = 2 through the README's
rehearsal command (Lightning launches the processes; full sharding, as the paper configs) and for 2 "nodes" x 2
devices with HSDP, through two torchrun launches on localhost. Then: a run killed with SIGKILL inside a
validation resumes on all ranks from last.ckpt and continues exactly (the interrupted validation runs again);
`main.py test` of the distributed checkpoint under 2-process FSDP2 scores what 1 process scores on its consolidated
file; the consolidated file loads in generate and resumes a 1-process fit; a distributed checkpoint given to a
1-process run is one clear error line.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from swax_lightning.checkpoints import consolidate
from swax_lightning.data import TextDataModule
from tests.train_probe import read_records

ROOT = Path(__file__).resolve().parents[1]
# The README's 2-process rehearsal of a cluster run (tests/test_distributed.py checks that the README prints it).
REHEARSAL = (".venv/bin/python main.py fit --config configs/tiny_stochastic.yaml --trainer.devices 2 "
             "--trainer.strategy fsdp2")
STEPS, PER_RANK_BATCH = 4, 2
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("shards") / "tiny"
    TextDataModule(source="embedded", data_dir=str(path), seq_len=256).prepare_data()
    return path


def _args(tmp, data_dir, record_dir, *extra):
    return ["--data.data_dir", str(data_dir), "--data.batch_size", str(PER_RANK_BATCH),
            "--trainer.logger.init_args.save_dir", str(tmp / "runs"), "--trainer.enable_progress_bar", "false",
            "--trainer.max_steps", str(STEPS), "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
            "--trainer.callbacks+=tests.train_probe.RecordTraining", f"--trainer.callbacks.out_dir={record_dir}",
            *extra]


def _run(cmd, timeout=400):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _rehearsal(*args):
    cmd = REHEARSAL.split()
    return [sys.executable, *cmd[1:], *args]


def _torchrun(nnodes, node_rank, port, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(node_rank),
            "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
            str(ROOT / "main.py"), *args]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ckpt(tmp) -> Path:
    return tmp / "runs/tiny/stochastic_p0.5/checkpoints/last.ckpt"


def _reference(tmp, data_dir, records, steps=STEPS):
    """One process trained on the ranks' global batches; returns (per-step loss, final state_dict)."""
    from swax_lightning.cli import SwaxCLI
    from swax_lightning.module import LanguageModule

    ranks = sorted(records)
    batches = [torch.tensor(sum((records[r]["steps"][s]["batch"] for r in ranks), [])) for s in range(steps)]
    cli = SwaxCLI(LanguageModule, TextDataModule, seed_everything_default=0, run=False, args=[
        "--config", str(ROOT / "configs/tiny_stochastic.yaml"), *_args(tmp / "ref", data_dir, tmp / "ref/records"),
        "--trainer.limit_val_batches", "0"])
    cli.datamodule.train_dataloader = lambda: DataLoader(batches, batch_size=None)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    ref = read_records(tmp / "ref/records")[0]["steps"]
    return [ref[s]["loss"] for s in range(steps)], cli.model.state_dict()


def _assert_one_model(records, ref_losses, ref_state, ckpt, steps=STEPS):
    ranks = sorted(records)
    rows = [tuple(row) for r in ranks for s in range(steps) for row in records[r]["steps"][s]["batch"]]
    assert len(set(rows)) == len(rows), "ranks must read different data"
    for s in range(steps):
        per_rank = [records[r]["steps"][s] for r in ranks]
        assert len({rec["params"] for rec in per_rank}) == 1, f"ranks hold different models after step {s}"
        assert len({rec["window"] for rec in per_rank}) == 1, f"ranks trained at different windows at step {s}"
        global_loss = sum(rec["loss"] for rec in per_rank) / len(ranks)
        assert abs(global_loss - ref_losses[s]) <= 1e-5, (s, global_loss, ref_losses[s])
    full = consolidate(ckpt, ckpt.with_name("full.ckpt"))
    state = torch.load(full, weights_only=False)["state_dict"]
    assert set(state) == set(ref_state)
    for name, value in ref_state.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, data_dir):
    """The README's rehearsal command, 8 steps with a validation every 2."""
    tmp = tmp_path_factory.mktemp("k2")
    run = _run(_rehearsal(*_args(tmp, data_dir, tmp / "records")))
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp


def test_readme_prints_the_rehearsal_command():
    assert REHEARSAL in (ROOT / "README.md").read_text()


def test_two_ranks_train_what_one_process_trains(tmp_path, data_dir, two_rank_run):
    records = read_records(two_rank_run / "records")
    assert sorted(records) == [0, 1]
    ref_losses, ref_state = _reference(tmp_path, data_dir, records)
    _assert_one_model(records, ref_losses, ref_state, _ckpt(two_rank_run))


def test_two_nodes_of_two_devices_train_one_model_under_hsdp(tmp_path, data_dir):
    """HSDP (shard inside a node, replicate across nodes) only differs from full sharding with 2+ nodes of 2+ devices,
    so the multi-node launch is proven with it; full sharding (the paper configs') is the rehearsal's K = 2 run, and
    its 4-rank and 64-rank meshes are checked in tests/test_fsdp2.py."""
    port = _free_port()
    args = ["fit", "--config", str(ROOT / "configs/tiny_stochastic.yaml"),
            *_args(tmp_path, data_dir, tmp_path / "records"), "--trainer.num_nodes", "2", "--trainer.devices", "2",
            "--trainer.strategy", "hsdp"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    nodes = [subprocess.Popen(_torchrun(2, n, port, *args), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for n in (0, 1)]
    outputs = [node.communicate(timeout=400)[0] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), outputs[0][-3000:] + outputs[1][-3000:]
    records = read_records(tmp_path / "records")
    assert sorted(records) == [0, 1, 2, 3]
    ref_losses, ref_state = _reference(tmp_path, data_dir, records)
    _assert_one_model(records, ref_losses, ref_state, _ckpt(tmp_path))


def test_kill_during_validation_then_resume_continues_exactly(tmp_path, data_dir, two_rank_run):
    fit = ["fit", "--config", str(ROOT / "configs/tiny_stochastic.yaml"), "--trainer.devices", "2",
           "--trainer.strategy", "fsdp2"]
    killed = _run(_torchrun(1, 0, _free_port(), *fit, *_args(tmp_path, data_dir, tmp_path / "records"),
                            "--trainer.callbacks.kill_in_validation_at=4"))
    assert killed.returncode != 0
    saved = torch.load(_ckpt(tmp_path) / "meta.pt", weights_only=False)
    assert saved["global_step"] == 2  # the validation at step 4 never finished, so last.ckpt is step 2's
    resumed = _run(_torchrun(1, 0, _free_port(), *fit, *_args(tmp_path, data_dir, tmp_path / "records"),
                             "--ckpt_path", "last"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = read_records(tmp_path / "records"), read_records(two_rank_run / "records")
    for rank in (0, 1):
        assert sorted(got[rank]["steps"]) == list(range(STEPS))
        for s in range(STEPS):
            for key in ("loss", "window", "params"):
                assert got[rank]["steps"][s][key] == want[rank]["steps"][s][key], (rank, s, key)
        validated = {v["step"]: v["loss"] for v in got[rank]["validations"]}
        assert validated == {v["step"]: v["loss"] for v in want[rank]["validations"]}  # step 4's ran again


SMALL_EVAL = ["--eval.niah_tasks", "[niah_single_1, niah_multikey_2]", "--eval.niah_lengths", "[512, 1024]",
              "--eval.niah_samples", "2", "--eval.niah_depths", "2", "--eval.babilong_tasks", "[qa1]",
              "--eval.babilong_lengths", "[0, 2048]", "--eval.babilong_samples", "2", "--eval.perplexity_len", "512",
              "--eval.perplexity_samples", "2", "--eval.max_new_tokens", "8", "--trainer.limit_test_batches", "2"]


@pytest.fixture(scope="module")
def consolidated(two_rank_run):
    """The README's consolidation command on the rehearsal's last.ckpt."""
    full = two_rank_run / "full.ckpt"
    run = _run([sys.executable, "-m", "swax_lightning.checkpoints", str(_ckpt(two_rank_run)), "--out", str(full)])
    assert run.returncode == 0 and full.is_file(), run.stderr[-2000:]
    return full


def test_sharded_evaluation_scores_what_one_process_scores(tmp_path, data_dir, two_rank_run, consolidated):
    base = [sys.executable, str(ROOT / "main.py"), "test", "--config", str(ROOT / "configs/tiny_stochastic.yaml"),
            "--data.data_dir", str(data_dir), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
            "--trainer.enable_progress_bar", "false", *SMALL_EVAL]
    sharded = _run([*base, "--trainer.devices", "2", "--trainer.strategy", "fsdp2", "--ckpt_path",
                    str(_ckpt(two_rank_run)), "--eval.output_dir", str(tmp_path / "sharded")])
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    single = _run([*base, "--ckpt_path", str(consolidated), "--eval.output_dir", str(tmp_path / "single")])
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("sharded", "single"))
    assert a == b and a["niah"] and a["babilong"] and a["perplexity"]


def test_a_distributed_checkpoint_in_one_process_is_one_clear_line(capsys, data_dir, two_rank_run):
    from swax_lightning.checkpoints import load_model
    from swax_lightning.cli import main
    from swax_lightning.config import ConfigError

    with pytest.raises(SystemExit) as exit_:
        main(["test", "--config", str(ROOT / "configs/tiny_stochastic.yaml"), "--data.data_dir", str(data_dir),
              "--ckpt_path", str(_ckpt(two_rank_run))])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert "is a distributed checkpoint" in err[0] and "python -m swax_lightning.checkpoints" in err[0]
    with pytest.raises(ConfigError, match="distributed checkpoint.*python -m swax_lightning.checkpoints"):
        load_model(_ckpt(two_rank_run))


def test_consolidated_checkpoint_loads_in_generate_and_resumes_one_process(tmp_path, data_dir, consolidated):
    from swax_lightning.checkpoints import load_model

    model, tokenizer = load_model(consolidated)
    assert torch.isfinite(model(torch.tensor([tokenizer.encode("def main(")]))).all()
    resumed = _run([sys.executable, str(ROOT / "main.py"), "fit", "--config",
                    str(ROOT / "configs/tiny_stochastic.yaml"), *_args(tmp_path, data_dir, tmp_path / "records"),
                    "--data.batch_size", str(2 * PER_RANK_BATCH), "--trainer.max_steps", str(STEPS + 2),
                    "--ckpt_path", str(consolidated)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(read_records(tmp_path / "records")[0]["steps"]) == [STEPS, STEPS + 1]
