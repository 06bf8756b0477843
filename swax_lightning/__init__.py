"""swax-lightning: hybrid sliding-window-attention + mLSTM language models and the short/stochastic-window recipe."""
from swax_lightning.config import ConfigError, ModelConfig
from swax_lightning.model import SWAXModel

__all__ = ["ConfigError", "ModelConfig", "SWAXModel"]
