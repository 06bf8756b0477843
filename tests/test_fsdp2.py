"""FSDP2 building blocks on 2 CPU processes (gloo), against the unsharded model in one process.

- A model built sharded (on the meta device, materialised block by block) starts from exactly the weights of the
  1-process build with the same seed.
- Gradient clipping under sharding uses the global norm, and clips the gradients as the unsharded model's.
- Mixed precision as torchtitan sets it (bf16-mixed): the blocks compute with bf16 parameters, the sharded gradients
  and master weights stay fp32, and loss and gradients match the fp32 model within bf16 tolerance.
- The mesh: full sharding over every rank for any N nodes x M devices, HSDP groups inside nodes; sizes that do not fit
  the world are one error naming the fields; Lightning's ModelParallelStrategy with a tensor-parallel dimension (its
  default on one node) is refused instead of training one replica per rank, and a data-parallel one that does not
  cover the world names the world size.
- A launch whose ranks would never all come is one line at start-up: num_nodes 2 with nothing starting the second
  node (torchrun with fewer processes than devices: tests/test_distributed.py).
"""
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swax_lightning.model.config import ModelConfig
from swax_lightning.training.parallel import build_local, build_sharded, fsdp_mesh, mixed_precision_policy
from swax_lightning.training.strategy import FSDP2Strategy, mesh_shape
from tests.gloo_ranks import run_on_two_ranks

CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=4, n_heads=2, mlstm_heads=2, chunk_size=8, window=4,
                  pattern="SX")
SEED = 11
ROOT = Path(__file__).resolve().parents[1]


def _loss(model, idx):
    return torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _worker(rank, idx, out):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    cpu = torch.device("cpu")
    result = {}

    model = build_sharded(CFG, mesh, cpu, SEED)
    result["init"] = {n: _full(p).detach().clone() for n, p in model.named_parameters()}
    _loss(model, idx).backward()  # the same batch on both ranks: the gradients are the unsharded model's
    result["norm"] = _full(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01))
    result["clipped"] = {n: _full(p.grad) for n, p in model.named_parameters()}

    bf16 = build_sharded(CFG, mesh, cpu, SEED, mp_policy=mixed_precision_policy("bf16-mixed"))
    seen = []
    bf16.blocks[1].register_forward_pre_hook(lambda m, args: seen.append(m.ffn_norm.weight.dtype))
    loss = _loss(bf16, idx)
    loss.backward()
    result["bf16"] = {"loss": loss.detach().float(), "compute_dtypes": seen,
                      "grad_dtypes": {p.grad.dtype for p in bf16.parameters()},
                      "param_dtypes": {p.dtype for p in bf16.parameters()},
                      "grads": {n: _full(p.grad).float() for n, p in bf16.named_parameters()}}
    if rank == 0:
        torch.save(result, out)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    idx = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(1))
    folder = tmp_path_factory.mktemp("fsdp2")
    out = folder / "result.pt"
    run_on_two_ranks(_worker, (idx, str(out)), folder)
    return idx, torch.load(out, weights_only=False)


def test_sharded_build_starts_from_the_one_process_weights(sharded):
    _, got = sharded
    local = build_local(CFG, SEED)
    for name, p in local.named_parameters():
        assert torch.equal(got["init"][name], p.detach()), name


def test_gradient_clipping_uses_the_global_norm(sharded):
    idx, got = sharded
    local = build_local(CFG, SEED)
    _loss(local, idx).backward()
    norm = torch.nn.utils.clip_grad_norm_(local.parameters(), max_norm=0.01)
    assert norm > 0.01  # clipping really happened
    torch.testing.assert_close(got["norm"], norm, rtol=1e-5, atol=1e-6)
    for name, p in local.named_parameters():
        torch.testing.assert_close(got["clipped"][name], p.grad, rtol=1e-4, atol=1e-7)


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_fp32_masters(sharded):
    idx, got = sharded
    bf16 = got["bf16"]
    assert bf16["compute_dtypes"] == [torch.bfloat16]  # the all-gathered parameters a block computes with
    assert bf16["param_dtypes"] == {torch.float32} and bf16["grad_dtypes"] == {torch.float32}
    local = build_local(CFG, SEED)
    loss = _loss(local, idx)
    loss.backward()
    assert abs(float(bf16["loss"]) - loss.item()) < 2e-2 * loss.item()
    for name, p in local.named_parameters():
        scale = p.grad.abs().max()
        assert (bf16["grads"][name] - p.grad).abs().max() <= 0.05 * scale + 1e-6, name


@pytest.mark.parametrize("nodes,devices,sharding,shape", [
    (1, 1, "full", (1,)), (1, 2, "full", (2,)), (1, 4, "full", (4,)), (8, 8, "full", (64,)),
    (2, 2, "hybrid", (2, 2)), (8, 8, "hybrid", (8, 8))])
def test_mesh_covers_every_rank(nodes, devices, sharding, shape):
    assert mesh_shape(sharding, nodes, devices) == shape


def test_bad_mesh_sizes_name_the_fields():
    with pytest.raises(ValueError, match=r"shard_size \(3\) must divide the world size: num_nodes \(1\) x devices"):
        mesh_shape("hybrid", 1, 2, shard_size=3)
    with pytest.raises(ValueError, match="sharding must be 'full' or 'hybrid'"):
        FSDP2Strategy(sharding="tensor")


class _LightningDefaultMesh:  # ModelParallelStrategy's default on 1 node x 2 devices: DP 1 x TP 2
    mesh_dim_names = ("data_parallel", "tensor_parallel")

    def __getitem__(self, name):
        return SimpleNamespace(size=lambda: {"data_parallel": 1, "tensor_parallel": 2}[name])


def test_model_parallel_strategy_with_a_tensor_parallel_dimension_is_refused():
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(2\).*own replica.*--trainer.strategy fsdp2"):
        fsdp_mesh(SimpleNamespace(device_mesh=_LightningDefaultMesh()))


# ---- bad input at start-up: one line, before any process is launched ---------------------------------------------
def _start(capsys, monkeypatch, tmp_path, *args):
    from main import main

    monkeypatch.chdir(tmp_path)  # the run folder and data would go under it: never into the checkout's runs/
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--trainer.devices", "2", *args])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_lightning_model_parallel_default_mesh_is_refused_at_start(capsys, monkeypatch, tmp_path):
    err = _start(capsys, monkeypatch, tmp_path, "--trainer.strategy",
                 '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}')
    assert "data_parallel_size (1) x tensor_parallel_size (2)" in err and "own replica" in err


def test_a_data_parallel_mesh_smaller_or_larger_than_the_world_names_the_world_size(capsys, monkeypatch, tmp_path):
    err = _start(capsys, monkeypatch, tmp_path, "--trainer.strategy",
                 '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy", '
                 '"init_args": {"data_parallel_size": 3, "tensor_parallel_size": 1}}')
    assert "data_parallel_size (3) x tensor_parallel_size (1) = 3 ranks, but the world size (num_nodes x devices) " \
           "is 2" in err and "replica" not in err


def test_two_nodes_with_nothing_starting_the_second_is_one_line(tmp_path):
    """Without a launcher, Lightning starts this node's processes and waits for the other node's forever: refused
    before any process starts (a subprocess: the old behaviour was a silent wait, which the timeout catches)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "GROUP_RANK", "MASTER_ADDR")}
    run = subprocess.Popen([sys.executable, "main.py", "fit", "--config", "configs/tiny.yaml", "--trainer.devices", "2",
                            "--trainer.num_nodes", "2", "--trainer.strategy", "fsdp2",
                            "--trainer.logger.init_args.save_dir", str(tmp_path)], cwd=ROOT, env=env,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # the launched rank too
        pytest.fail("still waiting for the other node after 120 s: killed")
    assert run.returncode == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: trainer.num_nodes is 2, but nothing starts the other nodes: launch this command on every "
                      "node with srun (SLURM) or torchrun, or set MASTER_ADDR, MASTER_PORT and NODE_RANK on each; "
                      "started alone it would wait for them forever"], stderr


def test_collective_timeout_must_be_positive():
    with pytest.raises(ValueError, match=r"collective_timeout must be > 0 seconds \(got 0\)"):
        FSDP2Strategy(collective_timeout=0)


def test_shard_size_that_does_not_divide_the_world_is_refused_at_start(capsys, monkeypatch, tmp_path):
    err = _start(capsys, monkeypatch, tmp_path, "--trainer.strategy",
                 '{"class_path": "swax_lightning.training.strategy.FSDP2Strategy", '
                 '"init_args": {"sharding": "hybrid", "shard_size": 3}}')
    assert "FSDP2Strategy.shard_size (3) must divide the world size: num_nodes (1) x devices (2) = 2" in err


def test_more_gpus_than_the_machine_has_is_refused_at_start(capsys, monkeypatch, tmp_path):
    import lightning.fabric.accelerators.cuda as fabric_cuda
    import lightning.pytorch.accelerators.cuda as cuda

    for module in (fabric_cuda, cuda):  # a machine with one GPU
        monkeypatch.setattr(module, "num_cuda_devices", lambda: 1)
    err = _start(capsys, monkeypatch, tmp_path, "--trainer.accelerator", "cuda", "--trainer.strategy", "fsdp2")
    assert "[0, 1]" in err and "only has: [0]" in err
