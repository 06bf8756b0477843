"""A scripted byte-level model behind the streaming interface (SWAXModel.forward with caches and positions), for
evaluation tests whose expected scores are known exactly: a subclass says, from the text read so far, the logits of
the next token (`next_token_logits`); the cache holds each row's tokens so far, so chunked prefill and left padding
go through the same code as with a real model."""
import torch

VOCAB = 257  # the byte tokenizer's ids


class StreamingTextModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))  # the evaluations read the device and dtype from a parameter

    def new_caches(self, batch, dtype=torch.float32):
        return [[[] for _ in range(batch)]]

    def forward(self, idx, caches, positions, last_only=False):  # SWAXModel.forward's streaming signature
        history = caches[0]
        logits = torch.full((*idx.shape, VOCAB), -1e4)
        for b in range(idx.shape[0]):
            for t in range(idx.shape[1]):
                if positions[b, t] >= 0:  # not left padding
                    history[b].append(int(idx[b, t]))
                logits[b, t] = self.next_token_logits(bytes(history[b]).decode())
        return logits[:, -1:] if last_only else logits

    def next_token_logits(self, text: str) -> torch.Tensor:
        raise NotImplementedError
