"""Synthetic long-range recall: training documents that give a small model's memory something to do, and the
held-out samples that measure it.

A training document is a stream of facts and questions in RULER's needle wording:

    One of the special magic numbers for kavolu is: 4819273.
    What is the special magic number for kavolu? The special magic number for kavolu is: 4819273.

A question repeats a fact stated `distance` characters before (measured from the fact's last mention); its value is
predictable only by remembering. Distances follow a documented mixture: with probability 1 - far_share uniform in
[min_distance, near_limit) (most recalls are short, as in natural text), else uniform in [near_limit, max_distance]
(beyond the long window). Distances run from the fact's start (its last mention) to the question's start, and the
question names the mention nearest that point. Statements are 57-95 characters, so distances under about 60 mostly
name the statement just before the question (79% of questions at the window study's 8-63): the position, not the
key, then says which fact is asked. A `min_distance` above a statement's length (100) mostly removes that shortcut
(13% one statement back, 46% two, the rest further).
With the byte tokenizer characters are tokens.

Held-out samples (`eval_sample`) share nothing with training but the wording: keys are adjective-noun words (RULER's
list) instead of made-up syllable words, values come from another seed, and the filler between fact and question is
generated prose (evals/essay.py) that no training document contains. The model's loss on the answer's tokens, as a
function of the distance, is the study's continuous measure of memory (evals/recall_loss.py).

Everything is a pure function of (seed, index): the same corpus on every machine.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

FACT = "One of the special magic numbers for {key} is: {value}.\n"
QUESTION = "What is the special magic number for {key}? The special magic number for {key} is: "
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


@dataclass(frozen=True)
class RecallMix:
    """How many training recall documents there are, and how they place their questions.

    Args:
        documents: Recall documents added to the training split (TextDataModule's `recall`).
        min_distance: Shortest fact-to-question distance (characters).
        near_limit: Near recalls are drawn below this distance (set it to the long window).
        max_distance: Longest distance (set it below the training length, so fact and question share a block).
        far_share: Share of questions drawn in [near_limit, max_distance].
        question_share: Share of statements that are questions (the rest state new facts).
        doc_chars: Characters per document.
    """

    documents: int = 0
    min_distance: int = 8
    near_limit: int = 128
    max_distance: int = 900
    far_share: float = 0.25
    question_share: float = 0.4
    doc_chars: int = 8192

    def __post_init__(self):
        if not 0 < self.min_distance < self.near_limit <= self.max_distance:
            raise ValueError(f"RecallMix: need 0 < min_distance ({self.min_distance}) < near_limit "
                             f"({self.near_limit}) <= max_distance ({self.max_distance})")
        if self.documents < 0:
            raise ValueError(f"RecallMix.documents must be >= 0 (got {self.documents})")
        for name in ("far_share", "question_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"RecallMix.{name} must be in [0, 1] (got {getattr(self, name)})")

    def distance(self, rng: random.Random) -> int:
        if rng.random() < self.far_share:
            return rng.randint(self.near_limit, self.max_distance)
        return rng.randint(self.min_distance, self.near_limit - 1)


def syllable_key(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(3))


def number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def training_document(index: int, mix: RecallMix, seed: int = 0) -> tuple[str, list[int]]:
    """(text, the distance of every question in it) of document `index`."""
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
