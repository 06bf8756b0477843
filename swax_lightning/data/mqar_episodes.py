"""Multi-query associative recall (MQAR) written as text: the training documents of `data.recall` with kind mqar, and
the held-out episodes of the `eval.mqar.gaps` evaluation (evals/mqar.py).

An episode states `pairs` key-value pairs, then `gap` characters of filler, then asks for every key again in a new
order, each followed by its value; one episode per line. Keys are lowercase letters, values capitals, the filler
digits: the three never share a character, so the text parses without separators. With 8 pairs of one-letter keys
and gap 7:

    jXyGdBkNqVzXmAvC4837424qVyGkNzXjXvCmAdB

A value is predictable only from its key's earlier pair. Keys of `key_length` letters are spelled in a small
alphabet drawn per episode, chosen so that only the whole key names a value: every key has, for each of its
positions, another key that differs from it only there (for 2-letter keys: every letter, first or second, is shared
by two keys), so no part of a key finds its value. Values are drawn with replacement from 26 capitals; every value is
one token for the byte tokenizer and for any byte-level BPE.

The reach of a query is the number of tokens from its key's stated value to the value it asks for: a layer that
sees `reach` tokens back (a window W >= reach) can copy the answer; beyond that only a memory can. With pairs of
key_length + 1 characters it runs from gap + key_length + 1 (the last pair, asked first) to
(2 * pairs - 1) * (key_length + 1) + gap (the first pair, asked last): `max_reach`. Training documents draw gaps in
[0, max_gap], so a mix whose max_reach(max_gap) is at most the long window keeps every training pair inside it.

Decisions:
- Everything is a pure function of (seed, index) (training) or (seed, gap, index) (evaluation), through string
  seeds of separate namespaces, so the corpus and the evaluation are the same on every machine and never share an
  episode's random stream. The training seed is the run's (TextDataModule passes its seed): two seeds, two corpora.
- Fresh keys: a training episode's keys share no letter with the keys of any earlier episode that ends within
  `fresh_chars` characters before it, so no query has an earlier pair with its key (and another value) within that
  reach: set it to the long window and no stale pair is in sight of attention. A training document starts with
  `fresh_chars` filler digits, so nothing before it in the stream (another episode, or source code such as
  `getAttr`, whose `tA` reads as a pair) lies within that reach of its queries. Evaluation episodes stand alone.
- A training document is episodes up to doc_chars characters: blocks of the training split then hold many whole
  episodes, and cut at most one per block boundary. Only its queried values are scored (`training_pieces`;
  loss_mask.py): the keys, stated values and filler are random, there to be read.
- Copy episodes (the short-context task of the window study): a span of `length` random capitals, "=", the span
  again, every copied character scored: `KTQAWB=KTQAWB`. Each copied character lies length + 1 tokens after its
  original, so a window W > length copies the span exactly; a short window cannot, and a memory must hold the whole
  span in order, which a small one cannot. `copy_share` of a training document's episodes are copies (lengths
  uniform in `copy_lengths`); they hold no key letters, so they never make a stale pair.
- Episodes are tokenized piece by piece (`Episode.pieces`), each asked value alone, so its position is exact
  whatever the tokenizer (with the byte tokenizer the pieces' tokens are the whole text's).
"""
from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass
from itertools import product

LETTERS = string.ascii_lowercase
VALUES = string.ascii_uppercase
FILLER = string.digits
COPY_MARK = "="
KEY_SET_TRIES = 10_000  # random key sets tried per alphabet size (at 6 pairs of 2 letters, 7% qualify)
EXTRA_LETTERS = 2  # alphabet sizes tried beyond the fewest that spell `pairs` keys


@dataclass(frozen=True)
class Episode:
    """One MQAR episode: the text, and for each query (in order) its value, the character offset of that value in
    `text`, and its reach."""

    text: str
    gap: int
    values: list[str]
    answer_offsets: list[int]
    reaches: list[int]

    def pieces(self) -> list[tuple[str, bool]]:
        """The text as (piece, is an asked value) pieces, in order: what is tokenized, each value alone."""
        out, start = [], 0
        for offset in self.answer_offsets:
            out += [(self.text[start:offset], False), (self.text[offset], True)]
            start = offset + 1
        return out + ([(self.text[start:], False)] if start < len(self.text) else [])


def pair_chars(key_length: int) -> int:
    """Characters of one pair: the key, then its value."""
    return key_length + 1


def episode_chars(pairs: int, key_length: int, gap: int) -> int:
    """Characters of an episode: the pairs, the gap, the queries and the newline."""
    return 2 * pairs * pair_chars(key_length) + gap + 1


def max_reach(pairs: int, key_length: int, gap: int) -> int:
    """The longest reach of an episode with this gap: the first pair, asked last."""
    return (2 * pairs - 1) * pair_chars(key_length) + gap


def fewest_letters(pairs: int, key_length: int) -> int:
    """The smallest alphabet that spells `pairs` distinct keys of `key_length` letters."""
    return max(2, math.ceil(pairs ** (1 / key_length) - 1e-9))


def most_letters(pairs: int, key_length: int) -> int:
    """The largest alphabet an episode's keys may use (key_set tries a few sizes beyond the fewest)."""
    return pairs if key_length == 1 else fewest_letters(pairs, key_length) + EXTRA_LETTERS


def key_set(rng: random.Random, pairs: int, key_length: int, avoid: frozenset[str] = frozenset()) -> list[str]:
    """`pairs` distinct keys in which only the whole key names its pair (module docstring), in the fewest letters that
    allow it (the alphabet itself drawn from a-z without the letters in `avoid`)."""
    available = [c for c in LETTERS if c not in avoid]
    fewest = fewest_letters(pairs, key_length)
    for letters in range(fewest, min(fewest + EXTRA_LETTERS, len(available)) + 1):
        alphabet = rng.sample(available, letters)
        words = ["".join(w) for w in product(alphabet, repeat=key_length)]
        if len(words) >= pairs:
            for _ in range(KEY_SET_TRIES):
                keys = rng.sample(words, pairs)
                if key_length == 1 or _only_whole_keys_name(keys):
                    return keys
    raise ValueError(f"no set of {pairs} keys of {key_length} letters in which only the whole key names its value "
                     f"(with 2-letter keys: 4 or from 6 pairs on)")


def check_shape(pairs: int, key_length: int, max_gap: int, owner: str, fresh_chars: int = 0) -> None:
    """Raises ValueError naming `owner`'s field when episodes of this shape cannot be written."""
    for name, value, least in (("pairs", pairs, 1), ("key_length", key_length, 1), ("max_gap", max_gap, 0),
                               ("fresh_chars", fresh_chars, 0)):
        if value < least:
            raise ValueError(f"{owner}.{name} must be >= {least} (got {value})")
    try:
        key_set(random.Random(0), pairs, key_length)
    except ValueError as err:
        raise ValueError(f"{owner}.pairs / key_length: {err}") from None
    # The most episodes that can end within fresh_chars before one: the shortest episodes (gap 0) back to back.
    neighbours = math.ceil(fresh_chars / episode_chars(pairs, key_length, 0))
    free = len(LETTERS) - neighbours * most_letters(pairs, key_length)
    if free < most_letters(pairs, key_length):
        raise ValueError(f"{owner}.fresh_chars = {fresh_chars}: up to {neighbours} earlier episodes end within it, "
                         f"whose keys leave {max(free, 0)} of 26 letters, fewer than an episode's "
                         f"{most_letters(pairs, key_length)}: lower fresh_chars or pairs")


def _only_whole_keys_name(keys: list[str]) -> bool:
    """Every key has, at each position, a neighbour: another key equal to it everywhere else."""
    chosen = set(keys)
    return all(any(key[:p] + c + key[p + 1:] in chosen for c in LETTERS if c != key[p])
               for key in keys for p in range(len(key)))


def episode(rng: random.Random, pairs: int, key_length: int, gap: int,
            avoid: frozenset[str] = frozenset()) -> Episode:
    keys = key_set(rng, pairs, key_length, avoid)
    values = [rng.choice(VALUES) for _ in keys]
    stated = "".join(f"{k}{v}" for k, v in zip(keys, values))
    filler = "".join(rng.choice(FILLER) for _ in range(gap))
    order = rng.sample(range(pairs), pairs)
    width = pair_chars(key_length)
    text = stated + filler
    asked, offsets, reaches = [], [], []
    for i in order:
        text += keys[i]
        offsets.append(len(text))
        reaches.append(len(text) - (width * i + width - 1))
        asked.append(values[i])
        text += values[i]
    return Episode(text + "\n", gap, asked, offsets, reaches)


def copy_episode(rng: random.Random, length: int) -> Episode:
    """A span of `length` random capitals, the copy mark, the span again; every copied character is a query."""
    span = "".join(rng.choice(VALUES) for _ in range(length))
    return Episode(f"{span}{COPY_MARK}{span}\n", 0, list(span), [length + 1 + i for i in range(length)],
                   [length + 1] * length)


@dataclass(frozen=True)
class Copies:
    """The copy episodes mixed into training documents: `share` of the episodes, lengths uniform in `lengths`."""

    share: float = 0.0
    lengths: tuple[int, int] = (8, 48)


def training_episodes(index: int, pairs: int, key_length: int, max_gap: int, doc_chars: int,
                      seed: int = 0, fresh_chars: int = 0, copies: Copies = Copies()) -> tuple[str, list[Episode]]:
    """(the leading filler, the episodes) of training document `index`: gaps uniform in [0, max_gap], until doc_chars
    characters, each episode's keys fresh within `fresh_chars`, a share of copy episodes (module docstring)."""
    rng = random.Random(f"mqar-train-{seed}-{index}")
    lead = "".join(rng.choice(FILLER) for _ in range(fresh_chars))
    episodes, length = [], len(lead)
    while length < doc_chars:
        if copies.share and rng.random() < copies.share:
            episodes.append(copy_episode(rng, rng.randint(*copies.lengths)))
        else:
            gap = rng.randint(0, max_gap)
            episodes.append(episode(rng, pairs, key_length, gap, recent_letters(episodes, fresh_chars)))
        length += len(episodes[-1].text)
    return lead, episodes


def recent_letters(episodes: list[Episode], fresh_chars: int) -> frozenset[str]:
    """The key letters of the episodes that end within `fresh_chars` characters of the end of `episodes`."""
    letters, back = set(), 0
    for ep in reversed(episodes):
        if back >= fresh_chars:
            break
        letters |= {c for c in ep.text if c in LETTERS}
        back += len(ep.text)
    return frozenset(letters)


def training_document(index: int, pairs: int, key_length: int, max_gap: int, doc_chars: int,
                      seed: int = 0, fresh_chars: int = 0, copies: Copies = Copies()) -> tuple[str, list[int]]:
    """(text, the reach of every query in it) of training document `index`: the leading filler, then one episode
    per line."""
    lead, episodes = training_episodes(index, pairs, key_length, max_gap, doc_chars, seed, fresh_chars, copies)
    return lead + "".join(ep.text for ep in episodes), [r for ep in episodes for r in ep.reaches]


def training_pieces(index: int, pairs: int, key_length: int, max_gap: int, doc_chars: int,
                    seed: int = 0, fresh_chars: int = 0, copies: Copies = Copies()) -> list[tuple[str, bool]]:
    """Training document `index` as (text, scored) pieces: only the queried values are scored."""
    lead, episodes = training_episodes(index, pairs, key_length, max_gap, doc_chars, seed, fresh_chars, copies)
    return [(lead, False)] * bool(lead) + [piece for ep in episodes for piece in ep.pieces()]


def eval_episode(gap: int, index: int, pairs: int, key_length: int, seed: int = 0) -> Episode:
    """Held-out episode `index` at `gap` (a random stream no training document uses)."""
    return episode(random.Random(f"mqar-eval-{seed}-{gap}-{index}"), pairs, key_length, gap)


def eval_copy_episode(length: int, index: int, seed: int = 0) -> Episode:
    """Held-out copy episode `index` of a span of `length` (a random stream no training document uses)."""
    return copy_episode(random.Random(f"copy-eval-{seed}-{length}-{index}"), length)
