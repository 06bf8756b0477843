"""lm-evaluation-harness adapter: a swax-lightning model as an `lm_eval` LM, registered under the name "swax".

    loglikelihood          sum of log p(continuation | context) and whether it is the greedy continuation
    loglikelihood_rolling  log p(text), the text streamed in chunks (any length, bounded memory)
    generate_until         greedy generation until a stop string or max_gen_toks

Decisions:
- Every call goes through the streaming inference (chunked prefill with the state carried), so long documents work
  at constant memory; requests run one at a time (a small model on a CPU gains little from batching).
- Context and continuation are tokenized separately and concatenated, so the continuation's tokens are exactly the
  ones scored; an empty context becomes the end-of-text token.
- The harness and its `datasets` are an optional dependency group (requirements-eval.txt); runs default to offline
  (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) since no hub is reachable here: point `include_path` at task YAML files with
  `dataset_path: json` and local data, or have the datasets in the HF cache.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from swax_lightning.inference import generate, prefill


@register_model("swax")
class SwaxLM(LM):
    def __init__(self, model, tokenizer, chunk_len: int = 2048):
        super().__init__()
        self.model, self.tokenizer, self.chunk_len = model.eval(), tokenizer, chunk_len

    @torch.no_grad()
    def _logprobs(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities [T-1, V] of each next token, the next tokens ids[1:]), streamed."""
        device = self.model.embed.weight.device
        idx = torch.tensor([ids[:-1]], device=device)
        caches = self.model.new_caches(1, dtype=self.model.embed.weight.dtype)
        logits = prefill(self.model, idx, torch.arange(idx.shape[1], device=device)[None], caches, self.chunk_len,
                         return_all=True)[0].float()
        return F.log_softmax(logits, -1), torch.tensor(ids[1:], device=device)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        results = []
        for request in tqdm(requests, desc="loglikelihood", disable=disable_tqdm):
            context, continuation = request.args
            ctx = self.tokenizer.encode(context) if context else [self.tokenizer.eos_id]
            cont = self.tokenizer.encode(continuation)
            logprobs, targets = self._logprobs(ctx + cont)
            logprobs, targets = logprobs[-len(cont):], targets[-len(cont):]
            total = float(logprobs.gather(-1, targets[:, None]).sum())
            results.append((total, bool((logprobs.argmax(-1) == targets).all())))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        results = []
        for request in tqdm(requests, desc="loglikelihood_rolling", disable=disable_tqdm):
            logprobs, targets = self._logprobs([self.tokenizer.eos_id] + self.tokenizer.encode(request.args[0]))
            results.append(float(logprobs.gather(-1, targets[:, None]).sum()))
        return results

    def generate_until(self, requests, disable_tqdm: bool = False):
        results = []
        for request in tqdm(requests, desc="generate_until", disable=disable_tqdm):
            context, kwargs = request.args
            until = kwargs.get("until", []) or []
            until = [until] if isinstance(until, str) else list(until)
            ids = self.tokenizer.encode(context) or [self.tokenizer.eos_id]
            out = generate(self.model, [ids], kwargs.get("max_gen_toks", 256), stop_tokens=[self.tokenizer.eos_id],
                           chunk_len=self.chunk_len)[0]
            text = self.tokenizer.decode(out)
            cut = min((text.index(s) for s in until if s and s in text), default=len(text))
            results.append(text[:cut])
        return results


def run_lm_eval(model, tokenizer, tasks: list[str], include_path: str | None = None, limit: int | None = None,
                chunk_len: int = 2048) -> dict:
    """Run harness tasks on the model; returns {task: {metric: value}}."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {unknown}: not in the harness nor in include_path={include_path}")
    out = simple_evaluate(model=SwaxLM(model, tokenizer, chunk_len), tasks=tasks, task_manager=manager, limit=limit,
                          log_samples=False, bootstrap_iters=0, confirm_run_unsafe_code=True)
    return {task: {k.split(",")[0]: v for k, v in metrics.items() if isinstance(v, (int, float))}
            for task, metrics in out["results"].items()}
