"""swax-lightning: hybrid sliding-window-attention + mLSTM language models and the short/stochastic-window recipe.

The package is a house of layers, each a subpackage that imports only those below it (tests/test_layers.py checks it):
core (files, errors) and kernels at the bottom; model and data side by side (neither imports the other); training;
evals; pretrained and study; commands on top. docs/extending.md says where a new layer letter, evaluation or pretrained
family goes.
"""
__version__ = "0.1.0"  # the one place of the version (pyproject.toml reads it)

from swax_lightning.core import kernels_name, moved

kernels_name.install()  # an installed `kernels` (Hugging Face's) is never shadowed by kernels/ (core/kernels_name.py)
moved.install()  # the flat layout's module names answer with their new homes (core/moved.py)
