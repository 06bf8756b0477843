"""Two CPU processes (gloo): DDP ranks agree on every window; FSDP2 trains, checkpoints, resumes and tests; gradient
clipping under sharding sees the global norm."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swax_lightning.config import ModelConfig
from swax_lightning.model import SWAXModel

ROOT = Path(__file__).resolve().parents[1]
FSDP2 = '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}'
pytestmark = pytest.mark.slow
NO_EVALS = ["--eval.niah_tasks", "[]", "--eval.babilong_tasks", "[]", "--eval.perplexity_len", "null"]  # loss only


def _fit(tmp_path, *args, subcommand="fit"):
    cmd = [sys.executable, str(ROOT / "main.py"), subcommand, "--config", str(ROOT / "configs/tiny_stochastic.yaml"),
           "--data.data_dir", str(tmp_path / "data"), "--data.batch_size", "4",
           "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.enable_progress_bar", "false",
           "--trainer.devices", "2", *args]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)


def _probe(out_dir):
    return ["--trainer.callbacks+=tests.window_probe.RecordWindows", f"--trainer.callbacks.out_dir={out_dir}"]


def _windows(out_dir):
    files = sorted(Path(out_dir).glob("rank*.json"))
    return {f.name.split("-")[0]: json.loads(f.read_text()) for f in files}


def test_ddp_ranks_agree_on_every_window(tmp_path):
    run = _fit(tmp_path, "--trainer.strategy", "ddp", "--trainer.max_steps", "12", "--trainer.limit_val_batches", "0",
               *_probe(tmp_path / "windows"))
    assert run.returncode == 0, run.stderr[-3000:]
    per_rank = _windows(tmp_path / "windows")
    assert sorted(per_rank) == ["rank0", "rank1"]
    assert per_rank["rank0"] == per_rank["rank1"]
    assert len(per_rank["rank0"]) == 12 and set(per_rank["rank0"].values()) == {16, 64}


def test_fsdp2_fit_checkpoint_resume_and_test(tmp_path):
    ckpt = tmp_path / "runs/tiny/stochastic_p0.5/checkpoints/last.ckpt"
    first = _fit(tmp_path, "--trainer.strategy", FSDP2, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
                 "--trainer.limit_val_batches", "2", "--model.activation_checkpointing", "true",
                 *_probe(tmp_path / "w1"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2  # one shard file per rank
    resumed = _fit(tmp_path, "--trainer.strategy", FSDP2, "--trainer.max_steps", "8", "--trainer.val_check_interval",
                   "2", "--trainer.limit_val_batches", "2", "--ckpt_path", str(ckpt), *_probe(tmp_path / "w2"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Restored all states" in resumed.stdout + resumed.stderr
    w2 = _windows(tmp_path / "w2")
    assert sorted(map(int, w2["rank0"])) == [4, 5, 6, 7] and w2["rank0"] == w2["rank1"]
    test = _fit(tmp_path, "--trainer.strategy", FSDP2, "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "2",
                *NO_EVALS, subcommand="test")
    assert test.returncode == 0, test.stderr[-3000:]
    loss = float(re.search(r"test/loss\W+([0-9.]+)", test.stdout).group(1))  # plain or rich (│) table
    assert 0 < loss < 5.5  # trained below the uniform 5.55


# ---- gradient clipping under FSDP2: the norm is global, not per shard -------------------------------------------
CFG = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, chunk_size=8, window=4)


def _reference_grads(idx):
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(**CFG))
    model(idx).logsumexp(-1).mean().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
    return norm, {n: p.grad for n, p in model.named_parameters()}


def _sharded_worker(rank, port, idx, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(**CFG))
    mesh = init_device_mesh("cpu", (2,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(idx).logsumexp(-1).mean().backward()  # the same batch on both ranks: gradients equal the reference
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"norm": norm.full_tensor() if hasattr(norm, "full_tensor") else norm, "grads": grads}, out)
    dist.destroy_process_group()


def test_gradient_clipping_under_fsdp2_uses_the_global_norm(tmp_path):
    idx = torch.randint(0, 40, (2, 19), generator=torch.Generator().manual_seed(1))
    ref_norm, ref_grads = _reference_grads(idx)
    out = tmp_path / "sharded.pt"
    mp.start_processes(_sharded_worker, args=(29517, idx, str(out)), nprocs=2, start_method="spawn")
    got = torch.load(out)
    torch.testing.assert_close(got["norm"], ref_norm, rtol=1e-5, atol=1e-6)
    assert ref_norm > 0.01  # clipping really happened
    for name, grad in ref_grads.items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-7)
