"""`swax <verb> ...`: every command of the framework behind one name, as litgpt does (`python -m swax_lightning
<verb>` is the same without the console script; `python main.py fit|validate|test|predict` stays LightningCLI's).

Decisions:
- A verb is one row of VERBS: the module whose `main(argv)` runs it, and one line of help. The module is imported
  only when its verb runs, so `swax --help` and a light verb never load Lightning, transformers or lm-eval.
- fit / validate / test / predict go to LightningCLI unchanged (commands/cli.py), with every flag it takes.
- Every command's `main` takes the arguments after the verb and reports a usage error in one line, exit code 2.
"""
from __future__ import annotations

import importlib
import sys

LIGHTNING_VERBS = ("fit", "validate", "test", "predict")
VERBS = {
    **{verb: ("swax_lightning.commands.cli", f"LightningCLI's {verb} (python main.py {verb} ...)")
       for verb in LIGHTNING_VERBS},
    "generate": ("swax_lightning.commands.generate", "continue prompts from a checkpoint in constant memory"),
    "export": ("swax_lightning.commands.export", "write a checkpoint as a Hugging Face folder"),
    "import": ("swax_lightning.pretrained.hf_import", "import a pretrained Hugging Face folder or GGUF file"),
    "retrofit": ("swax_lightning.pretrained.experiment", "the companion comparison: SWA with sinks vs retrofits"),
    "study": ("swax_lightning.study.sweep", "the window study: every arm and seed, then the table and plots"),
    "memory": ("swax_lightning.commands.memory", "GPU memory per device of a run config"),
    "compare": ("swax_lightning.evals.compare", "evaluation results of several runs side by side"),
    "regenerate": ("swax_lightning.evals.regenerate", "rebuild one evaluation sample's prompt from results.json"),
    "choice-tasks": ("swax_lightning.evals.choice", "write the generated multiple-choice tasks for lm-eval"),
    "consolidate": ("swax_lightning.training.checkpoints", "make one file of a distributed checkpoint"),
    "tokenizer": ("swax_lightning.data.train_tokenizer", "train a byte-level BPE tokenizer on a text folder"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    rows = "\n".join(f"  {verb:<{width}}  {text}" for verb, (_, text) in VERBS.items())
    return f"usage: swax <verb> [options]   (swax <verb> --help for a verb's options)\n\nverbs:\n{rows}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"error: swax has no verb {verb!r}; verbs: {', '.join(VERBS)}", file=sys.stderr)
        raise SystemExit(2)
    module = importlib.import_module(VERBS[verb][0])
    sys.argv = [f"swax {verb}", *rest]  # a parser that reads sys.argv names the verb in its usage line
    module.main([verb, *rest] if verb in LIGHTNING_VERBS else rest)
