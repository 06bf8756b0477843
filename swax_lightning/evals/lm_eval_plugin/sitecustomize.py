"""Makes `lm_eval --model swax` work from lm-eval's own command line in an environment that setup.sh did not make (its
start-up file does the same everywhere else): Python imports `sitecustomize` at start-up from the first folder of
sys.path that has one, so putting this folder (and the repository) on PYTHONPATH registers the model before the
harness looks it up:

    PYTHONPATH=$PWD:$PWD/swax_lightning/evals/lm_eval_plugin lm_eval --model swax --model_args ckpt_path=... --tasks ...

It loads ../lm_eval_register.py by its path, not as part of the package, so that starting Python does not import
torch and the model; it installs the hook that registers the name once lm-eval is imported, and without lm-eval
installed it does nothing.
"""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("swax_lm_eval_register",
                                               Path(__file__).resolve().parent.parent / "lm_eval_register.py")
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
