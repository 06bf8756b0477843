"""The commands on top of every layer: `swax <verb>` (swax.py), LightningCLI's fit / validate / test / predict
(cli.py), generate, export, memory."""
