"""The paper's run configs: every arm resolves, its window schedule is the paper's, its model has the nominal size."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from swax_lightning.config import ModelConfig
from swax_lightning.evals.suite import EvalSuite
from swax_lightning.model import SWAXModel
from swax_lightning.window import StochasticWindow

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ARMS = {  # arm file: (nominal parameters, windows, probs)
    "1.4b_w128": (1.4e9, [128], None), "1.4b_w256": (1.4e9, [256], None), "1.4b_w512": (1.4e9, [512], None),
    "1.4b_w1024": (1.4e9, [1024], None), "1.4b_w2048": (1.4e9, [2048], None),
    "1.4b_stochastic": (1.4e9, [128, 2048], [0.5, 0.5]),
    "7b_w128": (7e9, [128], None), "7b_w2048": (7e9, [2048], None), "7b_stochastic": (7e9, [128, 2048], [0.75, 0.25]),
}


def resolve(path: Path) -> dict:
    """A config file with its nested section files (jsonargparse's `section: file.yaml`) read in and its
    `extends:` base merged under it (SwaxCLI's rule)."""
    cfg = yaml.safe_load(path.read_text())
    base = resolve(path.parent / cfg.pop("extends")) if "extends" in cfg else {}
    own = {k: yaml.safe_load((path.parent / v).read_text()) if isinstance(v, str) and v.endswith(".yaml") else v
           for k, v in cfg.items()}
    return _merge(base, own)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_paper_arm(arm):
    nominal, windows, probs = ARMS[arm]
    cfg = resolve(CONFIGS / f"{arm}.yaml")
    arch = ModelConfig(**cfg["model"]["arch"])
    assert arch.pattern == "SX" and (arch.n_layers, arch.d_model) == ((24, 2048) if nominal < 2e9 else (32, 4096))
    with torch.device("meta"):
        n_params = SWAXModel(arch).num_params()
    assert abs(n_params - nominal) / nominal < 0.05, f"{arm}: {n_params / 1e9:.3f}B"
    assert cfg["data"]["seq_len"] == 16384 and cfg["trainer"]["precision"] == "bf16-mixed"
    global_batch = cfg["trainer"]["num_nodes"] * cfg["trainer"]["devices"] * cfg["data"]["batch_size"] \
        * cfg["trainer"]["accumulate_grad_batches"]
    tokens = cfg["trainer"]["max_steps"] * global_batch * cfg["data"]["seq_len"]
    assert abs(tokens - 150e9) / 150e9 < 0.001
    cb = StochasticWindow(**cfg["window"])
    assert cb.windows == windows and (probs is None or cb.probs == probs)
    assert cb.anneal_fraction == 0.1 and cb.anneal_window == max(windows)
    assert cb.eval_window == (2048 if len(windows) > 1 else windows[0])
    assert cfg["experiment"] == "swax_" + arm.split("_")[0]  # runs/swax_1.4b/<arm>/, runs/swax_7b/<arm>/
    suite = EvalSuite(**cfg["eval"])  # the paper's evaluation set
    assert len(suite.niah_tasks) == 8 and max(suite.niah_lengths) == 131072 and suite.lm_eval_tasks


@pytest.mark.parametrize("pattern", ["A", "S", "X", "SD", "SA"])
def test_1_4b_baselines_and_hybrids(pattern):
    cfg = resolve(CONFIGS / f"1.4b_{pattern}.yaml")
    arch = ModelConfig(**cfg["model"]["arch"])
    assert arch.pattern == pattern and cfg["arm"] == pattern and cfg["experiment"] == "swax_1.4b"
    with torch.device("meta"):
        n_params = SWAXModel(arch).num_params()
    assert abs(n_params - 1.4e9) / 1.4e9 < 0.05, f"{pattern}: {n_params / 1e9:.3f}B"


@pytest.mark.parametrize("arm", ["tiny", "tiny_w16", "tiny_stochastic", "tiny_A", "tiny_S", "tiny_X", "tiny_SD",
                                 "tiny_SA"])
def test_tiny_arms_resolve(arm):
    cfg = resolve(CONFIGS / f"{arm}.yaml")
    ModelConfig(**cfg["model"]["arch"])
    StochasticWindow(**cfg["window"])
    assert cfg["trainer"]["accelerator"] == "cpu"
    assert EvalSuite(**cfg["eval"]).enabled


def test_headline_config_parses_through_the_cli(tmp_path):
    out = subprocess.run([sys.executable, str(CONFIGS.parent / "main.py"), "fit", "--config",
                          str(CONFIGS / "7b_stochastic.yaml"), "--print_config"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = yaml.safe_load(out.stdout)
    assert printed["window"]["probs"] == [0.75, 0.25] and printed["model"]["arch"]["d_model"] == 4096
    assert printed["trainer"]["strategy"]["class_path"] == "swax_lightning.strategy.FSDP2Strategy"
