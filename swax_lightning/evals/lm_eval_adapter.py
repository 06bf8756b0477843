"""lm-evaluation-harness adapter: a swax-lightning model as an `lm_eval` LM, registered under the name "swax".

    loglikelihood          sum of log p(continuation | context) and whether it is the greedy continuation
    loglikelihood_rolling  log p(document), the document streamed in chunks (any length, bounded memory)
    generate_until         generation that stops as soon as a stop string appears, greedy or sampled

From lm-eval's own command line (lm-eval 0.4.13 finds models only in its registry; it reads no entry points, so the
"swax" name is registered by lm_eval_plugin/sitecustomize.py, which Python imports at start-up when its folder is on
PYTHONPATH):

    PYTHONPATH=$PWD:$PWD/swax_lightning/evals/lm_eval_plugin lm_eval --model swax \\
        --model_args ckpt_path=runs/tiny/w64/checkpoints/last.ckpt,window=2048 --tasks arc_easy --batch_size 8

Model arguments: ckpt_path (a single-file checkpoint of `main.py fit`; the tokenizer comes with it), window and n_sink
(evaluation overrides), convert_full_attention (full-attention layers run as SWA(window, n_sink)) and
window_includes_sinks (the window's convention: swax_lightning.model.inference.override_attention), chunk_len (prefill
chunk), max_gen_toks (default 256), seed (sampling); the harness's own batch_size ("auto" means 8 here),
max_batch_size and device (cuda falls back to the CPU when there is no GPU) are accepted.

Decisions, following the harness's reference HF model where it defines the behaviour:
- Context and continuation: trailing spaces of the context move to the continuation, the pair is tokenized whole (after
  the tokenizer's start-of-sequence ids, e.g. a Llama-family BOS: tokenizer.encode_prompt) and split after the
  context's tokens; an empty context becomes the start-of-sequence ids, or the end-of-text token for a tokenizer
  without them. Generation stops at any of the tokenizer's end ids (stop_ids). An empty continuation scores
  (0.0, True); an empty document has log-likelihood 0.0.
- generate_until: the token budget is max_gen_toks or one of its aliases (max_new_tokens, max_tokens,
  max_completion_tokens), read by the harness's own normalize_gen_kwargs in its order of precedence; `until` strings
  are checked after every new token and generation stops there (the text is cut before the first stop string);
  sampled when do_sample is true, or (the harness's rule) when it is absent and the temperature is above 0, else
  greedy (a sampled request without a temperature uses 1.0; top_k, top_p honoured), with a generator seeded by `seed`
  and the batch's number (reproducible run to run).
- Batching: requests are sorted longest first and run batch_size at a time, left-padded (each sequence keeps its own
  positions, so a batched result equals the one-at-a-time result); generation requests are batched only with
  requests of the same settings. Log-likelihoods are summed chunk by chunk (chunk_len tokens), with the state
  carried, so memory does not grow with the document.
- Metrics keep the harness's "metric,filter" keys, so two filters of one task never collapse into one number; each
  comes with its document count and a 95% interval (metric_cell).
- Runs default to offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): point include_path at task YAML files with
  `dataset_path: json` and local data, or have the datasets in the HF cache.
"""
from __future__ import annotations

import os
import warnings

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs
from tqdm import tqdm

from swax_lightning.evals.reports import Z95, wilson_interval
from swax_lightning.evals.scoring import token_scores
from swax_lightning.model.inference import generate, left_pad, override_attention

AUTO_BATCH_SIZE = 8
BOOTSTRAP_ITERS = 1000  # the harness's resamples for the standard error of corpus-level metrics


def _batch_size(value) -> int:
    if value is None or str(value).startswith("auto"):
        return AUTO_BATCH_SIZE
    if int(value) < 1:
        raise ValueError(f"batch_size must be >= 1 (got {value})")
    return int(value)


def _device(requested: str | None) -> str:
    """The harness's device, or the best one here: its command line asks for cuda by default, even without a GPU."""
    if requested and not (requested.startswith("cuda") and not torch.cuda.is_available()):
        return requested
    if requested:
        warnings.warn(f"SwaxLM: device {requested!r} is not available here; running on the CPU", stacklevel=3)
    return "cuda" if torch.cuda.is_available() else "cpu"


@register_model("swax")
class SwaxLM(LM):
    def __init__(self, model=None, tokenizer=None, ckpt_path: str | None = None, chunk_len: int = 2048,
                 batch_size: int | str | None = 1, max_batch_size: int | None = None, device: str | None = None,
                 window: int | None = None, n_sink: int | None = None, convert_full_attention: bool = False,
                 window_includes_sinks: bool = False, max_gen_toks: int = 256, seed: int = 0):
        super().__init__()
        if model is None:
            if not ckpt_path:
                raise ValueError("SwaxLM needs ckpt_path=<checkpoint of main.py fit> (or a model and a tokenizer)")
            from swax_lightning.training.checkpoints import load_model

            model, tokenizer = load_model(ckpt_path, _device(device))
        elif tokenizer is None:
            raise ValueError("SwaxLM: a model needs its tokenizer")
        override_attention(model, window, n_sink, convert_full_attention, window_includes_sinks)
        self.model, self.tokenizer, self.chunk_len = model.eval(), tokenizer, int(chunk_len)
        self.batch = min(_batch_size(batch_size), int(max_batch_size or 1 << 30))
        self.max_gen_toks, self.seed, self.batches_generated = int(max_gen_toks), int(seed), 0

    # ---- log-likelihoods --------------------------------------------------------------------------------------
    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if not context:
            return self._start(), self.tokenizer.encode(continuation)
        whole, head = self.tokenizer.encode_prompt(context + continuation), self.tokenizer.encode_prompt(context)
        return head, whole[len(head):]

    def _start(self) -> list[int]:
        """What an empty context becomes: the start-of-sequence ids, or end-of-text when the tokenizer has none."""
        return list(self.tokenizer.bos_ids) or [self.tokenizer.eos_id]

    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation), greedy?) for token pairs, in one left-padded batch (scoring.token_scores:
        chunk by chunk, so documents of any length fit)."""
        device = self.model.embed.weight.device
        idx, positions = left_pad([(ctx + cont)[:-1] for ctx, cont in pairs], device)
        targets, _ = left_pad([(ctx + cont)[1:] for ctx, cont in pairs], device)
        scored = torch.zeros_like(targets, dtype=torch.bool)  # the continuation's positions: the last len(cont)
        for b, (_, cont) in enumerate(pairs):
            scored[b, -len(cont):] = True
        logprob, greedy = token_scores(self.model, idx, positions, targets, self.chunk_len, scored)
        total, all_greedy = logprob.sum(1), greedy.all(1)
        return [(float(t), bool(g)) for t, g in zip(total, all_greedy)]

    def _batched(self, pairs: list, disable_tqdm: bool, desc: str) -> list[tuple[float, bool]]:
        results: list = [(0.0, True)] * len(pairs)  # an empty continuation: nothing to score, trivially greedy
        order = sorted((i for i, (_, cont) in enumerate(pairs) if cont), key=lambda i: -sum(map(len, pairs[i])))
        for start in tqdm(range(0, len(order), self.batch), desc=desc, disable=disable_tqdm):
            chunk = order[start:start + self.batch]
            for i, result in zip(chunk, self._score([pairs[i] for i in chunk])):
                results[i] = result
        return results

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        pairs = [self._encode_pair(*request.args) for request in requests]
        return self._batched(pairs, disable_tqdm, "loglikelihood")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        pairs = [(self._start(), self.tokenizer.encode(request.args[0])) for request in requests]
        return [total for total, _ in self._batched(pairs, disable_tqdm, "loglikelihood_rolling")]

    # ---- generation -------------------------------------------------------------------------------------------
    def _decoding(self, kwargs: dict) -> tuple[list[str], int, dict]:
        """(stop strings, token budget, sampling settings) from the harness's generation kwargs."""
        kwargs = dict(kwargs)
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else [s for s in until if s]
        normalized = normalize_gen_kwargs(kwargs, self.max_gen_toks)  # the harness's own reading, as its HF model
        budget, sampled = normalized["max_gen_toks"], bool(normalized["do_sample"])
        temperature = float(kwargs.pop("temperature", 1.0 if sampled else 0.0))
        settings = {"temperature": temperature if sampled else 0.0,
                    "top_k": int(kwargs.pop("top_k", 0) or 0), "top_p": float(kwargs.pop("top_p", 1.0) or 1.0)}
        return until, budget, settings

    def _generate_batch(self, contexts: list[str], until: list[str], budget: int, settings: dict) -> list[str]:
        prompts = [self.tokenizer.encode_prompt(c) or self._start() for c in contexts]

        def stopped(_, tokens: list[int]) -> bool:
            text = self.tokenizer.decode(tokens)
            return any(s in text for s in until)

        self.batches_generated += 1  # a new seed per batch: repeated prompts get different samples, reproducibly
        outputs = generate(self.model, prompts, budget, stop_tokens=self.tokenizer.stop_ids, chunk_len=self.chunk_len,
                           seed=self.seed + self.batches_generated, should_stop=stopped if until else None,
                           **settings)
        texts = [self.tokenizer.decode(o) for o in outputs]
        return [text[:min((text.index(s) for s in until if s in text), default=len(text))] for text in texts]

    def generate_until(self, requests, disable_tqdm: bool = False):
        groups: dict = {}
        for i, request in enumerate(requests):
            context, kwargs = request.args
            until, budget, settings = self._decoding(kwargs)
            key = (tuple(until), budget, tuple(sorted(settings.items())))
            groups.setdefault(key, []).append((i, context))
        results: list = [None] * len(requests)
        progress = tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm)
        for (until, budget, settings), items in groups.items():
            items.sort(key=lambda item: -len(item[1]))
            for start in range(0, len(items), self.batch):
                chunk = items[start:start + self.batch]
                texts = self._generate_batch([c for _, c in chunk], list(until), budget, dict(settings))
                for (i, _), text in zip(chunk, texts):
                    results[i] = text
                progress.update(len(chunk))
        progress.close()
        return results


def run_lm_eval(model, tokenizer, tasks: list[str], include_path: str | None = None, limit: int | None = None,
                chunk_len: int = 2048) -> dict:
    """Run harness tasks on the model; returns {task: {"metric,filter": cell}} (cells: see metric_cell)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or any(t not in manager.all_tasks for t in tasks):  # indexing the harness's tasks takes ~20 s
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {unknown}: not in the harness nor in include_path={include_path}")
    out = simple_evaluate(model=SwaxLM(model, tokenizer, chunk_len=chunk_len), tasks=tasks, task_manager=manager,
                          limit=limit, log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS, confirm_run_unsafe_code=True)
    cells = {}
    for task, metrics in out["results"].items():
        samples = out.get("samples", {}).get(task, [])
        cells[task] = {}
        for key, value in metrics.items():
            metric, _, kind = key.partition(",")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or metric.endswith("_stderr"):
                continue
            per_doc = [s[metric] for s in samples if s.get("filter") == kind and metric in s]
            cells[task][key] = metric_cell(value, per_doc, metrics.get(f"{metric}_stderr,{kind}"))
    return cells


def metric_cell(value: float, per_doc: list, stderr) -> dict:
    """{"value", "n", "ci95", "interval"} of one harness metric. A mean of 0/1 scores per document (accuracy,
    exact match, pass@1) gets the 95% Wilson interval of the share, as every other cell of the reports; any other
    metric the normal interval value +- 1.96 x the harness's standard error (closed form for means, its bootstrap
    for corpus-level metrics such as perplexity); none when the harness gives no standard error."""
    n = len(per_doc)
    if n and all(isinstance(v, (int, float)) and v in (0, 1) for v in per_doc):
        low, high = wilson_interval(100 * value, n)
        return {"value": value, "n": n, "ci95": [round(low / 100, 4), round(high / 100, 4)], "interval": "wilson"}
    if isinstance(stderr, (int, float)) and not isinstance(stderr, bool):
        return {"value": value, "n": n, "ci95": [value - Z95 * stderr, value + Z95 * stderr],
                "interval": "normal (harness stderr)"}
    return {"value": value, "n": n, "ci95": None, "interval": None}
