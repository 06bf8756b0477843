"""Export to Hugging Face: a checkpoint trained a few steps, exported with the command a user types, loads back through
transformers with the same logits, tokenizer, greedy continuation and a model card; skipped without transformers."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import lightning as L  # noqa: E402

from swax_lightning.data.datamodule import TextDataModule  # noqa: E402
from swax_lightning.model.inference import continue_texts  # noqa: E402
from swax_lightning.training.checkpoints import load_model  # noqa: E402
from swax_lightning.training.module import LanguageModule  # noqa: E402
from swax_lightning.training.runs import checkpoint_identity  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARCH = {"d_model": 32, "n_layers": 2, "n_heads": 2, "mlstm_heads": 2, "window": 8, "chunk_size": 8}
NIAH = {"settings": {"window": 8},  # as evals/reports.py writes it: every cell a mean, its interval and its count
        "niah": {"scores": {"niah_single_1": {"4096": {"mean": 42.0, "n": 40, "ci95": [28.0, 57.6]}}}}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """runs/exp/arm/checkpoints/last.ckpt after 3 optimizer steps, with eval/results.json beside it."""
    root = tmp_path_factory.mktemp("export")
    (root / "src").mkdir()
    for i in range(30):
        (root / "src" / f"doc{i}.txt").write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
    data = TextDataModule(source=str(root / "src"), data_dir=str(root / "data"), seq_len=31, batch_size=4,
                          val_fraction=0.2, test_fraction=0.2)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(LanguageModule(arch=ARCH, optim={"warmup_steps": 0, "lr": 1e-2}), datamodule=data)
    run_dir = root / "runs" / "exp" / "arm"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    (run_dir / "eval").mkdir()
    evaluated = {"settings": NIAH["settings"] | {"checkpoint": checkpoint_identity(ckpt)}}
    (run_dir / "eval" / "results.json").write_text(json.dumps(NIAH | evaluated))
    return ckpt


@pytest.fixture(scope="module")
def exported(run):
    out = run.parents[3] / "hf" / "swax-tiny"
    subprocess.run([sys.executable, "-m", "swax_lightning", "export", "--ckpt_path", str(run), "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    return out


@pytest.mark.parametrize("route", ["trust_remote_code", "registered"])
def test_logits_through_transformers_equal_the_checkpoints(run, exported, route):
    if route == "registered":
        from swax_lightning.model.hf_model import register

        register()
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=(route != "registered"))
    model, _ = load_model(run)
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = model(ids), hf.eval()(input_ids=ids).logits
    assert got.dtype == torch.float32 and type(hf).__name__ == "SwaxForCausalLM"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(expected, transformers.AutoModelForCausalLM.from_config(
        hf.config, trust_remote_code=True).eval()(input_ids=ids).logits)  # the weights are the trained ones


def test_tokenizer_through_transformers_equals_training_tokenizer(run, exported):
    _, tokenizer = load_model(run)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported, trust_remote_code=True)
    text = "def main(x):\n    return 'héllo wörld'  # 日本\n"
    assert hf_tokenizer(text).input_ids == tokenizer.encode(text)
    assert hf_tokenizer.eos_token_id == tokenizer.eos_id and hf_tokenizer.decode(tokenizer.encode(text)) == text


def test_generate_through_transformers_continues_as_the_streaming_decoder(run, exported):
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported, trust_remote_code=True)
    model, tokenizer = load_model(run)
    prompt = "def f3(x):\n    return"
    ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
    out = hf.generate(ids, max_new_tokens=12, do_sample=False)
    expected = continue_texts(model, tokenizer, [prompt], 12)[0]
    assert len(expected) >= 6 and hf_tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == expected


def test_model_card_reports_the_run(exported):
    card = (exported / "README.md").read_text()
    assert "library_name: transformers" in card and "| attention window / sinks | 8 / 0 |" in card
    assert "| optimizer steps | 3 |" in card
    assert "| niah_single_1 | 42.0 [28, 58] n=40 |" in card  # from runs/exp/arm/eval/results.json
    assert {"config.json", "model.safetensors", "tokenizer.json", "modeling_swax.py"} <= \
        {p.name for p in exported.iterdir()}


def test_the_documented_loading_lines_ask_nothing_and_files_are_readable_by_all(exported):
    """The docstring's two lines run with no prompt (stdin closed: a y/N prompt would end in an error or a warning),
    and every exported file is world-readable (safetensors wrote model.safetensors with mode 0600)."""
    code = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"AutoModelForCausalLM.from_pretrained({str(exported)!r}, trust_remote_code=True)\n"
            f"print(AutoTokenizer.from_pretrained({str(exported)!r}, trust_remote_code=True)('def').input_ids)")
    run = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert run.returncode == 0 and "[100, 101, 102]" in run.stdout, run.stderr[-2000:]
    assert "custom code" not in run.stderr and "[y/N]" not in run.stdout + run.stderr
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in exported.iterdir())


def test_a_model_card_never_shows_another_checkpoints_results(run, tmp_path):
    """results.json names the checkpoint it evaluated (sha256): exporting another checkpoint of the same run (here one
    step less trained) gives a card without those results."""
    from swax_lightning.commands.export import export

    other = run.with_name("step-2.ckpt")
    checkpoint = torch.load(run, weights_only=False)
    checkpoint["global_step"] = 2
    checkpoint["state_dict"] = {k: v + 0.01 for k, v in checkpoint["state_dict"].items()}
    torch.save(checkpoint, other)
    card = (export(other, tmp_path / "hf") / "README.md").read_text()
    assert "niah_single_1" not in card and "evaluated another checkpoint" in card


def test_existing_folder_is_not_replaced_without_overwrite(run, exported):
    from swax_lightning.commands.export import export

    before = (exported / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="swax-tiny"):
        export(run, exported)
    assert (exported / "model.safetensors").read_bytes() == before
    export(run, exported, overwrite=True)
    assert sorted(p.name for p in exported.parent.iterdir()) == ["swax-tiny"]  # no temporary folder left


def _fresh_checkpoint(path, arch, tokenizer="byte"):
    """A checkpoint of a freshly initialised model, as `main.py fit` would lay it out."""
    module = LanguageModule(arch=arch)
    module.configure_model()
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict(),
                "datamodule_hyper_parameters": {"tokenizer": tokenizer}}, path)
    return module


def test_tied_embeddings_round_trip(tmp_path):
    """A model whose head is its embedding: saved once, re-tied on load, same logits."""
    from swax_lightning.commands.export import export

    module = _fresh_checkpoint(tmp_path / "tied.ckpt", ARCH | {"tie_embeddings": True})
    hf = transformers.AutoModelForCausalLM.from_pretrained(export(tmp_path / "tied.ckpt", tmp_path / "hf"),
                                                           trust_remote_code=True)
    assert hf.model.lm_head.weight is hf.model.embed.weight
    ids = torch.arange(30).unsqueeze(0)
    torch.testing.assert_close(hf.eval()(input_ids=ids).logits, module.model.eval()(ids), atol=1e-5, rtol=0)


def test_bpe_tokenizer_json_is_exported_as_trained(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from swax_lightning.commands.export import export
    from swax_lightning.data.tokenizer import HFTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([f"def f{i}(x):\n    return x * {i}\n" for i in range(200)],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    _fresh_checkpoint(tmp_path / "bpe.ckpt", ARCH | {"vocab_size": ours.vocab_size}, str(tmp_path / "tokenizer.json"))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(export(tmp_path / "bpe.ckpt", tmp_path / "hf"),
                                                              trust_remote_code=True)
    text = "def f7(x):\n    return x * 7\n"
    assert hf_tokenizer(text).input_ids == ours.encode(text) and len(ours.encode(text)) < len(text)
    assert hf_tokenizer.eos_token_id == ours.eos_id
