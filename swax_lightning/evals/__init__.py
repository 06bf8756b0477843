"""Evaluations behind `main.py test`: RULER needle-in-a-haystack, BABILong, perplexity by position, lm-eval tasks.
suite.py runs the configured set and writes the reports."""
