"""`python -m swax_lightning <verb> ...`: the `swax` command (commands/swax.py) without the console script."""
from swax_lightning.commands.swax import main

main()
