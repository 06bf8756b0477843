"""swax-lightning: hybrid sliding-window-attention + mLSTM language models and the short/stochastic-window recipe."""
__version__ = "0.1.0"  # the one place of the version (pyproject.toml reads it)

from swax_lightning.config import ConfigError, ModelConfig
from swax_lightning.model import SWAXModel

__all__ = ["ConfigError", "ModelConfig", "SWAXModel", "__version__"]
