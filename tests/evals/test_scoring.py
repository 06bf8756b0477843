"""The one scorer of given text (evals/scoring.py): chunk by chunk through the streaming state, equal to the
log-softmax of one whole-sequence forward, for every layer kind and for a left-padded batch."""
import pytest
import torch

from swax_lightning.evals.scoring import token_scores
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.inference import left_pad
from swax_lightning.model.model import SWAXModel


@pytest.mark.parametrize("pattern", ["SX", "AD"])
def test_chunked_scores_equal_one_whole_forward(pattern):
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, pattern=pattern, n_heads=2, mlstm_heads=2,
                                  deltanet_heads=2, window=8, chunk_size=8)).double().eval()
    texts = [torch.randint(0, 257, (n,)).tolist() for n in (41, 29)]
    idx, positions = left_pad([t[:-1] for t in texts])
    targets, _ = left_pad([t[1:] for t in texts])
    logprob, greedy = token_scores(model, idx, positions, targets, chunk_len=7)
    for b, text in enumerate(texts):
        whole = torch.log_softmax(model(torch.tensor([text[:-1]])), -1)[0]
        expected = whole.gather(-1, torch.tensor(text[1:])[:, None])[:, 0]
        n = len(text) - 1
        torch.testing.assert_close(logprob[b, -n:], expected, rtol=0, atol=1e-9)
        assert torch.equal(greedy[b, -n:], whole.argmax(-1) == torch.tensor(text[1:]))


def test_scored_positions_only_run_the_head_there_with_the_same_scores():
    # A multiple-choice item needs its answer's tokens: the LM head sees exactly those rows, and they score as in a
    # full pass; the others read log p 0 and greedy True.
    torch.manual_seed(1)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, pattern="SX", n_heads=2, mlstm_heads=2, window=8,
                                  chunk_size=8)).double().eval()
    texts = [torch.randint(0, 257, (n,)).tolist() for n in (23, 17)]
    idx, positions = left_pad([t[:-1] for t in texts])
    targets, _ = left_pad([t[1:] for t in texts])
    scored = torch.zeros_like(targets, dtype=torch.bool)
    scored[0, -3:], scored[1, -1:], scored[1, 5] = True, True, True
    head_rows = []
    hook = model.lm_head.register_forward_hook(lambda _, args, out: head_rows.append(args[0].shape[0]))
    logprob, greedy = token_scores(model, idx, positions, targets, chunk_len=7, scored=scored)
    hook.remove()
    assert sum(head_rows) == int(scored.sum())
    all_logprob, all_greedy = token_scores(model, idx, positions, targets, chunk_len=7)
    torch.testing.assert_close(logprob[scored], all_logprob[scored], rtol=0, atol=1e-12)
    assert torch.equal(greedy[scored], all_greedy[scored])
    assert (logprob[~scored] == 0).all() and greedy[~scored].all()
