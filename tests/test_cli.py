"""End to end through the command line: fit, then test from the checkpoint; --print_config; bad values named."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert list((tmp_path / "runs/tiny/w64").glob("events.out.tfevents.*"))
    _assert_hparams_entry(tmp_path / "runs")
    test = _main("test", *_overrides(tmp_path), "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "2",
                 *SMALL_EVAL, cwd=tmp_path)
    assert test.returncode == 0, test.stderr[-3000:]
    for metric in ("test/loss", "test/ppl", "test/bpb"):
        assert metric in test.stdout
    _assert_eval_reports(tmp_path / "runs/tiny/w64")
    predict = _main("predict", *_overrides(tmp_path), "--ckpt_path", str(ckpt), "--data.prompts", '["def ", "x = "]',
                    "--model.generation.max_new_tokens", "8", cwd=tmp_path)
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert "--- prompt: 'def '" in predict.stdout and "--- prompt: 'x = '" in predict.stdout
    no_prompts = _main("predict", *_overrides(tmp_path), "--ckpt_path", str(ckpt), cwd=tmp_path)
    assert no_prompts.returncode != 0 and "data.prompts" in no_prompts.stderr


# The evaluation suite at CI size (the README's figures come from configs/base/tiny_eval.yaml, out to 131k tokens).
SMALL_EVAL = ["--eval.niah_tasks", "[niah_single_1, niah_multikey_2]", "--eval.niah_lengths", "[1024, 2048]",
              "--eval.niah_samples", "2", "--eval.niah_depths", "4", "--eval.babilong_tasks", "[qa1, qa4]",
              "--eval.babilong_lengths", "[0, 2048]", "--eval.perplexity_len", "512", "--eval.perplexity_samples", "2", "--eval.max_new_tokens",
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
    assert "RULER NIAH" in (run / "eval/results.md").read_text()
    assert (run / "eval/niah_heatmap.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    assert "eval/niah/average/2048" in events.Tags()["scalars"]
    assert "eval/niah_heatmap" in events.Tags()["images"]


def test_print_config(tmp_path):
    out = _main("fit", "--config", str(ROOT / "configs/tiny.yaml"), "--print_config", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pattern: SX" in out.stdout and "window: 64" in out.stdout and "seq_len: 256" in out.stdout


@pytest.mark.parametrize("arg,value,field", [("--model.arch.window", "0", "window"),
                                             ("--model.arch.pattern", "SXZ", "pattern"),
                                             ("--model.arch.n_heads", "5", "d_model")])
def test_bad_config_value_is_named(tmp_path, arg, value, field):
    out = _main("fit", *_overrides(tmp_path), arg, value, "--trainer.max_steps", "1", cwd=tmp_path)
    assert out.returncode != 0
    assert f"ModelConfig.{field}" in out.stderr, out.stderr[-3000:]


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
