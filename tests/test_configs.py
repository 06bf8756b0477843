"""The run configs, read by the command line's own parser: every file in configs/ parses and builds; the paper's arms
have the paper's window schedules, token budgets and nominal model sizes."""
from pathlib import Path

import pytest
import torch
import yaml

from swax_lightning.commands.cli import SwaxCLI, expand_extends, name_run, without_paths
from swax_lightning.data.datamodule import TextDataModule
from swax_lightning.evals.suite import EvalSuite
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.module import LanguageModule
from swax_lightning.training.window import StochasticWindow

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ARMS = {  # arm file: (nominal parameters, windows, probs)
    "1.4b_w128": (1.4e9, [128], None), "1.4b_w256": (1.4e9, [256], None), "1.4b_w512": (1.4e9, [512], None),
    "1.4b_w1024": (1.4e9, [1024], None), "1.4b_w2048": (1.4e9, [2048], None),
    "1.4b_stochastic": (1.4e9, [128, 2048], [0.5, 0.5]),
    "7b_w128": (7e9, [128], None), "7b_w2048": (7e9, [2048], None), "7b_stochastic": (7e9, [128, 2048], [0.75, 0.25]),
}


@pytest.fixture(scope="module")
def parser():
    """The command line's own parser (SwaxCLI over LanguageModule and TextDataModule, without a subcommand)."""
    return SwaxCLI(LanguageModule, TextDataModule, run=False, args=[]).parser


def parse(parser, path: Path):
    """A config file as `main.py fit --config <path>` reads it: `extends:` expanded, section files read, types
    checked, defaults filled in."""
    return parser.parse_args(expand_extends(["--config", str(path)]))


def resolve(parser, path: Path) -> dict:
    return without_paths(parse(parser, path).as_dict())


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_paper_arm(parser, arm):
    nominal, windows, probs = ARMS[arm]
    cfg = resolve(parser, CONFIGS / f"{arm}.yaml")
    arch = ModelConfig(**cfg["model"]["arch"])
    assert arch.pattern == "SX" and (arch.n_layers, arch.d_model) == ((24, 2048) if nominal < 2e9 else (32, 4096))
    with torch.device("meta"):
        n_params = SWAXModel(arch).num_params()
    assert abs(n_params - nominal) / nominal < 0.05, f"{arm}: {n_params / 1e9:.3f}B"
    assert cfg["data"]["seq_len"] == 16384 and cfg["trainer"]["precision"] == "bf16-mixed"
    assert cfg["trainer"]["strategy"]["class_path"] == "swax_lightning.training.strategy.FSDP2Strategy"
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
    niah = suite.evaluation("niah").settings
    assert len(niah.tasks) == 8 and max(niah.lengths) == 131072 and suite.evaluation("lm_eval").settings.tasks


@pytest.mark.parametrize("pattern", ["A", "S", "X", "SD", "SA"])
def test_1_4b_baselines_and_hybrids(parser, pattern):
    cfg = resolve(parser, CONFIGS / f"1.4b_{pattern}.yaml")
    arch = ModelConfig(**cfg["model"]["arch"])
    assert arch.pattern == pattern and cfg["arm"] == pattern and cfg["experiment"] == "swax_1.4b"
    with torch.device("meta"):
        n_params = SWAXModel(arch).num_params()
    assert abs(n_params - 1.4e9) / 1.4e9 < 0.05, f"{pattern}: {n_params / 1e9:.3f}B"


@pytest.mark.parametrize("arm", ["tiny", "tiny_w16", "tiny_stochastic", "tiny_A", "tiny_S", "tiny_X", "tiny_SD",
                                 "tiny_SA"])
def test_tiny_arms_resolve(parser, arm):
    cfg = resolve(parser, CONFIGS / f"{arm}.yaml")
    assert cfg["trainer"]["accelerator"] == "cpu"
    assert EvalSuite(**cfg["eval"]).enabled


# ---- the config hub: every file in configs/ goes through the real parser ---------------------------------------
ARM_FILES = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", ARM_FILES, ids=lambda path: path.name)
def test_every_config_parses_and_builds(parser, path):
    """Types and field names checked by the parser, values by the classes the run builds from them (the data
    module is not built: it reads the corpus and tokenizer files that a paper config expects on its cluster), and
    the run folder named by experiment/arm."""
    cfg = parse(parser, path)
    plain = without_paths(cfg.as_dict())
    LanguageModule(**plain["model"])
    StochasticWindow(**plain["window"])
    EvalSuite(**plain["eval"])
    assert name_run(cfg) == Path(cfg.trainer.logger.init_args.save_dir) / cfg.experiment / cfg.arm


def test_every_file_in_configs_is_a_config_or_a_used_section():
    """No stray files, and every section file in configs/base/ is included by an arm (so the test above parses it)."""
    assert [p.name for p in CONFIGS.rglob("*") if p.is_file() and p.suffix != ".yaml"] == []
    included = {(arm.parent / value).resolve() for arm in ARM_FILES
                for value in yaml.safe_load(arm.read_text()).values() if isinstance(value, str)}
    assert sorted(p.name for p in (CONFIGS / "base").glob("*.yaml") if p.resolve() not in included) == []
