"""Export a Lightning checkpoint to a Hugging Face folder that transformers (and the tools built on it) can load.

    python -m swax_lightning export --ckpt_path runs/tiny/w64/checkpoints/last.ckpt --out exports/tiny-w64
    swax export --ckpt_path last.ckpt --out exports/tiny-w64      # the same, as a console script

The folder holds config.json, model.safetensors, generation_config.json, the tokenizer (tokenizer.json +
tokenizer_config.json), modeling_swax.py (the adapter, swax_lightning/model/hf_model.py) and a model card README.md.
Load it with

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)   # swax_lightning must be installed
    AutoTokenizer.from_pretrained(folder, trust_remote_code=True)         # it reads config.json, which names code

Decisions:
- The model is rebuilt exactly as `swax_lightning.commands.generate` rebuilds it (architecture from the checkpoint's
  hyperparameters, weights checked to fit), then written through transformers' own save_pretrained, so the file
  layout is whatever the installed transformers expects.
- The byte tokenizer has no file: it is written as an equivalent tokenizer.json (byte b -> id b, end-of-text 256,
  byte-level decoding), so every HF-based tool tokenizes exactly as training did.
- The model card is filled from the checkpoint (architecture, data, optimizer, step) and from the run's results
  (runs/<experiment>/<arm>/eval/results.json beside the checkpoint folder) only when they evaluated this very
  checkpoint: results.json records the sha256 of the checkpoint it evaluated.
- Nothing half-written: the folder is assembled under a temporary name and renamed into place; an existing `out` is
  refused unless overwrite=True, and then replaced only once the new folder is complete.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from jsonargparse import CLI

from swax_lightning.core.atomic import written_atomically
from swax_lightning.core.errors import usage_errors_reported
from swax_lightning.data.tokenizer import ByteTokenizer
from swax_lightning.evals.reports import markdown
from swax_lightning.model import hf_model
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.checkpoints import model_from_checkpoint, read_checkpoint
from swax_lightning.training.runs import same_checkpoint

AUTO_MAP = {"AutoConfig": "modeling_swax.SwaxConfig", "AutoModelForCausalLM": "modeling_swax.SwaxForCausalLM"}


def export(ckpt_path: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write the Hugging Face folder of a checkpoint; returns its path."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"export folder {out} already exists and is not empty: choose another --out or pass "
                              f"--overwrite true")
    checkpoint = read_checkpoint(ckpt_path)
    model, tokenizer = model_from_checkpoint(checkpoint, ckpt_path)
    with written_atomically(out) as tmp:
        save_model(model, tokenizer.eos_id, tmp)
        save_tokenizer(tokenizer, tmp)
        (tmp / "README.md").write_text(model_card(checkpoint, Path(ckpt_path), out.name))
    return out


def save_model(model: SWAXModel, eos_id: int, folder: Path) -> None:
    """config.json (with auto_map), safetensors weights, generation_config.json and modeling_swax.py."""
    config = hf_model.SwaxConfig(**asdict(model.cfg), eos_token_id=eos_id, auto_map=AUTO_MAP)
    hf = hf_model.SwaxForCausalLM(config)
    hf.model.load_state_dict(model.state_dict())
    hf.generation_config.eos_token_id = eos_id
    hf.save_pretrained(folder)
    shutil.copyfile(hf_model.__file__, folder / "modeling_swax.py")
    for file in folder.iterdir():  # safetensors writes through a private temporary file (mode 0600)
        file.chmod(0o644)


def save_tokenizer(tokenizer, folder: Path) -> None:
    """tokenizer.json (copied, or built for the byte tokenizer) and the tokenizer_config.json AutoTokenizer reads."""
    if isinstance(tokenizer, ByteTokenizer):
        byte_tokenizer_json().save(str(folder / "tokenizer.json"))
    else:
        shutil.copyfile(tokenizer.name, folder / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tokenizer.eos_token,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def byte_tokenizer_json():
    """A HF `tokenizers` Tokenizer equal to ByteTokenizer: byte b -> id b, "<|endoftext|>" -> 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in _byte_stand_ins().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([ByteTokenizer.eos_token])
    return tok


def _byte_stand_ins() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer applies to its input: printable
    Latin-1 bytes stand for themselves, the others for the characters from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    others = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(others)) for b in range(256)}


def evaluation_section(ckpt_path: Path) -> str:
    """The model card's results: those of <run>/eval/results.json only if they evaluated this very checkpoint (its
    recorded sha256), never another checkpoint's."""
    results = ckpt_path.parent.parent / "eval" / "results.json"
    found = json.loads(results.read_text()) if results.is_file() else None
    if found is None or not same_checkpoint(found.get("settings", {}).get("checkpoint"), ckpt_path):
        why = "is not there" if found is None else "evaluated another checkpoint"
        return (f"## Evaluation results\n\nNone for this checkpoint (`{results}` {why}): run `main.py test "
                f"--ckpt_path {ckpt_path}` before exporting.")
    return markdown(found).replace("# Evaluation results", "## Evaluation results")


def model_card(checkpoint: dict, ckpt_path: Path, name: str) -> str:
    """README.md: what the model is, how it was trained (from the checkpoint) and how it scored (if evaluated)."""
    hparams = checkpoint.get("hyper_parameters", {})
    arch, optim = hparams.get("arch", {}), hparams.get("optim", {})
    data = checkpoint.get("datamodule_hyper_parameters", {})
    rows = [("layers (pattern)", f"{arch.get('n_layers')} ({arch.get('pattern')}: S = sliding-window attention, "
                                 f"X = mLSTM, A = full attention, D = Gated DeltaNet)"),
            ("width", arch.get("d_model")), ("vocabulary", arch.get("vocab_size")),
            ("attention window / sinks", f"{arch.get('window')} / {arch.get('n_sink')}"),
            ("training data", f"{data.get('source')} (tokenizer {data.get('tokenizer')}, "
                              f"seq_len {data.get('seq_len')})"),
            ("optimizer", f"AdamW, lr {optim.get('lr')}, warmup {optim.get('warmup_steps')}, weight decay "
                          f"{optim.get('weight_decay')}"),
            ("optimizer steps", checkpoint.get("global_step")), ("exported from", f"`{ckpt_path}`")]
    evaluation = evaluation_section(ckpt_path)
    return "\n".join([
        "---", "library_name: transformers", "license: apache-2.0", "pipeline_tag: text-generation",
        "tags: [swax, sliding-window-attention, xlstm, mlstm]", "---", "",
        f"# {name}", "",
        "A hybrid sliding-window attention + mLSTM language model trained with "
        "[swax-lightning](https://arxiv.org/abs/2509.24552) (SWAX, *Short window attention enables long-term "
        "memorization*).", "",
        "| setting | value |", "|---|---|", *[f"| {key} | {value} |" for key, value in rows], "",
        f"Full architecture: `{json.dumps(arch)}`", "",
        "## Usage", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer  # needs `pip install swax-lightning`",
        f'model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)',
        'ids = tokenizer("def main(", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=64)[0]))",
        "```", "",
        "transformers re-runs the whole forward per generated token; for long contexts use the constant-memory "
        "streaming decoder of swax-lightning (`swax generate`).", "",
        evaluation, "",
        "## Citation", "",
        "Short window attention enables long-term memorization, arXiv:2509.24552.", ""])


def export_checkpoint(ckpt_path: str, out: str, overwrite: bool = False) -> Path:
    """Export a checkpoint to a Hugging Face folder.

    Args:
        ckpt_path: Checkpoint file written by `main.py fit` (a single file; consolidate a distributed one first).
        out: The folder to write (config.json, model.safetensors, tokenizer, modeling_swax.py, README.md).
        overwrite: Replace `out` if it already exists.
    """
    folder = export(ckpt_path, out, overwrite)
    print(f"exported {ckpt_path} -> {folder} (load with AutoModelForCausalLM.from_pretrained(folder, "
          f"trust_remote_code=True))")
    return folder


def main(argv: list[str] | None = None) -> None:
    """The `swax export` console script: errors in what was asked are one line (exit code 2)."""
    with usage_errors_reported(FileNotFoundError, FileExistsError):
        CLI(export_checkpoint, as_positional=False, args=argv)


if __name__ == "__main__":
    main()
