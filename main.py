"""Command line of swax-lightning: LightningCLI over LanguageModule and TextDataModule.

    python main.py fit  --config configs/tiny.yaml
    python main.py test --config configs/tiny.yaml --ckpt_path runs/tiny/version_0/checkpoints/last.ckpt
    python main.py fit  --config configs/tiny.yaml --print_config

Every field of the YAML is a documented argument of LanguageModule (model:), TextDataModule (data:) or the Trainer.
"""
from lightning.pytorch.cli import LightningCLI

from swax_lightning.data import TextDataModule
from swax_lightning.module import LanguageModule


def main() -> None:
    LightningCLI(LanguageModule, TextDataModule, seed_everything_default=0,
                 save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
