"""The command line end to end: fit, then test from the checkpoint; --print_config and run naming; configuration
errors in one line naming the field and its file; checkpoint checks at start-up; the generate command as typed.
Cheap checks run main.py in the test process (main.main(args)); the few that are about the process itself (exit
code, what stderr shows) run it as a user does."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _main(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def _overrides(tmp_path):
    return ["--config", str(ROOT / "configs/tiny.yaml"), "--data.data_dir", str(tmp_path / "data"),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.enable_progress_bar", "false"]


@pytest.mark.slow
def test_fit_then_test_from_checkpoint(tmp_path):
    fit = _main("fit", *_overrides(tmp_path), "--trainer.max_steps", "6", "--trainer.val_check_interval", "3",
                "--trainer.limit_val_batches", "2", "--data.batch_size", "4", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = tmp_path / "runs/tiny/w64/checkpoints/last.ckpt"
    assert ckpt.exists()
    assert f"last checkpoint: {ckpt} (step 6)" in fit.stdout  # where the results went, and what to do next
    assert f"evaluate: python main.py test --config {ckpt.parents[1] / 'config.yaml'} --ckpt_path {ckpt}" in fit.stdout
    assert list((tmp_path / "runs/tiny/w64").glob("events.out.tfevents.*"))
    _assert_hparams_entry(tmp_path / "runs")
    test = _main("test", *_overrides(tmp_path), "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "2",
                 *SMALL_EVAL, cwd=tmp_path)
    assert test.returncode == 0, test.stderr[-3000:]
    for metric in ("test/loss", "test/ppl", "test/bpb"):
        assert metric in test.stdout
    assert test.stdout.index("evaluation cost (this machine:") < test.stdout.index("| niah_single_1 |")
    assert f"evaluation reports: {tmp_path / 'runs/tiny/w64/eval'}/" in test.stdout
    _assert_eval_reports(tmp_path / "runs/tiny/w64")
    predict = _main("predict", *_overrides(tmp_path), "--ckpt_path", str(ckpt), "--data.prompts", '["def ", "x = "]',
                    "--model.generation.max_new_tokens", "8", cwd=tmp_path)
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert "--- prompt: 'def '" in predict.stdout and "--- prompt: 'x = '" in predict.stdout
    no_prompts = _main("predict", *_overrides(tmp_path), "--ckpt_path", str(ckpt), cwd=tmp_path)
    assert no_prompts.returncode != 0 and "data.prompts" in no_prompts.stderr


# The evaluation suite at CI size (the README's figures come from configs/base/tiny_eval.yaml, out to 131k tokens).
SMALL_EVAL = ["--eval.niah.tasks", "[niah_single_1, niah_multikey_2]", "--eval.niah.lengths", "[1024, 2048]",
              "--eval.niah.samples", "2", "--eval.niah.depths", "2", "--eval.babilong.tasks", "[qa1, qa4]",
              "--eval.babilong.lengths", "[0, 2048]", "--eval.babilong.samples", "1", "--eval.perplexity.length", "512",
              "--eval.perplexity.samples", "2",
              "--eval.niah.max_new_tokens",
              "16"]


def _assert_eval_reports(run):
    results = json.loads((run / "eval/results.json").read_text())
    assert set(results["niah"]["scores"]) == {"niah_single_1", "niah_multikey_2", "average"}
    assert set(results["niah"]["scores"]["average"]) == {"1024", "2048"}
    assert set(results["babilong"]["scores"]["qa1"]) == {"0", "2048"}
    assert results["babilong"]["source"].startswith("generated")
    assert results["niah"]["scores"]["average"]["2048"]["n"] == 4  # 2 tasks x 2 samples, with a 95% interval
    assert len(results["niah"]["scores"]["average"]["2048"]["ci95"]) == 2
    assert all(s["question"] and "prediction" in s and ("regenerate" in s) for s in results["samples"])
    assert [r["to"] for r in results["perplexity"]] == [64, 128, 256, 512]
    assert len(results["samples"]) == 2 * 2 * 2 + 2 * 2
    assert results["settings"]["checkpoint"]["step"] == 6  # the evaluated checkpoint's own step
    assert "RULER NIAH" in (run / "eval/results.md").read_text()
    for name in ("", "_niah_single_1", "_niah_multikey_2"):  # all tasks pooled, and each task
        assert (run / f"eval/niah_heatmap{name}.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    assert "eval/niah/average/2048" in events.Tags()["scalars"]
    assert {"eval/niah_heatmap", "eval/niah_heatmap/niah_single_1"} <= set(events.Tags()["images"])


def _assert_hparams_entry(runs):
    """The run's settings, window schedule included, and its final validation metrics are in the HPARAMS tab."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(runs))
    mux.Reload()
    content = mux.PluginRunToTagToContent(metadata.PLUGIN_NAME)["tiny/w64"]
    hparams = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG]).hparams
    assert {"window/windows", "window/eval_window", "model/arch/pattern", "arm"} <= set(hparams)
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    assert {m.name.tag for m in experiment.metric_infos} == {"hp/val_loss", "hp/val_bpb"}


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["A", "S", "X", "SD", "SA"])
def test_baseline_and_hybrid_configs_train(tmp_path, pattern):
    """Each pattern's tiny config (an `extends:` file) trains a few steps and validates through the CLI."""
    out = _main("fit", "--config", str(ROOT / f"configs/tiny_{pattern}.yaml"), "--data.data_dir",
                str(tmp_path / "data"), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
                "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "3", "--trainer.val_check_interval",
                "3", "--trainer.limit_val_batches", "1", "--data.batch_size", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    config = (tmp_path / f"runs/tiny/{pattern}/config.yaml").read_text()
    assert f"pattern: {pattern}" in config and "d_model: 128" in config  # the arm on top of tiny.yaml


# ---- configuration errors: one line naming the field (and the file that set it), exit code 2 ----------------------
def _in_process(capsys, *args) -> tuple[int, str, str]:
    """main.py run in this process: (exit code, stdout, stderr)."""
    from main import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exit:
        code = exit.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_bad_value_is_one_line_naming_the_field(tmp_path):
    """As a user runs it: no traceback, one `error:` line, exit code 2 (it was a 71-line traceback)."""
    out = _main("fit", *_overrides(tmp_path), "--model.arch.n_heads", "5", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "ModelConfig.d_model must be divisible by n_heads=5" in _one_error_line(out.stderr)


@pytest.mark.parametrize("args,expected", [
    (["--model.arch.window", "0"], "ModelConfig.window must be >= 1 (got 0) [model.arch.window set on the command"),
    (["--model.arch.pattern", "SXZ"], "ModelConfig.pattern"),
    (["--model.optim.lr", "0"], "OptimConfig.lr must be > 0"),
    (["--model.generation.top_p", "0"], "GenerationConfig.top_p"),
    (["--data.batch_size", "0"], "TextDataModule.batch_size"),
    (["--data.num_workers", "-1"], "TextDataModule.num_workers must be >= 0 (got -1)"),
    (["--window.windows", "[16, 4096]"], "window.windows [4096] are longer than data.seq_len"),
    (["--trainer.val_check_interval", "0"], "trainer.val_check_interval must be > 0"),
    (["--model.arch.window", "abc"], 'Parser key "model.arch.window"'),
    (["--optimizer", "AdamW"], "unrecognized arguments: --optimizer"),  # LightningCLI's dead optimizer group
    (["--config", "no_such.yaml"], "config file not found: no_such.yaml"),
    (["--seed_everything", "-1"], "seed_everything must be in [0, 2**32) (got -1)"),
    (["--eval.batch_size", "0"], "EvalSuite.batch_size must be >= 1 (got 0)"),
    (["--config", "data: {seq_len: 0}"], "TextDataModule.seq_len must be >= 1 (got 0) [data.seq_len set in a --config"),
])
def test_configuration_errors(tmp_path, capsys, args, expected):
    code, _, err = _in_process(capsys, "fit", *_overrides(tmp_path), *args)
    assert code == 2 and expected in _one_error_line(err)


@pytest.mark.parametrize("interpreter,args,expected", [
    ("0", ["--model.arch.kernels", "{attention: triton}"],
     "ModelConfig.kernels.attention: triton needs a CUDA GPU"),
    ("0", ["--model.arch.kernels", "{mlstm: triton}"], "ModelConfig.kernels.mlstm: triton needs a CUDA GPU"),
    ("1", ["--model.arch.kernels", "{attention: flex}"],
     "ModelConfig.kernels.attention: flex has no backward on the CPU"),
    ("1", ["--model.arch.kernels", "{attention: triton}", "--model.arch.head_dim", "256", "--trainer.precision",
           "32-true"], "ModelConfig.kernels.attention: triton in fp32 takes head dims up to 128 (got 256;"),
])
def test_a_backend_the_trainer_cannot_run_is_refused_at_start_up(tmp_path, capsys, monkeypatch, interpreter, args,
                                                                 expected):
    monkeypatch.setenv("TRITON_INTERPRET", interpreter)  # "0": a CPU machine as a user has it (no interpreter)
    code, _, err = _in_process(capsys, "fit", *_overrides(tmp_path), "--trainer.accelerator", "cpu", *args)
    line = _one_error_line(err)
    assert code == 2 and expected in line and line.endswith("[model.arch.kernels set on the command line]"), line


def test_error_names_the_file_of_an_extends_chain(tmp_path, capsys):
    arm = tmp_path / "arm.yaml"
    arm.write_text(f"extends: {ROOT / 'configs/tiny.yaml'}\narm: bad\nmodel:\n  arch:\n    window: 0\n")
    code, _, err = _in_process(capsys, "fit", "-c", str(arm))
    assert code == 2 and f"ModelConfig.window must be >= 1 (got 0) [model.arch.window set in {arm}]" in err
    base_field = _one_error_line(_in_process(capsys, "fit", "-c", str(arm), "--model.arch.window", "8",
                                             "--model.arch.n_heads", "5")[2])
    assert f"[model.arch.d_model set in {ROOT / 'configs/base/tiny_model.yaml'}]" in base_field  # a section file
    orphan = tmp_path / "orphan.yaml"
    orphan.write_text("extends: gone.yaml\n")
    code, _, err = _in_process(capsys, "fit", "--config", str(orphan))
    assert code == 2 and f"{orphan}: extends a missing file {tmp_path / 'gone.yaml'}" in _one_error_line(err)


def test_short_config_flag_expands_extends(capsys):
    code, out, err = _in_process(capsys, "fit", "-c", str(ROOT / "configs/tiny_SD.yaml"), "--print_config")
    assert code == 0, err
    printed = yaml.safe_load(out)
    assert printed["model"]["arch"]["pattern"] == "SD" and printed["model"]["arch"]["d_model"] == 128


def test_help_lists_nested_fields_and_no_optimizer_group(capsys):
    code, out, _ = _in_process(capsys, "fit", "--help")
    assert code == 0
    for option in ("--model.arch.n_heads", "--model.arch.logit_soft_cap", "--model.optim.lr",
                   "--model.generation.top_p", "--allow_random_weights"):
        assert option in out
    assert "--optimizer" not in out and "--lr_scheduler" not in out


def test_other_exceptions_keep_their_traceback(tmp_path, capsys, monkeypatch):
    """Only configuration errors become one line: a failure inside the run is raised as it is."""
    from swax_lightning.data.datamodule import TextDataModule

    def broken(self):
        raise ValueError("a bug, not a configuration error")

    monkeypatch.setattr(TextDataModule, "prepare_data", broken)
    with pytest.raises(ValueError, match="a bug"):
        _in_process(capsys, "fit", *_overrides(tmp_path), "--trainer.max_steps", "1")


# ---- checkpoints: the configuration is the truth; evaluation needs trained weights ----------------------------
NO_EVALS = ["--eval.niah", "null", "--eval.babilong", "null", "--eval.perplexity", "null",
            "--trainer.limit_test_batches", "1", "--data.batch_size", "2"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A checkpoint of the architecture configs/tiny.yaml configures (untrained: only its settings matter here)."""
    import lightning as L

    from swax_lightning.training.module import LanguageModule

    arch = yaml.safe_load((ROOT / "configs/base/tiny_model.yaml").read_text())["arch"]
    module = LanguageModule(arch=arch)
    module.configure_model()
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.mark.parametrize("config,args,named", [
    ("tiny.yaml", ["--model.arch.logit_soft_cap", "20"],
     "model.arch.logit_soft_cap (checkpoint 30.0, configured 20.0)"),
    ("tiny_SD.yaml", [], "model.arch.pattern (checkpoint 'SX', configured 'SD')"),
])
def test_checkpoint_of_another_architecture_is_refused(tmp_path, capsys, tiny_checkpoint, config, args, named):
    """It used to replace the configured model silently (LightningCLI parses the checkpoint's hyperparameters over
    the configuration): an SD run config tested an SX checkpoint, and a changed logit_soft_cap was ignored."""
    code, _, err = _in_process(capsys, "test", "--config", str(ROOT / "configs" / config), *args,
                               "--ckpt_path", str(tiny_checkpoint), *_overrides(tmp_path)[2:], *NO_EVALS)
    assert code == 2 and named in _one_error_line(err)


def test_evaluation_needs_a_checkpoint_or_consent(tmp_path, capsys):
    code, _, err = _in_process(capsys, "test", *_overrides(tmp_path), *NO_EVALS)
    assert code == 2 and "--allow_random_weights" in _one_error_line(err)
    code, out, err = _in_process(capsys, "test", *_overrides(tmp_path), *NO_EVALS, "--allow_random_weights", "true")
    assert code == 0 and "test/loss" in out, err[-3000:]
    code, _, err = _in_process(capsys, "test", *_overrides(tmp_path), *NO_EVALS, "--ckpt_path", "nope.ckpt")
    assert code == 2 and "no such checkpoint file or folder: nope.ckpt" in _one_error_line(err)


# ---- run naming: <save_dir>/<experiment>/<arm>/ for each logger ------------------------------------------------
def test_print_config(capsys):
    code, out, err = _in_process(capsys, "fit", "--config", str(ROOT / "configs/tiny.yaml"), "--print_config")
    assert code == 0, err[-3000:]
    assert "pattern: SX" in out and "window: 64" in out and "seq_len: 256" in out
    assert out.startswith("# run folder: runs/tiny/w64\n")


@pytest.mark.parametrize("logger,naming", [
    ("TensorBoardLogger", {"name": "tiny", "version": "w64"}),
    ("CSVLogger", {"name": "tiny", "version": "w64"}),
    ("WandbLogger", {"project": "tiny", "name": "w64"}),  # configured, not run: wandb is optional
])
def test_print_config_shows_the_run_folder_of_each_logger(tmp_path, capsys, logger, naming):
    code, out, err = _in_process(capsys, "fit", "--config", str(ROOT / "configs/tiny.yaml"),
                                 "--trainer.logger", json.dumps({"class_path": f"lightning.pytorch.loggers.{logger}",
                                                                 "init_args": {"save_dir": str(tmp_path)}}),
                                 "--print_config")
    assert code == 0, err
    assert out.startswith(f"# run folder: {tmp_path / 'tiny/w64'}\n")
    assert naming.items() <= yaml.safe_load(out)["trainer"]["logger"]["init_args"].items()


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["CSVLogger", "WandbLogger"])
def test_a_run_of_any_logger_goes_to_the_arm_folder(tmp_path, logger):
    """experiment/arm used to name TensorBoard runs only (a CSV run went to lightning_logs/version_0) and the
    hyperparameters written after fit crashed any logger but TensorBoard. W&B runs offline (no network here): its run
    is named and identified by the arm, its project is the experiment."""
    if logger == "WandbLogger":
        pytest.importorskip("wandb", reason="the optional W&B group: bash setup.sh wandb")
    init = {"save_dir": str(tmp_path)} | ({"offline": True} if logger == "WandbLogger" else {})
    spec = json.dumps({"class_path": f"lightning.pytorch.loggers.{logger}", "init_args": init})
    fit = _main("fit", *_overrides(tmp_path)[:4], "--trainer.logger", spec, "--trainer.enable_progress_bar", "false",
                "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
                "--data.batch_size", "2", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    run = tmp_path / "tiny/w64"
    assert (run / "checkpoints/last.ckpt").is_file()
    assert "pattern: SX" in (run / "config.yaml").read_text() and not (tmp_path / "config.yaml").exists()
    if logger == "CSVLogger":
        assert "val/loss" in (run / "metrics.csv").read_text()
        assert "pattern: SX" in (run / "hparams.yaml").read_text()
    else:
        run_id = (run / "wandb-id").read_text().strip()  # the run's own id: <arm>-<8 hex digits>
        assert run_id.startswith("w64-") and len(run_id) == len("w64-") + 8
        (wandb_run,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")  # W&B's folder: <time>-<run id>
        records = (wandb_run / f"run-{run_id}.wandb").read_bytes()  # metrics and config, for `wandb sync`
        assert b"val/loss" in records and b"tiny" in records
        again = lambda *more: _main("fit", *_overrides(tmp_path)[:4], "--trainer.logger", spec, *more,
                                    "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
                                    "--data.batch_size", "2", cwd=tmp_path)
        resumed = again("--ckpt_path", "last", "--trainer.max_steps", "3")
        assert resumed.returncode == 0 and (run / "wandb-id").read_text().strip() == run_id, resumed.stderr[-2000:]
        replaced = again("--overwrite", "true", "--trainer.max_steps", "1")
        assert replaced.returncode == 0 and (run / "wandb-id").read_text().strip() != run_id, replaced.stderr[-2000:]


NO_EVAL = ["--eval.niah", "null", "--eval.babilong", "null", "--eval.perplexity", "null"]


@pytest.mark.slow
def test_one_fit_per_run_folder(tmp_path):
    """A second fit of the same arm is refused (one line, the first run untouched) unless it resumes (--ckpt_path
    last) or replaces it (--overwrite true); test writes its own test-config.yaml, never the fit's config.yaml."""
    fit = lambda *more: _main("fit", *_overrides(tmp_path), "--trainer.limit_val_batches", "0", "--data.batch_size",
                              "2", *more, cwd=tmp_path)
    run = tmp_path / "runs/tiny/w64"
    assert fit("--trainer.max_steps", "2").returncode == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    refused = fit("--trainer.max_steps", "1")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: {run} already holds a run: resume it with --ckpt_path last, name this run "
        f"otherwise (--arm, --experiment), or replace it with --overwrite true"], refused.stderr[-2000:]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    test = _main("test", *_overrides(tmp_path), "--ckpt_path", str(run / "checkpoints/last.ckpt"),
                 "--trainer.limit_test_batches", "1", "--data.batch_size", "2", *NO_EVAL, cwd=tmp_path)
    assert test.returncode == 0, test.stderr[-2000:]
    assert (run / "config.yaml").read_bytes() == before[run / "config.yaml"]
    assert f"ckpt_path: {run / 'checkpoints/last.ckpt'}" in (run / "test-config.yaml").read_text()
    assert fit("--ckpt_path", "last", "--trainer.max_steps", "3").returncode == 0
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 3
    assert fit("--overwrite", "true", "--trainer.max_steps", "1").returncode == 0
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 1
    assert len(list(run.glob("events.out.tfevents.*"))) == 1 and not (run / "test-config.yaml").exists()


# ---- generate: the README's command line as typed ------------------------------------------------------------
@pytest.mark.parametrize("prompts", [["def main(", "import "], ["[1, 2]"]])
def test_generate_command_line_takes_prompts_as_typed(capsys, tiny_checkpoint, prompts):
    """`--prompt A --prompt B` and a single `--prompt X` exited 2 ("Expected a <class 'list'>")."""
    from swax_lightning.commands.generate import main as command_line

    command_line(["--ckpt_path", str(tiny_checkpoint), *[arg for p in prompts for arg in ("--prompt", p)],
                  "--max_new_tokens", "3"])
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--- prompt:")]
    assert shown == [f"--- prompt: {prompt!r}" for prompt in prompts]


def test_version(tmp_path):
    from swax_lightning import __version__

    run = _main("--version", cwd=tmp_path)
    assert run.returncode == 0 and f"swax-lightning {__version__}" in run.stdout, run.stderr


def test_a_babilong_length_too_short_is_refused_before_niah_runs(tmp_path, tiny_checkpoint):
    """BABILong lengths were checked only when BABILong ran, after NIAH's work; now both at start-up, one line."""
    test = _main("test", *_overrides(tmp_path), "--ckpt_path", str(tiny_checkpoint), "--eval.niah.tasks",
                 "[niah_single_1]", "--eval.niah.lengths", "[1024]", "--eval.niah.samples", "40",
                 "--eval.babilong.tasks", "[qa3]", "--eval.babilong.lengths", "[600]", cwd=tmp_path)
    assert test.returncode == 2 and "RULER NIAH" not in test.stderr + test.stdout, test.stderr[-2000:]
    assert _one_error_line(test.stderr).startswith("error: eval.babilong.lengths: qa3: length 600 is too short")


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["vocabulary", "missing data folder", "corrupt meta.json", "tiny corpus",
                                     "nothing to resume"])
def test_start_up_errors_after_parsing_are_one_line(tmp_path, problem):
    """Errors found once the classes are built or the data is read were 37-47-line tracebacks with exit 1; each is
    one `error:` line naming the field or file, exit 2, before any long work."""
    args = {"vocabulary": ["--model.arch.vocab_size", "200"],
            "missing data folder": ["--data.source", "null", "--data.data_dir", str(tmp_path / "nowhere")],
            "corrupt meta.json": ["--data.data_dir", str(tmp_path / "bad")],
            "tiny corpus": ["--data.source", str(tmp_path / "docs"), "--data.data_dir", str(tmp_path / "small")],
            "nothing to resume": ["--ckpt_path", "last"]}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/meta.json").write_text('{"seq_len": 3')
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"{i}.txt").write_text(f"a short document {i}\n")
    fit = _main("fit", *_overrides(tmp_path), *args[problem], "--trainer.max_steps", "1", cwd=tmp_path)
    expected = {"vocabulary": "model.arch.vocab_size = 200 is smaller than the 257 ids of data.tokenizer 'byte'",
                "missing data folder": "no shards in", "corrupt meta.json": "meta.json is corrupt",
                "tiny corpus": "split of", "nothing to resume": "--ckpt_path last: there is no "}
    assert fit.returncode == 2 and expected[problem] in _one_error_line(fit.stderr), fit.stderr[-2000:]
    assert "Traceback" not in fit.stderr
    assert not (tmp_path / "data").exists()  # nothing prepared for the vocabulary case


@pytest.mark.parametrize("field,name", [("experiment", "."), ("arm", ".."), ("experiment", "../outside"),
                                        ("arm", "/abs/path"), ("arm", "a/b"), ("experiment", "a\\b")])
def test_a_run_name_that_would_leave_save_dir_is_one_line_and_deletes_nothing(tmp_path, capsys, field, name):
    """`--experiment . --arm .. --overwrite true` once deleted the folder holding runs/ (the checkout, with the
    default save_dir): every hostile name is refused before anything is written or deleted."""
    keep = tmp_path / "keep.txt"
    keep.write_text("the user's file")
    code, _, err = _in_process(capsys, "fit", *_overrides(tmp_path), f"--{field}", name, "--overwrite", "true")
    assert code == 2 and f"{field} {name!r} must be a plain folder name" in _one_error_line(err)
    assert keep.read_text() == "the user's file" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_overwrite_deletes_only_a_folder_that_holds_a_run(tmp_path, capsys):
    folder = tmp_path / "runs" / "tiny" / "w64"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("not a run")
    code, _, err = _in_process(capsys, "fit", *_overrides(tmp_path), "--overwrite", "true")
    assert code == 2 and "holds files that are no run of this framework" in _one_error_line(err)
    assert (folder / "notes.txt").read_text() == "not a run"


def test_a_run_folder_linked_outside_save_dir_is_refused(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny").symlink_to(tmp_path / "elsewhere")
    code, _, err = _in_process(capsys, "fit", *_overrides(tmp_path))
    assert code == 2 and "outside save_dir" in _one_error_line(err)
