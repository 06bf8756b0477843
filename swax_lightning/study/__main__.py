"""`python -m swax_lightning.study ...`, the study's command before `swax study` (the package took the module's
name): the same command."""
from swax_lightning.study.sweep import main

main()
