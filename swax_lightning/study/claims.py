"""The paper's three claims, read from a sweep's runs seed by seed: each a paired comparison of two arms with the
same seed (the same data order, recall episodes and initial draws: the run's seed sets them all), given as "k of n
seeds" and the mean difference with a 95% bootstrap interval over seeds, and a verdict from that interval.

1. Beyond the long window, the short and the stochastic windows recall more than the long one: MQAR accuracy averaged
   over the gaps at which every pair lies beyond the long window, each of w_short, stochastic_* against w_long.
2. The long window wins short context: span copying inside the long window (copy accuracy averaged over the span
   lengths below it), w_long above w_short; and test bits per byte (the whole test split), w_long lower.
3. The stochastic window keeps the long window's short context: each stochastic_* arm better than w_short on both
   short-context measures, and not worse than w_long (the interval of stochastic - long reaches 0 or lies on the
   better side).

Decisions:
- "holds" only where the interval excludes 0 in the claimed direction (for claim 3's second half: does not exclude 0
  the wrong way); with 5 seeds a bootstrap interval is coarse, so the k-of-n count is printed beside it; under 3
  paired seeds there is no verdict (one seed's "interval" is a point), and a claim whose arms or measures are
  missing says "not measured".
- Arms are found by their file names (the study's convention: w_short, w_long, stochastic_p*); the long window is
  the largest evaluation window of the runs (results.json settings).
- Bootstrap: 10,000 resamples of the seeds, numpy's generator at seed 0: the report is a pure function of the runs.
"""
from __future__ import annotations

import math

import numpy as np

RESAMPLES = 10_000
MIN_SEEDS = 3  # fewer paired seeds give no interval worth the name: the row gives k of n and says so


def paired(a: dict[int, float], b: dict[int, float]) -> dict | None:
    """a - b over the seeds both have (NaN-free): {"n", "k" (seeds with a > b), "mean", "ci95"}; None if no seed."""
    seeds = sorted(s for s in a.keys() & b.keys() if not (math.isnan(a[s]) or math.isnan(b[s])))
    if not seeds:
        return None
    d = np.array([a[s] - b[s] for s in seeds])
    means = d[np.random.default_rng(0).integers(0, len(d), (RESAMPLES, len(d)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"n": len(d), "k": int((d > 0).sum()), "mean": float(d.mean()), "ci95": [float(low), float(high)]}


def _per_seed(runs: dict, arm: str, measure) -> dict[int, float]:
    return {seed: measure(run) for (name, seed), run in runs.items() if name == arm}


def _row(claim: str, better: str, worse: str, what: str, d: dict | None, holds) -> str:
    if d is None:
        return f"| {claim} | {better} vs {worse} | {what} | not measured | | |"
    verdict = (f"too few seeds for a verdict (n < {MIN_SEEDS})" if d["n"] < MIN_SEEDS
               else "holds" if holds(d) else "does not hold")
    return (f"| {claim} | {better} vs {worse} | {what} | {d['k']} of {d['n']} | {d['mean']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {verdict} |")


def mqar_beyond(results: dict, long_window: int | None) -> float:
    """Mean MQAR accuracy of a results.json over the gaps whose every pair lies beyond the long window (shortest
    reach > it); NaN without such gaps."""
    return _mean([g["accuracy"] for g in results.get("mqar", {}).get("gaps", [])
                  if long_window and g["reach"][0] > long_window])


def copy_inside(results: dict, long_window: int | None) -> float:
    """Mean span-copy accuracy of a results.json over the span lengths the long window copies (reach <= it)."""
    return _mean([c["accuracy"] for c in results.get("copy", {}).get("lengths", [])
                  if long_window and c["reach"] <= long_window])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def claims(runs: dict, test_bpb, long_window: int | None) -> list[str]:
    """The report's section: a table row per comparison; `test_bpb(run)` -> a run's test bits per byte (NaN when
    absent)."""
    arms = sorted({arm for arm, _ in runs})
    stochastic = [arm for arm in arms if arm.startswith("stochastic")]

    def recall_beyond(run: dict) -> float:
        return mqar_beyond(run["results"], long_window)

    def copying(run: dict) -> float:
        return copy_inside(run["results"], long_window)

    def negated_bpb(run: dict) -> float:  # higher is better, as for the accuracies
        return -test_bpb(run)

    def has(*names: str) -> bool:
        return all(name in arms for name in names)

    def compare(claim: str, better: str, worse: str, what: str, measure, holds) -> str:
        d = paired(_per_seed(runs, better, measure), _per_seed(runs, worse, measure)) if has(better, worse) else None
        return _row(claim, better, worse, what, d, holds)

    def excludes_0(d: dict) -> bool:
        return d["ci95"][0] > 0

    def reaches_0(d: dict) -> bool:
        return d["ci95"][1] >= 0

    beyond = f"MQAR accuracy beyond W = {long_window} (points)"
    short_context = [(f"copy accuracy inside W = {long_window} (points)", copying),
                     ("test bits per byte (negated)", negated_bpb)]
    lines = ["## The paper's claims, seed by seed\n",
             "Each row pairs two arms seed by seed (a seed sets the data, the recall episodes, the windows and the "
             "initial weights of both): in how many seeds the first arm is better, and the mean difference (first - "
             "second; for bits per byte, second - first, so that positive means the first is better) with a 95% "
             "bootstrap interval over seeds. A claim holds where the interval excludes 0 in its direction.\n",
             "| claim | arms | measure | seeds where the first is better | mean difference [95% interval] | "
             "verdict |", "|---|---|---|---|---|---|"]
    for arm in ["w_short", *stochastic]:
        lines.append(compare("1. recall beyond the long window", arm, "w_long", beyond, recall_beyond, excludes_0))
    for what, measure in short_context:
        lines.append(compare("2. the long window wins short context", "w_long", "w_short", what, measure,
                             excludes_0))
    for arm in stochastic:
        for what, measure in short_context:
            lines.append(compare("3. stochastic keeps short context: better than short", arm, "w_short", what,
                                 measure, excludes_0))
            lines.append(compare("3. ... and not worse than long", arm, "w_long", what, measure, reaches_0))
    return lines + [""]
