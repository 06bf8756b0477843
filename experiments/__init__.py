"""Training experiments that are not benchmarks: each trains small models to answer one question of the window study
(run them as `python -m experiments.<name>`; their findings are in docs/study/)."""
