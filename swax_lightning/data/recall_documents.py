"""Synthetic long-range recall: training documents that give a small model's memory something to do, and the
held-out samples that measure it.

Two kinds (RecallMix.kind): `facts`, below, and `mqar`, multi-query associative recall episodes (mqar_episodes.py:
pairs of short keys and one-letter values, a gap of filler, then every key asked again).

A `facts` training document is a stream of facts and questions in RULER's needle wording:

    One of the special magic numbers for kavolu is: 4819273.
    What is the special magic number for kavolu? The special magic number for kavolu is: 4819273.

A question repeats a fact stated `distance` characters before (measured from the fact's last mention); its value is
predictable only by remembering. Distances follow a documented mixture: with probability 1 - far_share uniform in
[min_distance, near_limit) (most recalls are short, as in natural text), else uniform in [near_limit, max_distance]
(beyond the long window). Distances run from the fact's start (its last mention) to the question's start, and the
question names the mention nearest that point. Statements are 57-95 characters, so a distance under one statement
mostly names the statement just before the question, and the position rather than the key says which fact is asked:
a `min_distance` above a statement's length (100) removes most of that shortcut.
With the byte tokenizer characters are tokens.

Held-out samples (`eval_sample`) share nothing with training but the wording: keys are adjective-noun words (RULER's
list) instead of made-up syllable words, values come from another seed, and the filler between fact and question is
generated prose (evals/essay.py) that no training document contains. The model's loss on the answer's tokens, as a
function of the distance, is the study's continuous measure of memory (evals/recall_loss.py).

Everything is a pure function of (seed, index): the same corpus on every machine.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from swax_lightning.data import mqar_episodes as mqar

FACT = "One of the special magic numbers for {key} is: {value}.\n"
QUESTION = "What is the special magic number for {key}? The special magic number for {key} is: "
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


KINDS = ("facts", "mqar")


@dataclass(frozen=True)
class RecallMix:
    """How many training recall documents there are, of which kind, and how they place their recalls.

    Args:
        documents: Recall documents added to the training split (TextDataModule's `recall`).
        kind: facts (RULER-worded facts and questions) or mqar (associative recall episodes, mqar_episodes.py).
        min_distance: facts: shortest fact-to-question distance (characters).
        near_limit: facts: near recalls are drawn below this distance (set it to the long window).
        max_distance: facts: longest distance (set it below the training length, so fact and question share a block).
        far_share: facts: share of questions drawn in [near_limit, max_distance].
        question_share: facts: share of statements that are questions (the rest state new facts).
        pairs: mqar: key-value pairs per episode.
        key_length: mqar: letters per key (from 2 on, only the whole key names its value).
        max_gap: mqar: training gaps (filler characters between the pairs and their queries) are uniform in
            [0, max_gap]; every training pair then lies within mqar.max_reach(pairs, key_length, max_gap) tokens of
            its query (byte tokenizer). Inside the long window, a window arm cannot tell "beyond the window" from
            "beyond what training asked"; beyond it, the memory has recalls to learn.
        fresh_chars: mqar: an episode's keys share no letter with those of any episode ending within this many
            characters before it: no query has a stale pair with its key this close (set it to the long window).
        copy_share: mqar: share of a document's episodes that are copy episodes (a span of capitals, "=", the span
            again: the in-window task a short window cannot do; swax_lightning/data/mqar_episodes.py). In [0, 1].
        copy_lengths: mqar: [shortest, longest] copied span, drawn uniformly (keep the longest below the long
            window, so that the long window copies every span).
        doc_chars: Characters per document.
        short_gap_steps: mqar: optimizer steps at the start of training that read only recall documents whose gaps
            are at most `short_max_gap` (no text), before the mixed training split: the phase in which attention
            forms a lookup by key, which it does not when long gaps and text come from the first step
            (docs/study/what_was_tried.md 17-18). 0 = no such phase.
        short_max_gap: mqar: the largest gap of the short-gap phase's episodes.
        short_gap_documents: mqar: documents written for that phase (a split of their own, `short_gaps/`); they
            must fill its batches on every rank (checked when training starts, naming this field).
    """

    documents: int = 0
    kind: str = "facts"
    min_distance: int = 8
    near_limit: int = 128
    max_distance: int = 900
    far_share: float = 0.25
    question_share: float = 0.4
    pairs: int = 8
    key_length: int = 1
    max_gap: int = 16
    fresh_chars: int = 64
    copy_share: float = 0.0
    copy_lengths: tuple[int, int] = (8, 48)
    doc_chars: int = 8192
    short_gap_steps: int = 0
    short_max_gap: int = 16
    short_gap_documents: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"RecallMix.kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if self.kind == "mqar":
            mqar.check_shape(self.pairs, self.key_length, self.max_gap, "RecallMix", self.fresh_chars)
        if not 0 < self.min_distance < self.near_limit <= self.max_distance:
            raise ValueError(f"RecallMix: need 0 < min_distance ({self.min_distance}) < near_limit "
                             f"({self.near_limit}) <= max_distance ({self.max_distance})")
        if self.documents < 0:
            raise ValueError(f"RecallMix.documents must be >= 0 (got {self.documents})")
        lengths = tuple(self.copy_lengths)
        if len(lengths) != 2 or not 1 <= lengths[0] <= lengths[1]:
            raise ValueError(f"RecallMix.copy_lengths must be [shortest, longest] with 1 <= shortest <= longest "
                             f"(got {list(lengths)})")
        object.__setattr__(self, "copy_lengths", lengths)  # a YAML list, kept as a tuple (hashable, as the default)
        self._check_short_gap_phase()
        for name in ("far_share", "question_share", "copy_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"RecallMix.{name} must be in [0, 1] (got {getattr(self, name)})")

    def _check_short_gap_phase(self) -> None:
        if self.short_gap_steps < 0:
            raise ValueError(f"RecallMix.short_gap_steps must be >= 0 (got {self.short_gap_steps})")
        if not self.short_gap_steps:
            return
        if self.kind != "mqar":
            raise ValueError(f"RecallMix.short_gap_steps is for kind mqar (got kind {self.kind!r})")
        if not 0 <= self.short_max_gap <= self.max_gap:
            raise ValueError(f"RecallMix.short_max_gap must be in [0, max_gap = {self.max_gap}] "
                             f"(got {self.short_max_gap})")
        if self.short_gap_documents < 1:
            raise ValueError(f"RecallMix.short_gap_documents must be >= 1 with short_gap_steps "
                             f"{self.short_gap_steps} (got {self.short_gap_documents})")

    @property
    def short_gap_phase(self) -> RecallMix | None:
        """The mix of the short-gap phase's documents (gaps up to short_max_gap), or None without one."""
        return replace(self, max_gap=self.short_max_gap) if self.short_gap_steps else None

    @property
    def has_context_only(self) -> bool:
        """Whether its documents hold context-only tokens (loss_mask.py): an MQAR document is scored on its queried
        values alone."""
        return self.kind == "mqar"

    @property
    def copies(self) -> mqar.Copies:
        return mqar.Copies(self.copy_share, self.copy_lengths)

    def distance(self, rng: random.Random) -> int:
        if rng.random() < self.far_share:
            return rng.randint(self.near_limit, self.max_distance)
        return rng.randint(self.min_distance, self.near_limit - 1)


def syllable_key(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(3))


def number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def training_pieces(index: int, mix: RecallMix, seed: int = 0) -> list[tuple[str, bool]]:
    """Document `index` as (text, scored) pieces: a facts document is one scored piece; an MQAR document is scored on
    its queried values only (each a piece of its own, so that its tokens are exact whatever the tokenizer)."""
    if mix.kind == "mqar":
        return mqar.training_pieces(index, mix.pairs, mix.key_length, mix.max_gap, mix.doc_chars, seed,
                                    mix.fresh_chars, mix.copies)
    return [(training_document(index, mix, seed)[0], True)]


def training_document(index: int, mix: RecallMix, seed: int = 0) -> tuple[str, list[int]]:
    """(text, the distance of every question in it) of document `index`; for kind mqar, the reach of every query."""
    if mix.kind == "mqar":
        return mqar.training_document(index, mix.pairs, mix.key_length, mix.max_gap, mix.doc_chars, seed,
                                      mix.fresh_chars, mix.copies)
    rng = random.Random(f"recall-train-{seed}-{index}")
    parts, length, last_mention, values, distances = [], 0, [], {}, []
    while length < mix.doc_chars:
        if last_mention and rng.random() < mix.question_share:
            target = length - mix.distance(rng)
            pos, key = min(last_mention, key=lambda m: abs(m[0] - target))
            last_mention.remove((pos, key))
            text = QUESTION.format(key=key) + values[key] + ".\n"
            distances.append(length - pos)
        else:
            key = syllable_key(rng)
            values[key] = number(rng)
            text = FACT.format(key=key, value=values[key])
        last_mention.append((length, key))
        parts.append(text)
        length += len(text)
    return "".join(parts), distances


@dataclass
class RecallSample:
    distance: int      # characters between the end of the fact and the start of the question
    key: str
    value: str
    prompt: str        # everything before the answer
    index: int

    @property
    def reach(self) -> int:
        """Characters from the fact's value to the answer (the same offset for every digit): how far back a layer
        must see to copy the answer. The fact's tail and the question lie between them, so reach > distance + 90."""
        return len(self.prompt) - self.prompt.index(self.value)


def eval_sample(distance: int, index: int, filler: list[str], keys: list[str], seed: int = 0) -> RecallSample:
    """A held-out recall: a fact, `distance` characters of filler sentences, then the question; the answer is the
    value. `filler` are prose sentences and `keys` held-out key words (see the module docstring)."""
    rng = random.Random(f"recall-eval-{seed}-{distance}-{index}")
    key, value = rng.choice(keys), number(rng)
    sentences, n = [], 0
    while n < distance:
        sentence = rng.choice(filler) + " "
        sentences.append(sentence)
        n += len(sentence)
    gap = "".join(sentences)[:distance]
    prompt = FACT.format(key=key, value=value) + gap + "\n" + QUESTION.format(key=key)
    return RecallSample(distance, key, value, prompt, index)
