"""StopAt: a Lightning callback that stops a run after a given optimizer step (for the exact-resume tests)."""
from lightning.pytorch.callbacks import Callback


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True
