"""The chunked training loss under FSDP2 (2 CPU processes, gloo): computed inside the sharded model's forward, its
value and every gradient equal the unsharded model's plain cross-entropy."""
import torch

from swax_lightning.model.config import ModelConfig
from swax_lightning.training.parallel import build_local, build_sharded
from tests.gloo_ranks import run_on_two_ranks

CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=4, n_heads=2, mlstm_heads=2, chunk_size=8, window=4,
                  pattern="SX")


def _worker(rank, idx, out):
    from torch.distributed.device_mesh import init_device_mesh

    model = build_sharded(CFG, init_device_mesh("cpu", (2,)), torch.device("cpu"), 11)
    loss = model(idx[:, :-1], targets=idx[:, 1:])  # the path LanguageModule.loss takes
    loss.backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save((loss.detach(), grads), out)


def test_sharded_chunked_loss_equals_unsharded_plain_loss(tmp_path):
    idx = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(1))
    out = str(tmp_path / "result.pt")
    run_on_two_ranks(_worker, (idx, out), tmp_path)
    loss, grads = torch.load(out, weights_only=False)
    ref = build_local(CFG, 11)
    logits = ref(idx[:, :-1])
    ref_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach(), atol=1e-6, rtol=1e-6)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-5, msg=lambda m: f"{name}: {m}")
