"""Command line of swax-lightning: LightningCLI over LanguageModule and TextDataModule
(swax_lightning/commands/cli.py).

    python main.py fit  --config configs/tiny.yaml
    python main.py test --config configs/tiny.yaml --ckpt_path runs/tiny/w64/checkpoints/last.ckpt
    python main.py fit  --config configs/tiny.yaml --print_config

Every field of a YAML file is a documented argument of LanguageModule (model:), TextDataModule (data:), the
StochasticWindow callback (window:), the EvalSuite callback (eval:) or Lightning's Trainer (trainer:). A configuration
error prints one line `error: ...` and exits with code 2. Installed as a package, the same command is `swax
fit|validate|test|predict ...` (`swax --help`: every verb).
"""
from swax_lightning.commands.cli import main

if __name__ == "__main__":
    main()
