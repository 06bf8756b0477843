"""Test helper callback: records the window each rank trained every step at, one JSON file per rank."""
import json
import os
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class RecordWindows(Callback):
    def __init__(self, out_dir: str):
        self.out_dir, self.windows = Path(out_dir), {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.windows[trainer.global_step - 1] = pl_module.model.window  # global_step has just advanced

    def on_train_end(self, trainer, pl_module):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        name = f"rank{trainer.global_rank}-pid{os.getpid()}.json"
        (self.out_dir / name).write_text(json.dumps(self.windows))
