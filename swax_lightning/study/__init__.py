"""The window study: every arm and seed trained with `main.py fit` and evaluated with `main.py test`, then
collected into one table and plots (sweep.py)."""
