"""RULER needle-in-a-haystack (NIAH): the eight tasks, generated offline, scored with string_match_all.

Spec (RULER's synthetic.yaml and niah.py). A needle is "One of the special magic {type} for {key} is: {value}.";
haystacks are noise (five fixed sentences repeated), essay (long English prose) or needle (distractor needles only);
keys and values are adjective-noun words, 7-digit numbers or uuid4s. The prompt asks for all the special magic {type}
for the queried key(s) and ends with the answer prefix; the model continues it greedily (up to 128 tokens) and the
score is the share of references found in the continuation (case-insensitive substring), x 100. When a task has one
value for one query (6 of the 8 tasks) the prompt is rewritten in the singular, as RULER does ("A special magic
number is hidden ... What is the special magic number for ..."). Noise and needle haystacks are joined by newlines,
essay sentences by spaces, as in RULER.

Decisions:
- Context length is counted in the model's own tokens: the haystack is sized by bisection on its number of units,
  then on the words of one more partial unit, so that prompt + answer prefix fill `length - max_new_tokens` tokens
  as closely as the tokenizer allows, never more. That last unit ends mid-sentence, by design: RULER sizes its
  essay haystack by a count of words as well (a sentence there is cut wherever the count ends), and a whole-unit
  haystack would fall short of the length by up to a unit (a noise block, a needle).
- The queried needle sits at the requested depth, measured in characters of the haystack (0 = first, 1 = last), for
  every haystack (RULER places needles at random in the noise and needle haystacks); other needles of the sample go to
  seeded random places. Everything is a pure function of (seed, task, length, depth, index).
- Depths: RULER's grid of 40 evenly spaced depths (depth_grid), kept exact (i / 39) where RULER rounds it to whole
  percents (np.round(np.linspace(0, 100, 40))): each depth is within half a point of RULER's. With a few depths
  that include 1.0, a model that sees only its last W tokens finds the needle right before the question in one
  sample of five and scores 20 at any length; over 40 depths its score is the share of the haystack inside its
  window (tests/evals/test_ruler.py).
- The essay haystack is generated prose (essay.py: no training corpus here holds it) unless a text is given; key
  words come from words.txt beside this file.
- In the suite (`eval.niah`, class NIAH), needle depths follow RULER's grid (40 evenly spaced depths by default) and
  are dealt so that every (task, length, depth) cell gets the same number of samples: sample i of a task at a length
  takes depth number i mod n_depths, so `samples` must be a multiple of the number of depths. Reports: a table by
  task and length, and heatmaps of accuracy by depth x length (all tasks pooled, and per task).
"""
from __future__ import annotations

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from swax_lightning.core.errors import ConfigError, require, require_among
from swax_lightning.evals.essay import generated_essay, prose_sentences
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import lengths_of, score_table, summarize, table_scalars

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type} for {key} is: {value}."
TEMPLATE = ("Some special magic {type} are hidden within the following text. Make sure to memorize it. I will quiz you "
            "about the {type} afterwards.\n{context}\nWhat are all the special magic {type} for {query} mentioned in "
            "the provided text? The special magic {type} for {query} mentioned in the provided text are")
N_DEPTHS = 40

TASKS = {  # haystack, key kind, value kind, keys, values per key, queried keys
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
}


@dataclass
class NIAHSample:
    task: str
    length: int
    depth: float                  # requested depth of the queried needle (0 = start, 1 = end)
    index: int                    # with (seed, task, length, depth): all it takes to regenerate the sample
    input_text: str               # prompt + answer prefix: what the model continues
    question: str                 # the question line of the prompt
    references: list[str]
    n_tokens: int                 # tokens of input_text in the model's tokenizer
    needle_char: int              # where the queried needle starts in input_text
    context_span: tuple[int, int] = field(default=(0, 0))  # the haystack's [start, end) in input_text


def load_words() -> tuple[list[str], list[str]]:
    """The adjectives and the nouns of words.txt (sections '# adjectives' and '# nouns')."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in (Path(__file__).parent / "words.txt").read_text().splitlines():
        if line.startswith("# "):
            current = sections.setdefault(line[2:].strip(), [])
        elif line.strip():
            current.append(line.strip())
    return sections["adjectives"], sections["nouns"]


def depth_grid(n: int = N_DEPTHS) -> list[float]:
    """n evenly spaced needle depths from 0 (start of the haystack) to 1 (its end), RULER's grid for n = 40."""
    if n < 1:
        raise ValueError(f"the depth grid needs at least one depth (got {n})")
    return [0.5] if n == 1 else [round(i / (n - 1), 6) for i in range(n)]


def prompt_template(value_kind: str, singular: bool) -> str:
    """The prompt with {context} and {query} left to fill, in RULER's singular when asked."""
    template = TEMPLATE
    if singular:  # RULER's rewrite, in its order ("are all" before "are")
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        value_kind = value_kind[:-1]
    return template.replace("{type}", value_kind)


def largest_fitting(ok) -> int:
    """The largest k >= 0 with ok(k), for ok true at 0 and monotone: doubling, then bisection. Sizes haystacks so
    that a prompt fills a token budget with a logarithmic number of tokenizations."""
    lo, hi = 0, 1
    while ok(hi):
        lo, hi = hi, 2 * hi
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's score: percentage of references contained (case-insensitively) in the prediction."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    pred = prediction.lower()
    return 100.0 * sum(ref.lower() in pred for ref in references) / len(references)


class NIAHGenerator:
    """Builds NIAH samples for one tokenizer."""

    def __init__(self, tokenizer, max_new_tokens: int = 128, essay: str | None = None, seed: int = 0):
        self.tokenizer, self.max_new_tokens, self.seed = tokenizer, max_new_tokens, seed
        self.adjectives, self.nouns = load_words()
        text = essay if essay is not None else generated_essay(seed=seed)
        self.essay_sentences = prose_sentences(text)
        if len(self.essay_sentences) < 10:
            raise ValueError("the essay haystack needs at least 10 sentences of prose")

    def _value(self, kind: str, rng: random.Random) -> str:
        if kind == "numbers":
            return str(rng.randint(1_000_000, 9_999_999))
        if kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return f"{rng.choice(self.adjectives)}-{rng.choice(self.nouns)}"

    def _units(self, haystack: str, n: int, rng: random.Random, key_kind: str, value_kind: str, keys: set[str]):
        if haystack == "noise":
            return [NOISE] * n
        if haystack == "essay":
            start = rng.randrange(len(self.essay_sentences))
            return [self.essay_sentences[(start + i) % len(self.essay_sentences)] for i in range(n)]
        units = []
        while len(units) < n:
            key = self._value(key_kind, rng)
            if key not in keys:
                units.append(NEEDLE.format(type=value_kind, key=key, value=self._value(value_kind, rng)))
        return units

    def sample(self, task: str, length: int, depth: float, index: int = 0) -> NIAHSample:
        if task not in TASKS:
            raise ValueError(f"unknown NIAH task {task!r}; known: {', '.join(TASKS)}")
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1] (got {depth})")
        haystack, key_kind, value_kind, n_keys, n_values, n_queries = TASKS[task]
        rng = random.Random(f"{self.seed}/{task}/{length}/{depth}/{index}")
        keys = []
        while len(keys) < n_keys:
            key = self._value(key_kind, rng)
            keys.append(key) if key not in keys else None
        needles = [(key, self._value(value_kind, rng)) for key in keys for _ in range(n_values)]
        queried = keys[:n_queries]
        references = [value for key, value in needles if key in queried]
        query = ", ".join(queried[:-1]) + (", and " if n_queries > 1 else "") + queried[-1]
        other_depths = [rng.random() for _ in needles[1:]]
        template = prompt_template(value_kind, singular=n_values * n_queries == 1)
        unit_seed = rng.random()

        def build(n_units: int, extra_words: int = 0) -> tuple[str, int, tuple[int, int]]:
            units = self._units(haystack, n_units + 1, random.Random(unit_seed), key_kind, value_kind, set(keys))
            units[-1] = " ".join(units[-1].split()[:extra_words])  # a partial unit fills the last few tokens
            units = [u for u in units if u]
            texts = [NEEDLE.format(type=value_kind, key=k, value=v) for k, v in needles]
            for d, text in zip(other_depths, texts[1:]):
                units.insert(round(d * len(units)), text)
            offsets = [0]
            for unit in units:
                offsets.append(offsets[-1] + len(unit) + 1)
            slot = min(range(len(offsets)), key=lambda i: abs(offsets[i] - depth * offsets[-1]))
            units.insert(slot, texts[0])
            context = (" " if haystack == "essay" else "\n").join(units)
            head = template.split("{context}")[0]
            text = template.replace("{query}", query).replace("{context}", context)
            return text, len(head) + offsets[slot], (len(head), len(head) + len(context))

        budget = length - self.max_new_tokens
        fits = lambda n, w=0: self._count(build(n, w)[0]) <= budget  # noqa: E731
        if not fits(0):
            raise ValueError(f"{task}: length {length} is too short for the needles and the question "
                             f"({self._count(build(0)[0])} tokens before any haystack, plus {self.max_new_tokens} "
                             f"to generate)")
        n = largest_fitting(fits)
        unit_words = len(self._units(haystack, n + 1, random.Random(unit_seed), key_kind, value_kind,
                                     set(keys))[-1].split())
        words = largest_fitting(lambda w: w <= unit_words and fits(n, w))
        text, needle_char, span = build(n, words)
        question = text[span[1]:].strip().split("?")[0] + "?"
        return NIAHSample(task, length, depth, index, text, question, references, self._count(text), needle_char, span)

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


# ---- the evaluation of `main.py test` -----------------------------------------------------------------------------
INTERVAL_NOTE = ("95% Wilson score intervals on the mean share; exact in spirit for 0/100 scores, an approximation "
                 "for the partial scores of niah_multivalue and niah_multiquery")


@dataclass
class NIAHSettings:
    """RULER needle-in-a-haystack.

    Args:
        tasks: RULER NIAH tasks (niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery).
        lengths: Context lengths in the model's tokens.
        samples: Samples per task and length; a multiple of the number of depths (each depth gets
            samples / n_depths of them, for every task and length).
        depths: Needle depths (0 = start of the haystack, 1 = end), or their number for an evenly spaced grid
            (RULER: 40).
        max_new_tokens: Generation budget of each answer (RULER: 128).
    """

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    lengths: list[int] = field(default_factory=lambda: [4096, 8192, 16384, 32768, 65536, 131072])
    samples: int = 40
    depths: int | list[float] = N_DEPTHS
    max_new_tokens: int = 128

    def __post_init__(self) -> None:
        require_among("eval.niah.tasks", self.tasks, TASKS)
        require(bool(self.lengths) and all(n >= 1 for n in self.lengths), "eval.niah.lengths",
                "must be lengths >= 1", self.lengths)
        self.depths = depth_grid(self.depths) if isinstance(self.depths, int) else list(self.depths)
        require(bool(self.depths) and all(0 <= d <= 1 for d in self.depths), "eval.niah.depths",
                "must be depths in [0, 1] or their number", self.depths)
        require(self.samples >= 1 and self.samples % len(self.depths) == 0, "eval.niah.samples",
                f"must be a multiple of the {len(self.depths)} depths (each depth the same number of samples)",
                self.samples)
        require(self.max_new_tokens >= 1, "eval.niah.max_new_tokens", "must be >= 1", self.max_new_tokens)


@register
class NIAH(Evaluation):
    name, title, order, Settings = "niah", "RULER NIAH", 10, NIAHSettings

    def generator(self, tokenizer) -> NIAHGenerator:
        return NIAHGenerator(tokenizer, self.settings.max_new_tokens, self.context.essay, self.context.seed)

    def check(self, arch, data) -> None:
        if data is None:
            return
        generator, shortest = self.generator(data.tokenizer), min(self.settings.lengths)
        for task in self.settings.tasks:
            try:
                generator.sample(task, shortest, self.settings.depths[0], 0)
            except ValueError as err:
                raise ConfigError(f"eval.niah.lengths: {err}") from None

    def jobs(self) -> list[tuple[str, int, int, float]]:
        """(task, length, index, depth) of every sample: each task, at each length, takes every depth
        samples / n_depths times."""
        s, depths = self.settings, self.settings.depths
        return [(task, length, i, depths[i % len(depths)]) for length in s.lengths for task in s.tasks
                for i in range(s.samples)]

    def workload(self) -> tuple[int, int, int]:
        s = self.settings
        prompts = len(s.tasks) * s.samples * len(s.lengths)
        return prompts, len(s.tasks) * s.samples * sum(s.lengths), prompts * s.max_new_tokens

    def run(self, model, data, samples: list) -> dict:
        generator, scores = self.generator(data.tokenizer), defaultdict(list)
        for length in self.settings.lengths:  # a batch's prompts share a length: little padding
            jobs, drawn = [job for job in self.jobs() if job[1] == length], []
            predictions = self.context.generate(model, data.tokenizer, prompts(generator, jobs, drawn),
                                                self.settings.max_new_tokens, self.name, length,
                                                desc=f"RULER NIAH {length}", total=len(jobs))
            for (task, _, i, depth), sample, prediction in zip(jobs, drawn, predictions):
                score = string_match_all(prediction, sample.references)
                scores[(task, length, depth)].append(score)
                samples.append({"eval": "niah", "task": task, "length": length, "depth": depth, "index": i,
                                "tokens": sample.n_tokens, "question": sample.question,
                                "references": sample.references, "prediction": prediction, "score": score,
                                "regenerate": f"niah {task} {length} {depth} {i}"})
        return {**summarize(scores), "interval": INTERVAL_NOTE}

    @classmethod
    def report(cls, section: dict) -> list[str]:
        return score_table("RULER NIAH (string_match_all, %; columns: context length in model tokens)", section)

    @classmethod
    def scalars(cls, section: dict) -> dict[str, float]:
        return table_scalars(cls.name, section)

    @classmethod
    def figures(cls, section: dict) -> dict:
        return {"niah_heatmap" + (f"_{task}" if task else ""): heatmap_figure(section, task)
                for task in (None, *section["depth_x_length_by_task"])}


def prompts(generator: NIAHGenerator, jobs: list, drawn: list):
    """The prompts of `jobs` (task, length, index, depth), drawn as a batch needs them (131k-token prompts are not all
    held at once); each sample goes to `drawn` without its prompt, for scoring."""
    for task, length, i, depth in jobs:
        sample = generator.sample(task, length, depth, i)
        drawn.append(replace(sample, input_text=""))
        yield sample.input_text


def heatmap_figure(niah: dict, task: str | None = None):
    """NIAH mean score by needle depth (rows) x context length in tokens (columns), of one task or (task None) of
    all tasks pooled; cells without samples blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = niah["depth_x_length"] if task is None else niah["depth_x_length_by_task"][task]
    depths, lengths = list(grid), lengths_of(grid)
    values = np.ma.masked_invalid([[grid[d][n]["mean"] if n in grid[d] else np.nan for n in lengths]
                                   for d in depths])
    counts = {grid[d][n]["n"] for d in depths for n in lengths if n in grid[d]}
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 3, 0.22 * len(depths) + 2))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="white")
    image = ax.imshow(values, vmin=0, vmax=100, cmap=cmap, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{int(n) // 1024}k" if int(n) >= 1024 else n for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{float(d):.0%}" for d in depths], fontsize=7 if len(depths) > 12 else 9)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth (share of the haystack)")
    n_text = "/".join(str(n) for n in sorted(counts))
    pooled = f"mean over {len(niah['depth_x_length_by_task'])} tasks" if task is None else task
    ax.set_title(f"RULER NIAH accuracy (%) by needle depth and context length\n({pooled}, n = {n_text} samples "
                 "per cell)", fontsize=10)
    if len(depths) <= 20:  # numbers in the cells while they stay legible
        empty = np.ma.getmaskarray(values)
        for i, j in zip(*np.nonzero(~empty)):
            ax.text(j, i, f"{values[i, j]:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    return fig
