"""Evaluations behind `main.py test`, one file each (registry.py): RULER needle-in-a-haystack, BABILong, loss by
position, answer loss by recall distance, associative recall (MQAR) by gap, lm-evaluation-harness tasks. suite.py runs
the configured set and writes the reports."""
