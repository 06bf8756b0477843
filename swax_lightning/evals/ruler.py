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
  as closely as the tokenizer allows, never more.
- The queried needle sits at the requested depth, measured in characters of the haystack (0 = first, 1 = last), for
  every haystack (RULER places needles at random in the noise and needle haystacks); other needles of the sample go to
  seeded random places. Everything is a pure function of (seed, task, length, depth, index).
- Depths: RULER's grid of 40 evenly spaced depths (depth_grid). With a few depths that include 1.0, a model that sees
  only its last W tokens finds the needle right before the question in one sample of five and scores 20 at any
  length; over 40 depths its score is the share of the haystack inside its window (tests/evals/test_ruler.py).
- The essay haystack is generated prose (essay.py: no training corpus here holds it) unless a text is given; key
  words come from words.txt beside this file.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from swax_lightning.evals.essay import generated_essay, prose_sentences

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
