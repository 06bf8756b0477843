"""The default long-prose haystack: seeded, generated English sentences that no training corpus of this project holds.

RULER's essay haystack is Paul Graham's essays and BABILong's filler is PG-19 books; neither can be downloaded at run
time here, and the one long prose text every machine has (the language reference in `pydoc_data`) is part of the tiny
runs' training data, so a model would have memorised it. This module writes prose instead: each sentence is drawn
from a small grammar (a subject, a verb, an object, an optional place, time or clause), over a vocabulary of about 270
words, with a seeded random generator, so the text is the same on every machine, never repeats in any length used
here, and shares nothing with the Python sources or their docs beyond common English words.

Decisions:
- The vocabulary avoids every BABILong label (bAbI's people, rooms and objects) and the words of the NIAH needles
  ("special", "magic"), so filler never answers or confuses a question.
- A real essay can be given instead (`EvalSuite.essay_file`); prose_sentences() splits either into sentences.
"""
from __future__ import annotations

import random

SUBJECTS = ("the old sailor", "a young painter", "the village teacher", "my grandmother", "the tired traveller",
            "a quiet shepherd", "the baker next door", "our neighbour", "the stubborn mule", "a wandering poet",
            "the ship's captain", "the youngest sister", "a curious child", "the night watchman", "the carpenter",
            "an elderly monk", "the blacksmith", "a stranger from the north", "the fisherman's wife", "the choir",
            "the merchant", "a pair of herons", "the innkeeper", "the miller's son", "a band of pilgrims",
            "the schoolmaster", "the widow", "a flock of geese", "the lamplighter", "the potter's dog")
VERBS = ("carried", "admired", "remembered", "painted", "repaired", "followed", "described", "forgot", "praised",
         "watched", "questioned", "measured", "polished", "sold", "borrowed", "buried", "mended", "counted",
         "studied", "sketched", "guarded", "traded", "wrapped", "lost", "found", "weighed", "copied", "blessed",
         "carved", "ignored")
OBJECTS = ("a wooden chest", "the broken fiddle", "an old map", "the silver spoon", "a basket of pears",
           "the heavy anchor", "a faded letter", "the copper kettle", "a bundle of reeds", "the church bell",
           "a woollen shawl", "the rusty lantern", "a jar of honey", "the chess board", "a leather saddle",
           "the painted sign", "a loaf of rye", "the iron gate", "a bag of coins", "the cracked mirror",
           "a sack of flour", "the little boat", "a pile of slates", "the stone wall",
           "a crate of plums", "the tall candle", "a ball of twine", "the brass compass", "a pot of ink",
           "the long ladder")
PLACES = ("by the harbour", "near the mill", "at the edge of the forest", "on the hill road", "beside the well",
          "in the market square", "under the bridge", "at the crossroads", "behind the chapel", "along the river",
          "in the orchard", "on the windy cliff", "near the old quarry", "at the ferry landing", "in the barn")
TIMES = ("before dawn", "after the storm", "in the late autumn", "on a cold morning", "during the fair",
         "when the tide was low", "at midsummer", "in the first snow", "long ago", "one grey evening",
         "after supper", "during the long drought")
CLAUSES = ("although nobody had asked", "because the weather had turned", "while the bells were ringing",
           "as the fog rolled in", "since the road was closed", "though it was already late",
           "until the lamps were lit", "so that the children could see", "as if it mattered a great deal",
           "while the others slept")
COMMENTS = ("Nobody in the valley could say why.", "It was, everyone agreed, a strange season.",
            "The story was told for many years afterwards.", "Some said it brought luck, others did not.",
            "The weather held for three more days.", "It seemed a small thing at the time.",
            "Later that week the rain came back.", "The road to the coast was quiet again.")


def sentence(rng: random.Random) -> str:
    """One sentence of the grammar."""
    roll = rng.random()
    if roll < 0.08:
        return rng.choice(COMMENTS)
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if rng.random() < 0.6:
        parts.append(rng.choice(PLACES))
    if rng.random() < 0.4:
        parts.append(rng.choice(TIMES))
    if rng.random() < 0.3:
        parts.append(rng.choice(CLAUSES))
    text = " ".join(parts)
    return text[0].upper() + text[1:] + "."


def generated_essay(n_sentences: int = 20_000, seed: int = 0) -> str:
    """`n_sentences` generated sentences (about 60 characters each), in paragraphs of 4 to 9 sentences."""
    rng = random.Random(f"essay/{seed}")
    paragraphs, current = [], []
    for _ in range(n_sentences):
        current.append(sentence(rng))
        if len(current) >= rng.randint(4, 9):
            paragraphs.append(" ".join(current))
            current = []
    paragraphs.append(" ".join(current))
    return "\n\n".join(p for p in paragraphs if p)


def prose_sentences(text: str) -> list[str]:
    """Sentences of running prose (haystack and filler units), skipping fragments of three words or fewer."""
    return [s.strip().rstrip(".") + "." for s in text.replace("\n", " ").split(". ") if len(s.split()) > 3]
