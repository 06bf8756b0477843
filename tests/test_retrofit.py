"""The LoLCATs-style retrofit (swax_lightning/pretrained/retrofit.py) and the comparison command around it
(retrofit_experiment.py), on a random small Llama imported through swax import (GQA: 4 query heads, 2 key/value
heads), so they run without the real model:

- the converted model keeps every teacher weight that has a counterpart: pattern A is the teacher exactly; students
  start from the teacher's q/k/v/o, key/value heads repeated as transformers' repeat_kv repeats them;
- attention transfer lowers every student's error against its teacher layer on held-out text, and its output-scale
  calibration is the least-squares one;
- LoRA with B = 0 leaves the logits exactly unchanged, and merging keeps what the adapters compute;
- both stages resume exactly from their saved progress;
- the converted checkpoint loads through load_model and runs through the generate command;
- the experiment command as printed: every variant evaluated and reported, a second run skips what finished, a
  removed result is evaluated again, SWA with a window longer than every multiple-choice prompt scores exactly what
  full attention scores, a bad config field is one line; and on the real SmolLM2 (skipped without the package).

Skipped without transformers.
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from swax_lightning.core.errors import InputError  # noqa: E402
from swax_lightning.data.loss_mask import CONTEXT_ONLY, inputs_and_targets  # noqa: E402
from swax_lightning.evals.essay import generated_essay  # noqa: E402
from swax_lightning.model.config import ModelConfig  # noqa: E402
from swax_lightning.model.model import SWAXModel  # noqa: E402
from swax_lightning.pretrained import hf_import, report, retrofit  # noqa: E402
from swax_lightning.pretrained.experiment import Curve, check_variants, read_config, write_converted  # noqa: E402
from swax_lightning.pretrained.lora import LoRALinear, add_lora, merge_lora  # noqa: E402
from swax_lightning.training.checkpoints import load_model  # noqa: E402
from tests.hf_models import make_pretrained  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
T = 64


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """(model, checkpoint) of a random Llama (llama3 RoPE, tied embeddings, 4/2 heads, 2 layers) imported."""
    root = tmp_path_factory.mktemp("teacher")
    make_pretrained(root / "llama", "llama_llama3_tied", seed=2, max_position_embeddings=2048)
    ckpt = hf_import.import_pretrained(root / "llama", root / "import")
    return load_model(ckpt)[0], ckpt


def ids(batch: int = 1, length: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 258, (batch, length), generator=torch.Generator().manual_seed(seed))


TEXT = torch.tensor(list(generated_essay(seed=0).encode()[:100_000]))


def text_blocks(seed: int):
    """Endless blocks [2, T + 1] of byte ids of prose at seeded random places: text gives the teacher's attention
    patterns a student can learn (on random ids a random teacher attends by position only)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(TEXT) - T - 1, (2,), generator=generator)
        yield torch.stack([TEXT[s:s + T + 1] for s in starts.tolist()])


def text_batches(seed: int):
    """(inputs, targets) of text_blocks, as retrofit.token_batches hands the stages their data."""
    for block in text_blocks(seed):
        yield inputs_and_targets(block)


def test_the_retrofits_batches_come_without_context_only_marks():
    # A training split with recall documents stores context-only ids as id + 2^30 (loss_mask.py): the retrofit's
    # reader hands the stages ids inside the vocabulary and ignores the marked targets, as main.py fit does.
    import numpy as np

    from swax_lightning.kernels.ce.chunked import IGNORE_INDEX

    blocks = [np.array([5 + CONTEXT_ONLY, 6 + CONTEXT_ONLY, 7, 8 + CONTEXT_ONLY, 9], dtype=np.int32)] * 4
    inputs, targets = next(retrofit.token_batches(blocks, 2, seed=0, device="cpu"))
    assert inputs.tolist() == [[5, 6, 7, 8]] * 2
    assert targets.tolist() == [[IGNORE_INDEX, 7, IGNORE_INDEX, 9]] * 2


# ---- the converted model --------------------------------------------------------------------------------------------
def test_a_pattern_that_keeps_every_attention_layer_is_the_teacher_exactly(teacher):
    model, _ = teacher
    kept = retrofit.converted_model(model, "A", seed=0)
    with torch.no_grad():
        assert torch.equal(kept(ids()), model(ids()))


@pytest.mark.parametrize("pattern", ["D", "X"])
def test_students_start_from_the_teachers_projections(teacher, pattern):
    """q, k, v of a student equal the teacher's projections of the same input, key/value heads repeated per query
    head as transformers' repeat_kv does (GQA); out_proj is the teacher's o_proj; everything outside the mixers is the
    teacher's; a per-layer pattern keeps the attention layers it names."""
    from transformers.models.llama.modeling_llama import repeat_kv

    model, _ = teacher
    converted = retrofit.converted_model(model, pattern + "A", seed=0)
    student, attention = converted.blocks[0].mixer, model.blocks[0].mixer
    assert student.q_proj.weight.shape == (4 * 16, 64) and attention.k_proj.weight.shape == (2 * 16, 64)
    x = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name in ("k_proj", "v_proj"):
            teacher_heads = getattr(attention, name)(x).view(1, 5, 2, 16).transpose(1, 2)  # [B, kv, T, D]
            expected = repeat_kv(teacher_heads, 2).transpose(1, 2).reshape(1, 5, 64)
            assert torch.equal(getattr(student, name)(x), expected)
        assert torch.equal(student.q_proj(x), attention.q_proj(x))
    assert torch.equal(student.out_proj.weight, attention.out_proj.weight)
    assert converted.blocks[1].kind == "A" and torch.equal(converted.blocks[1].mixer.k_proj.weight,
                                                           model.blocks[1].mixer.k_proj.weight)
    teacher_state = model.state_dict()
    for name, tensor in converted.state_dict().items():
        if not name.startswith("blocks.0.mixer."):
            assert torch.equal(tensor, teacher_state[name]), name
    with torch.no_grad():
        assert converted(ids()).shape == (1, T, model.cfg.vocab_size)


def test_a_teacher_that_is_not_attention_or_a_wrong_letter_is_refused(teacher):
    model, _ = teacher
    with pytest.raises(retrofit.ConfigError, match="letters must be from"):
        retrofit.converted_model(model, "DQ")
    with pytest.raises(retrofit.ConfigError, match="keeps layer 1 as S, but the teacher's layer 1 is A"):
        retrofit.converted_model(model, "DS")
    converted = retrofit.converted_model(model, "D")
    with pytest.raises(retrofit.ConfigError, match="must be an attention model"):
        retrofit.converted_model(converted, "D")


@pytest.fixture(scope="module")
def gemma_teacher(tmp_path_factory):
    """A random Gemma 3 (a local layer of 16 keys with its own RoPE base, then a global layer) imported."""
    root = tmp_path_factory.mktemp("gemma_teacher")
    make_pretrained(root / "gemma", "gemma3_local_global", seed=3)
    return load_model(hf_import.import_pretrained(root / "gemma", root / "import"))[0]


def test_a_gemma_student_converts_the_global_layer_and_keeps_the_local_one(gemma_teacher):
    """SL: the local layer kept, the global one a LoLCATs student, which on a sequence of at most two of its windows
    sees every key with softmax: the converted model is then the teacher exactly. An L student in place of the local
    layer (it would rotate with the global RoPE base) or a kept letter of the wrong kind is refused."""
    model = gemma_teacher
    converted = retrofit.converted_model(model, "SL", seed=0)
    assert [block.kind for block in converted.blocks] == ["S", "L"] and retrofit.student_layers(converted) == [1]
    with torch.no_grad():
        torch.testing.assert_close(converted(ids(length=48)), model(ids(length=48)), atol=1e-5, rtol=0)
        assert not torch.allclose(retrofit.converted_model(model, "SD", seed=0)(ids(length=48)), model(ids(length=48)),
                                  atol=1e-2)  # a D student is not the teacher: the comparison above can fail
    with pytest.raises(retrofit.ConfigError, match="local layer 0 an L layer"):
        retrofit.converted_model(model, "LA")
    with pytest.raises(retrofit.ConfigError, match="keeps layer 0 as A"):
        retrofit.converted_model(model, "AL")


# ---- window + linear students (G, M) --------------------------------------------------------------------------------
@pytest.mark.parametrize("letter", ["G", "M"])
@pytest.mark.parametrize("chunks", [[1] * 23, [5, 1, 9, 8], [23]])
def test_a_window_plus_linear_layer_streams_as_its_full_forward(letter, chunks):
    """Beyond its window (8), GQA (4 query heads on 2), in odd chunks: the bounded caches give the full forward."""
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, pattern=letter + "A",
                      lolcats_window=8, chunk_size=8)
    model = SWAXModel(cfg).double().eval()
    idx = torch.randint(0, 50, (2, sum(chunks)), generator=torch.Generator().manual_seed(0))
    caches, outs, t = model.new_caches(2, torch.float64), [], 0
    with torch.no_grad():
        full = model(idx)
        for c in chunks:
            outs.append(model(idx[:, t:t + c], caches, torch.arange(t, t + c).repeat(2, 1)))
            t += c
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-10, rtol=0)
    assert caches[0].local.k.shape[1] <= 8  # the window's cache holds the window, not the context


@pytest.mark.parametrize(("letter", "sinks"), [("G", 4), ("M", 4), ("G", 0)])
def test_a_window_plus_linear_student_whose_linear_part_is_silent_is_training_free_swa(teacher, letter, sinks):
    """The window part is the teacher's attention on W recent keys and the sinks: with the linear part's output at 0
    the converted model is the training-free variant SWA(W, s) exactly; with it on, it is not."""
    model, _ = teacher
    converted = retrofit.converted_model(model, letter, seed=0, lolcats_window=16, window_sinks=sinks)
    swa = retrofit.converted_model(model, "A")
    swa.convert_full_attention(16, sinks)
    with torch.no_grad():
        assert not torch.allclose(converted(ids()), swa(ids()), atol=1e-3)
        for block in converted.blocks:
            block.mixer.linear.norm.weight.zero_()
        torch.testing.assert_close(converted(ids()), swa(ids()), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("letter", "new"), [("G", {"beta_proj", "decay_proj", "A_log", "dt_bias", "gate", "norm"}),
                                             ("M", {"igate", "fgate", "ogate", "norm"})])
def test_a_window_plus_linear_students_stage_1_trains_its_linear_parts_new_parameters(teacher, letter, new):
    model, _ = teacher
    converted = retrofit.converted_model(model, letter, seed=0)
    trained = {id(p) for p in retrofit.transfer_parameters(converted, "new")}
    trained_names = [name.split(".") for name, p in converted.named_parameters() if id(p) in trained]
    assert {parts[3] for parts in trained_names} == {"linear"}  # blocks.<i>.mixer.linear.<parameter>...
    assert {parts[4] for parts in trained_names} == new
    mixer, attention = converted.blocks[0].mixer, model.blocks[0].mixer
    assert torch.equal(mixer.local.k_proj.weight, attention.k_proj.weight)  # the window: the teacher's, as is
    assert torch.equal(mixer.linear.q_proj.weight, attention.q_proj.weight)


@pytest.mark.parametrize("letter", ["G", "M"])
def test_the_linear_part_is_calibrated_to_what_the_window_leaves(teacher, letter):
    model, _ = teacher
    converted = retrofit.converted_model(model, letter, seed=0, lolcats_window=8)
    inputs, outputs = retrofit.mixer_io(model, next(text_batches(5))[0])
    retrofit.calibrate_output_scale(converted, inputs, outputs)
    with torch.no_grad():
        for i, block in enumerate(converted.blocks):
            window_alone = float(retrofit.relative_mse(block.mixer.local(inputs[i]), outputs[i]))
            both = float(retrofit.relative_mse(block.mixer(inputs[i]), outputs[i]))
            assert both <= window_alone + 1e-6 and window_alone > 0.01


def test_the_curves_first_point_is_the_calibrated_start(teacher, tmp_path):
    model, _ = teacher
    cfg = retrofit.TransferConfig(tokens=2 * 2 * T, lr=1e-2, save_every=4)
    held_out = retrofit.mixer_io(model, next(text_batches(99))[0])
    student, curve = retrofit.converted_model(model, "M", seed=0, lolcats_window=8), {}
    measure = {"m": lambda step, m: curve.__setitem__(step, retrofit.transfer_errors(m, *held_out))}
    retrofit.attention_transfer(model, {"m": student}, text_batches(1), 2, cfg, tmp_path / "p.pt", lambda *_: None,
                                measure=measure)
    calibrated = retrofit.converted_model(model, "M", seed=0, lolcats_window=8)
    retrofit.calibrate_output_scale(calibrated, *retrofit.mixer_io(model, next(text_batches(1))[0]))
    assert curve[0] == retrofit.transfer_errors(calibrated, *held_out)
    assert curve[0] != retrofit.transfer_errors(retrofit.converted_model(model, "M", 0, lolcats_window=8), *held_out)


# ---- stage 1: attention transfer ------------------------------------------------------------------------------------
def test_calibration_is_the_least_squares_scale(teacher):
    model, _ = teacher
    student = retrofit.converted_model(model, "X", seed=0)
    inputs, outputs = retrofit.mixer_io(model, next(text_batches(5))[0])
    with torch.no_grad():
        before = [float(retrofit.relative_mse(student.blocks[i].mixer(inputs[i]), outputs[i])) for i in range(2)]
    assert len(retrofit.calibrate_output_scale(student, inputs, outputs)) == 2
    for i in range(2):
        s = student.blocks[i].mixer(inputs[i]).detach()
        after = float(retrofit.relative_mse(s, outputs[i]))
        cos2 = float((s * outputs[i]).sum() ** 2 / (s.pow(2).sum() * outputs[i].pow(2).sum()))
        assert after == pytest.approx(1 - cos2, abs=1e-4) and after <= min(1.0, before[i]) + 1e-6
        for nudge in (0.9, 1.1):  # a least-squares optimum: no other scale does better
            assert after <= float(retrofit.relative_mse(s * nudge, outputs[i])) + 1e-7


def test_attention_transfer_lowers_the_held_out_layer_error(teacher, tmp_path):
    model, _ = teacher
    students = {"gdn": retrofit.converted_model(model, "D", seed=0), "mlstm": retrofit.converted_model(model, "X")}
    held_out = next(text_batches(99))[0][:1]
    before = {name: retrofit.transfer_errors(s, *retrofit.mixer_io(model, held_out)) for name, s in students.items()}
    cfg = retrofit.TransferConfig(tokens=60 * 2 * T, lr=1e-2)
    losses = retrofit.attention_transfer(model, students, text_batches(0), 60, cfg, tmp_path / "p.pt",
                                         lambda *_: None)
    for name, s in students.items():
        after = retrofit.transfer_errors(s, *retrofit.mixer_io(model, held_out))
        print(f"{name}: held-out relative MSE per layer {before[name]} -> {after}; train {losses[name][0]:.3f} -> "
              f"{losses[name][-1]:.3f}")
        assert all(a < 0.75 * b for a, b in zip(after, before[name]))
        assert not any(p.requires_grad for p in s.parameters())
    assert not (tmp_path / "p.pt").exists()


def run_interrupted(stage, interrupt_at: int):
    """stage(log) run with log raising at step interrupt_at (as a killed process), then run again (a new process:
    stage builds its model afresh each time) to the end: the second run resumes from the saved progress."""
    class Stop(Exception):
        pass

    def stopping(*args):
        if args[-2] == interrupt_at:
            raise Stop

    with pytest.raises(Stop):
        stage(stopping)
    return stage(lambda *_: None)


def assert_same_weights(a, b) -> None:
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name


def test_the_curves_are_measured_at_doublings():
    assert retrofit.measured_steps(32) == [0, 1, 2, 4, 8, 16, 32]
    assert retrofit.measured_steps(6) == [0, 1, 2, 4, 6]
    assert retrofit.measured_steps(1) == [0, 1] and retrofit.measured_steps(0) == [0]


def test_a_damaged_curve_or_result_file_is_named_not_a_traceback(tmp_path):
    curve = tmp_path / "students" / "gdn" / "transfer-curve.json"
    Curve(curve, 2 * T).add(0, [0.5])
    assert Curve(curve, 2 * T).rows("by_layer") == [{"step": 0, "tokens": 0, "by_layer": [0.5]}]
    curve.write_text('{"0": [0.5')  # cut short by hand
    with pytest.raises(InputError, match=re.escape(str(curve))):
        Curve(curve, 2 * T)
    (tmp_path / "students" / "gdn" / "transfer.json").write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="transfer.json"):
        report.students(tmp_path)


def test_attention_transfer_resumes_exactly_with_its_held_out_curve(teacher, tmp_path):
    model, _ = teacher
    cfg = retrofit.TransferConfig(tokens=6 * 2 * T, lr=1e-2, save_every=2)
    held_out = retrofit.mixer_io(model, next(text_batches(99))[0])

    def stage(progress: Path, curve: dict):
        def run(log):
            students = {"gdn": retrofit.converted_model(model, "D")}
            measure = {"gdn": lambda step, m: curve.__setitem__(step, retrofit.transfer_errors(m, *held_out))}
            losses = retrofit.attention_transfer(model, students, text_batches(1), 6, cfg, progress, log,
                                                 measure=measure)
            return losses, students["gdn"]
        return run

    whole_curve, resumed_curve = {}, {}
    expected, whole = stage(tmp_path / "a.pt", whole_curve)(lambda *_: None)
    losses, resumed = run_interrupted(stage(tmp_path / "b.pt", resumed_curve), interrupt_at=5)  # saved after 4
    assert losses == expected
    assert_same_weights(whole, resumed)
    assert list(whole_curve) == [0, 1, 2, 4, 6] and resumed_curve == whole_curve  # the resume measures 4 again
    assert whole_curve[6] == retrofit.transfer_errors(whole, *held_out)  # the last point is the trained model
    assert whole_curve[6] != whole_curve[0]


# ---- stage 2: LoRA ---------------------------------------------------------------------------------------------------
def test_lora_with_zero_b_changes_nothing_and_merging_keeps_what_it_computes(teacher):
    model, _ = teacher
    converted = retrofit.converted_model(model, "X", seed=0)
    with torch.no_grad():
        before = converted(ids())
        names = add_lora(converted.blocks[0].mixer, rank=4, alpha=8, seed=0)
        assert set(names) == {"q_proj", "k_proj", "v_proj", "igate", "fgate", "ogate", "out_proj"}
        assert torch.equal(converted(ids()), before)
        for module in converted.modules():
            if isinstance(module, LoRALinear):
                module.lora_b.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        adapted = converted(ids())
        assert merge_lora(converted) == len(names)
        merged = converted(ids())
    assert (adapted - before).abs().max() > 1e-2  # the adapters do change the model: the test can fail
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    assert not any(isinstance(m, LoRALinear) for m in converted.modules())
    assert converted.state_dict().keys() == retrofit.converted_model(model, "X").state_dict().keys()


def test_lora_finetune_lowers_the_loss_and_resumes_exactly(teacher, tmp_path):
    model, _ = teacher
    cfg = retrofit.LoRAConfig(tokens=6 * 2 * T, rank=4, lr=1e-2, save_every=2)

    def stage(progress: Path):
        def run(log):
            converted = retrofit.converted_model(model, "D")
            return retrofit.lora_finetune(converted, text_batches(2), 6, cfg, progress, log), converted
        return run

    expected, whole = stage(tmp_path / "a.pt")(lambda *_: None)
    losses, resumed = run_interrupted(stage(tmp_path / "b.pt"), interrupt_at=3)  # saved after 2 steps
    assert losses == expected and expected[-1] < expected[0]
    assert_same_weights(whole, resumed)


def test_the_lora_curve_ends_at_the_merged_model(teacher, tmp_path):
    model, _ = teacher
    cfg = retrofit.LoRAConfig(tokens=4 * 2 * T, rank=4, lr=1e-2)
    inputs, targets = next(text_batches(99))
    converted, curve = retrofit.converted_model(model, "D"), {}
    with torch.no_grad():
        start = float(converted(inputs, targets=targets))
    retrofit.lora_finetune(converted, text_batches(2), 4, cfg, tmp_path / "p.pt", lambda *_: None,
                           measure=lambda step, m: curve.__setitem__(step, float(m(inputs, targets=targets))))
    with torch.no_grad():
        merged = float(converted(inputs, targets=targets))
    assert list(curve) == [0, 1, 2, 4] and curve[0] == start and curve[4] < curve[0]
    assert curve[4] == pytest.approx(merged, abs=1e-4)


# ---- the converted checkpoint ---------------------------------------------------------------------------------------
def test_the_converted_checkpoint_loads_and_generates(teacher, tmp_path):
    model, teacher_ckpt = teacher
    converted = retrofit.converted_model(model, "DX", seed=0)
    ckpt = write_converted(converted, teacher_ckpt, tmp_path / "gdn", {"transfer": {"tokens": 0}})
    loaded, tokenizer = load_model(ckpt)
    assert loaded.cfg.layer_kinds == "DX" and tokenizer.fingerprint == load_model(teacher_ckpt)[1].fingerprint
    with torch.no_grad():
        assert torch.equal(loaded(ids()), converted(ids()))
    result = subprocess.run([sys.executable, "-m", "swax_lightning", "generate", "--ckpt_path", str(ckpt), "--prompt",
                             "The grass is", "--max_new_tokens", "5"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "The grass is" in result.stdout, result.stderr[-2000:]
    config = yaml.safe_load((tmp_path / "gdn" / "config.yaml").read_text())
    assert config["model"]["arch"]["pattern"] == "DX"


# ---- the experiment command ------------------------------------------------------------------------------------------
def experiment_config(folder: Path, source: str, **changes) -> Path:
    """A few-step experiment: the smallest budgets and evaluation grid that run every part."""
    settings = {
        "source": source, "out": str(folder / "run"),
        "data": {"source": str(folder / "text"), "seq_len": T, "batch_size": 2, "val_fraction": 0.2,
                 "test_fraction": 0.2},
        "students": {"gdn": {"pattern": "D"}, "mlstm": {"pattern": "X"}},
        "transfer": {"tokens": 4 * 2 * T, "save_every": 2}, "lora": {"tokens": 2 * 2 * T, "save_every": 1},
        "evaluate": {"windows": [16, 1024], "sinks": [4, 0], "choice_items": 3, "suite": {
            "niah": {"tasks": ["niah_single_2"], "lengths": [640], "depths": [0.25, 0.75], "samples": 2,
                     "max_new_tokens": 8},
            "babilong": {"tasks": ["qa1"], "lengths": [0], "samples": 1},
            "perplexity": {"length": 128, "samples": 1}}}}
    for key, value in changes.items():  # a section's fields are merged one level deep; students are replaced
        settings[key] = {**settings[key], **value} if key in ("data", "transfer", "lora", "evaluate") else value
    (folder / "text").mkdir(exist_ok=True)
    for i in range(10):
        (folder / "text" / f"doc{i}.txt").write_text(f"Document {i}. " + "The grass is green. The sky is blue. " * 40)
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def run_experiment(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swax_lightning", "retrofit", "run", str(config), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
def test_the_experiment_command_evaluates_every_variant_and_resumes(tmp_path):
    make_pretrained(tmp_path / "llama", "llama_linear", seed=3, max_position_embeddings=2048)
    config = experiment_config(tmp_path, str(tmp_path / "llama"))
    first = run_experiment(config)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "run"
    names = ["full", "swa16-sink4", "swa1024-sink4", "swa16-sink0", "swa1024-sink0", "retrofit-gdn",
             "retrofit-mlstm"]
    report = (out / "report.md").read_text()
    assert all(f"| {name} |" in report for name in names) and "SWA with sinks over the best retrofit" in report
    assert "| variant | depth 0.25 | depth 0.75 |" in report
    summary = json.loads((out / "summary.json").read_text())
    assert [r["window"] for r in summary["ratios"]] == [16, 1024]
    variants = summary["variants"]
    for name in names:
        assert variants[name]["niah_all"]["n"] == 2 and variants[name]["babilong_all"]["n"] == 1
        by_depth = variants[name]["niah_by_depth"]  # the suite deals one sample to each depth
        assert list(by_depth) == ["0.25", "0.75"] and [c["n"] for c in by_depth.values()] == [1, 1]
        assert sum(c["mean"] for c in by_depth.values()) / 2 == variants[name]["niah_all"]["mean"]
        assert variants[name]["choice"]["mean"]["n"] == 4 * 3
        assert (out / "tensorboard" / name).is_dir()
    # A window longer than every multiple-choice prompt is full attention: exactly the same log-likelihoods.
    assert variants["swa1024-sink0"]["choice"] == variants["full"]["choice"]
    transfer = json.loads((out / "students" / "gdn" / "transfer.json").read_text())
    assert transfer["tokens"] == 4 * 2 * T and transfer["steps"] == 4
    curve = transfer["held_out_curve"]  # the convergence curves, at 0, 1, 2, 4 steps
    assert [row["step"] for row in curve] == [0, 1, 2, 4]
    assert [row["tokens"] for row in curve] == [0, 2 * T, 4 * T, 8 * T]
    assert curve[-1]["by_layer"] == transfer["held_out_relative_mse_by_layer"]["after"]
    lora = json.loads((out / "students" / "gdn" / "lora.json").read_text())
    assert [row["step"] for row in lora["held_out_loss_curve"]] == [0, 1, 2] and lora["teacher_held_out_loss"] > 0
    assert "## Convergence" in report and (out / "convergence.png").is_file()
    assert not list(out.glob("students/*/*-curve.json"))  # the partial curves are gone once a stage is done
    assert load_model(out / "students" / "mlstm" / "checkpoints" / "last.ckpt")[0].cfg.pattern == "X"
    for name in ("png", "md"):
        assert list(out.glob(f"*.{name}"))
    # A second run skips everything; a removed result is evaluated again, and so is one of other evaluate settings.
    (out / "variants" / "retrofit-gdn" / "variant.json").unlink()
    done = out / "variants" / "swa16-sink0" / "variant.json"
    done.write_text(json.dumps(json.loads(done.read_text()) | {"settings": {"suite": {"niah": {"depths": [0.5]}}}}))
    second = run_experiment(config)
    assert second.returncode == 0, second.stderr[-3000:]
    statuses = dict(re.findall(r"^\[ *\d+ s\] (\S+): (.*)$", second.stdout, flags=re.M))
    assert statuses.pop("retrofit-gdn").startswith("evaluated in")
    assert statuses.pop("swa16-sink0").startswith("evaluated again (evaluate's settings changed)")
    assert set(statuses.values()) == {"done before"}
    assert "attention transfer of" not in second.stdout and "LoRA of" not in second.stdout


def test_auto_precision_trains_in_bf16_only_where_bf16_is_native(monkeypatch):
    from swax_lightning.core import environment
    from swax_lightning.pretrained.experiment import ExperimentConfig

    for flags, native in (("fpu avx2 avx512f", False), ("fpu avx512f avx512_bf16", True), ("fpu amx_bf16", True)):
        monkeypatch.setattr(environment, "_cpuinfo_field", lambda name, flags=flags: flags if name == "flags" else None)
        assert ExperimentConfig(precision="auto").bf16 is native
        assert ExperimentConfig(precision="auto", device="cuda").bf16 and ExperimentConfig(precision="bf16").bf16
        assert not ExperimentConfig(precision="fp32", device="cuda").bf16


def test_a_bad_experiment_field_is_one_line(tmp_path):
    config = experiment_config(tmp_path, "smollm2", transfer={"tokens": 0})
    for path, words in ((config, ("transfer.tokens", "must be >= 1")), (tmp_path / "missing.yaml", ("not found",))):
        result = run_experiment(path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and all(w in lines[0] for w in words), result.stderr
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({"lora": {"rnak": 4}}))
    result = run_experiment(tmp_path / "typo.yaml")
    assert result.returncode == 2 and "lora.rnak: unknown field" in result.stderr


def test_multiple_choice_without_lm_eval_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """The choice tasks run through lm-eval (the eval group): without it the run stops at once, naming the field and
    the set-up, instead of failing in the first evaluation after the import and the training."""
    from swax_lightning.pretrained import experiment

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    cfg = read_config(experiment_config(tmp_path, "unused"))
    with pytest.raises(retrofit.ConfigError, match=r"evaluate.choice_items: .*lm-eval.*bash setup.sh eval pretrained"):
        experiment.run(cfg)
    assert not cfg.folder.exists()
    cfg.evaluate.choice_items = 0
    experiment.check_packages(cfg)  # no choice tasks: nothing to ask for


def test_a_window_beyond_the_teachers_positions_is_refused_before_any_training(teacher, tmp_path):
    """check_variants runs at start-up, before the retrofits train: a window longer than the imported model's
    positions (2,048 here) is one line naming the variant and the window."""
    _, teacher_ckpt = teacher
    cfg = read_config(experiment_config(tmp_path, "unused", evaluate={"windows": [16, 4096]}))
    with pytest.raises(retrofit.ConfigError, match=r"evaluate \(swa4096-sink4\): window 4096 is larger than the 2048"):
        check_variants(cfg, teacher_ckpt, None)
    check_variants(read_config(experiment_config(tmp_path, "unused")), teacher_ckpt, None)  # windows 16, 1024: fine


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs" / "retrofit").glob("*.yaml")))
def test_the_shipped_experiment_configs_read_and_put_needles_inside_and_beyond_the_windows(name):
    # The configs as shipped pass every check of read_config (the suite's own included), and their NIAH grid has
    # a depth whose needle ends the haystack (inside every window) and one farther back than every window: the
    # comparison's reading needs both.
    cfg = read_config(ROOT / "configs" / "retrofit" / name)
    niah = cfg.evaluate.make_suite().evaluation("niah").settings
    assert max(niah.depths) == 1.0
    assert (1 - min(niah.depths)) * min(niah.lengths) > max(cfg.evaluate.windows)


@pytest.mark.slow
def test_the_experiment_command_on_the_real_smollm2(tmp_path):
    """The same command on SmolLM2-135M (imported from the packaged GGUF): a few steps, the smallest grid."""
    for package in (*hf_import.GGUF_PACKAGES, hf_import.SMOLLM2_PACKAGE):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs the {package} package: bash setup.sh pretrained")
    config = experiment_config(
        tmp_path, "smollm2", students={"gdn": {"pattern": "D"}}, transfer={"tokens": 2 * 2 * T},
        lora={"tokens": 2 * T}, evaluate={"windows": [64], "sinks": [4], "choice_items": 1, "suite": {
            "niah": {"tasks": ["niah_single_2"], "lengths": [512], "depths": [0.75], "samples": 1,
                     "max_new_tokens": 12}}})
    result = run_experiment(config)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["variants"]) == {"full", "swa64-sink4", "retrofit-gdn"}
    print({name: v["niah_all"]["mean"] for name, v in summary["variants"].items()})
    assert summary["variants"]["full"]["niah_all"]["mean"] == 100.0  # SmolLM2 finds a needle 128 tokens back
    cache = {name: v["longest_niah"]["cache_bytes"] for name, v in summary["variants"].items()}
    assert cache["swa64-sink4"] < cache["full"]  # the window's ring and sinks against every key of the prompt


@pytest.mark.slow
def test_the_experiment_command_on_the_real_gemma3_with_lolcats_in_its_global_layers(tmp_path):
    """Gemma 3 270M (the packaged GGUF), LoLCATs' student in its 3 global layers (SSSSSL): a few steps, the smallest
    grid; the SWA variant masks the same 3 layers."""
    for package in (*hf_import.GGUF_PACKAGES, hf_import.GEMMA3_PACKAGE):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs the {package} package: bash setup.sh pretrained")
    config = experiment_config(
        tmp_path, "gemma3", students={"lolcats": {"pattern": "SSSSSL"}}, transfer={"tokens": 2 * 2 * T},
        lora={"tokens": 2 * T}, evaluate={"windows": [64], "sinks": [4], "choice_items": 1, "suite": {
            "niah": {"tasks": ["niah_single_2"], "lengths": [768], "depths": [1.0], "samples": 1,
                     "max_new_tokens": 12}}})
    result = run_experiment(config)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["variants"]) == {"full", "swa64-sink4", "retrofit-lolcats"}
    print({name: v["niah_all"]["mean"] for name, v in summary["variants"].items()})
    settings = json.loads((tmp_path / "run/variants/swa64-sink4/results.json").read_text())["settings"]
    assert settings["attention_windows"] == {"512+0": 15, "64+4": 3}
    student = json.loads((tmp_path / "run/students/lolcats/transfer.json").read_text())
    assert student["pattern"] == "SSSSSL"


def variant(name, family, scores, window=None):
    """A finished variant of the experiment that scored `scores` on NIAH prompts 0, 1, ... of one cell."""
    samples = [{"eval": "niah", "task": "t", "length": 1024, "depth": 1.0, "index": i, "score": s}
               for i, s in enumerate(scores)]
    spec = {"name": name, "window": window, "n_sink": 4 if window else None}
    return {"variant": {"family": family, "variant": spec}, "results": {"samples": samples}}


def test_the_paper_ratio_is_none_and_says_why_when_no_retrofit_scored():
    # A window-only SWA and two retrofits that all miss every needle gave "inf (0.0 / 0.0)": no ratio exists there.
    from swax_lightning.pretrained.report import ratio_lines, ratios

    variants = {"swa64-sink4": variant("swa64-sink4", "swa", [0.0, 0.0], 64),
                "swa512-sink4": variant("swa512-sink4", "swa", [100.0, 0.0], 512),
                "retrofit-gdn": variant("retrofit-gdn", "retrofit", [0.0, 0.0]),
                "retrofit-mlstm": variant("retrofit-mlstm", "retrofit", [0.0, 0.0])}
    rows = {r["window"]: r["niah"] for r in ratios(variants, 4)}
    assert rows[64]["ratio"] is None and rows[512]["ratio"] is None
    text = "\n".join(ratio_lines(list(ratios(variants, 4))))
    assert "none: both 0 (0.0 / 0.0" in text and "none: every retrofit 0 (50.0 / 0.0" in text and "inf" not in text
    variants["retrofit-gdn"] = variant("retrofit-gdn", "retrofit", [100.0, 0.0, 0.0, 0.0])
    assert {r["window"]: r["niah"]["ratio"] for r in ratios(variants, 4)} == {64: 0.0, 512: 2.0}


def test_the_paper_ratio_has_a_paired_bootstrap_interval():
    from swax_lightning.pretrained.report import ratio_interval, ratio_lines, ratios

    hits = [100.0] * 24 + [0.0] * 16
    same = {"swa64-sink4": variant("swa64-sink4", "swa", hits, 64), "retrofit-l": variant("l", "retrofit", hits)}
    assert ratios(same, 4)[0]["niah"]["ci95"] == [1.0, 1.0]  # one model against itself: every draw is 1
    half = [100.0 if i % 2 else 0.0 for i in range(40)]  # 20 of 40, some on other prompts
    entry = ratios({"swa64-sink4": same["swa64-sink4"], "retrofit-l": variant("l", "retrofit", half)}, 4)[0]["niah"]
    low, high = entry["ci95"]
    assert entry["ratio"] == pytest.approx(1.2) and low < 1.2 < high and high is not None
    assert "1.20 [" in "\n".join(ratio_lines([{"window": 64, "sinks": 4, "niah": entry}]))
    # Twice as many hits on 40 prompts each: an interval that excludes 1; one hit in 40: unbounded above.
    assert ratio_interval(np.array([100.0] * 20 + [0.0] * 20), np.array([100.0] * 10 + [0.0] * 30))[0] > 1
    assert ratio_interval(np.array(hits), np.array([100.0] + [0.0] * 39))[1] is None


@pytest.mark.parametrize("pattern,n_sink", [("A", 0), ("S", 4)])
def test_the_decode_summary_of_a_batch_is_per_sequence(pattern, n_sink):
    # The report's state bytes and decode speed come from generate's stats of whole batches: three prompts of one
    # length decoded together must read as one prompt's state (the window's ring or the full cache), all three
    # counted as prompts, every padded prompt token counted in the prefill speed.
    from swax_lightning.model.inference import generate
    from swax_lightning.pretrained.experiment import decode_summary

    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(vocab_size=50, d_model=32, n_layers=2, pattern=pattern, n_heads=4, window=5,
                                  n_sink=n_sink)).eval()
    prompts = torch.randint(0, 50, (3, 23), generator=torch.Generator().manual_seed(1)).tolist()
    alone, together = {}, {}
    generate(model, prompts[:1], max_new_tokens=4, stats=alone)
    generate(model, prompts, max_new_tokens=4, stats=together)
    summary = decode_summary([{"eval": "niah", "length": 23, **together}])["niah/23"]
    assert summary["cache_bytes"] == alone["cache_bytes"] and summary["prompts"] == 3 and summary["batch"] == 3
    assert summary["prefill_tokens_per_s"] == pytest.approx(3 * 23 / together["prefill_seconds"])
    assert summary["decode_tokens_per_s"] == pytest.approx(together["decode_steps"] / together["decode_seconds"])
