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
