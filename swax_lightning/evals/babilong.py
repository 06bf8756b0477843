"""BABILong: bAbI reasoning facts hidden in long filler prose, generated offline (qa1-qa5) or read from the official
files, with the official prompts and scoring rule.

Tasks (bAbI, Weston et al. 2015, as BABILong uses them):
- qa1 single supporting fact: people move between rooms; "Where is Mary?".
- qa2 two supporting facts: people also pick up and drop objects; "Where is the football?".
- qa3 three supporting facts: "Where was the football before the kitchen?", answered by the room the object was in
  before it last came to the kitchen; the kitchen is the room the object is in now 4 times in 5 and an earlier one
  otherwise, as in bAbI (QA3_ASKS_CURRENT_ROOM).
- qa4 two-argument relations: three rooms on a line, a fact about each neighbouring pair ("The office is north of the
  kitchen. The garden is south of the kitchen."); the question asks about the middle room ("What is north of the
  kitchen?", "What is the kitchen south of?"), so only the direction tells which of its two neighbours answers.
- qa5 three-argument relations: people pass objects to each other; all five bAbI question forms ("Who gave the milk
  to Fred?", "Who received the milk?", "What did Jeff give to Fred?", "Who did Jeff give the milk to?", "Who gave the
  milk?") in bAbI's proportions (QA5_FORM_WEIGHTS), answered by the latest matching hand-over.
bAbI's sets: Mary, John, Daniel, Sandra (qa1-qa3); Fred, Mary, Jeff, Bill (qa5); six rooms; football, apple, milk.

Decisions:
- A small world simulator writes each story as bAbI's generator does (each fact: a kind of action drawn among those
  possible, then one of its instances; in qa5 people and objects start in rooms no fact states), so every answer
  follows from the facts; the facts keep their order and are spread over filler sentences at seeded positions
  (recorded in the sample). The filler is the generated prose of essay.py (PG-19 books in the official set; those
  cannot be fetched here).
- Story lengths match the official 0k split: the number of facts is drawn per task (FACT_COUNTS; qa1: 2, 4, ... 10,
  as bAbI asks after every second fact; qa4: always two) so that the facts alone average about as many characters as
  the official rows: qa1 180, qa2 458, qa3 1,457, qa4 71, qa5 575. Those means come from the official 0k split
  (RMT-team/babilong-1k-samples, 999-1,000 rows per task): its bytes per row on the dataset card, less the row's
  question and target (booydar/babilong's evaluation files list them for the same rows) and Arrow's three 4-byte
  offsets. tests/evals/test_babilong.py holds the generator within 10% of each.
- The answer budget is set in characters (`answer_chars`, 80 by default: BABILong's scripts generate 20 tokens of a
  GPT-2-like tokenizer, about 4 characters each) and turned into tokens for the model's tokenizer: the tokens of that
  many characters of the task's own example answers (SmolLM2's BPE: 13-19 by task; a byte tokenizer: 80). Generation
  stops there, or as soon as the answer's first sentence has ended: the official rule reads nothing after it, so
  stopping there changes no score and saves the decode steps. A byte-level model answering in the official format
  is therefore not cut to `The most recent loca` as a budget of 20 tokens would cut it.
- Lengths are in the model's tokens: the filler is sized so the prompt fills `length` less the answer's tokens;
  length 0 means the facts alone. The official splits are named in GPT-2 tokens (0k, 1k, ... 128k, 512k, 1M), which
  cannot be counted offline here; each sample records its characters and an estimate of its GPT-2 tokens
  (characters / 4, the usual ratio of GPT-2's BPE on English prose) beside its exact count in model tokens.
- The prompt is the official one, byte for byte (booydar/babilong's DEFAULT_TEMPLATE and DEFAULT_PROMPTS: instruction,
  in-context examples, post-prompt, <context> ... </context>, "Question: ...", separated by blank lines), and scoring
  is the official rule: lower-case the output, keep its first sentence; correct iff the target is the only task label
  in it that the question does not mention.
- Official files: `{data_dir}/{task}/{split}.json` (JSON list or JSON lines of rows with "input", "question",
  "target"), the layout of the downloaded dataset; the 1M split is "1M".
"""
from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from swax_lightning.core.errors import ConfigError, require, require_among
from swax_lightning.evals.essay import generated_essay, prose_sentences
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import score_table, summarize, table_scalars
from swax_lightning.evals.ruler import largest_fitting

TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")
PLACES = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("football", "apple", "milk")
PEOPLE = {"qa1": ("Mary", "John", "Daniel", "Sandra"), "qa2": ("Mary", "John", "Daniel", "Sandra"),
          "qa3": ("Mary", "John", "Daniel", "Sandra"), "qa5": ("Fred", "Mary", "Jeff", "Bill")}
LABELS = {"qa1": PLACES, "qa2": PLACES, "qa3": PLACES, "qa4": PLACES, "qa5": ("Bill", "Fred", "Jeff", "Mary") + OBJECTS}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
PICKS = ("picked up", "got", "grabbed", "took")
DROPS = ("dropped", "discarded", "put down", "left")
GIVES = ("gave", "passed", "handed")
FACT_COUNTS = {"qa1": (2, 10, 2), "qa2": (6, 26, 1), "qa3": (25, 65, 1), "qa5": (3, 13, 1)}  # least, most, step
# Measured on bAbI's own files (tasks_1-20_v1-2; 1,000 questions each of en/qa3 test and train, 10,000 of en-10k/qa5
# train): qa3 asks about the object's current room in 80.6% and 79.3% of its questions; qa5 asks "What did X give to
# Y?" in 33.6% of them and each other form in 16.3-17.0%.
QA3_ASKS_CURRENT_ROOM = 0.8
# The kinds of fact in bAbI's en-10k qa3 test stories: 9,367 moves, 2,775 pick-ups, 2,568 drops (of 14,710).
KIND_WEIGHTS = {"qa3": {"move": 9367, "get": 2775, "drop": 2568}}
QA5_FORM_WEIGHTS = (1, 1, 2, 1, 1)  # the forms of _question in its order: "What did X give to Y?" is the third
CHARS_PER_GPT2_TOKEN = 4.0
# BABILong's scripts/run_model_on_babilong.py generates 20 new tokens greedily: about 80 characters of GPT-2-like BPE
ANSWER_CHARS = 80

# BABILong's DEFAULT_TEMPLATE and DEFAULT_PROMPTS (babilong/prompts.py) as booydar/babilong's main branch has them at
# commit 7a6efee29f5cac03c3c410e6799c80fd2ffe3610 (prompts.py last changed in ffa075fb7aff504275037efc04d3aeaa5b1f65b0).
TEMPLATE = "{instruction}\n\n{examples}\n\n{post_prompt}\n\n<context>\n{context}\n</context>\n\nQuestion: {question}"
PROMPTS = {  # task: (instruction, examples, post-prompt)
    "qa1": ("I will give you context with the facts about positions of different persons hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts. If a "
            "person was in different locations, use the latest location to answer the question.",
            "<example>\nCharlie went to the hallway. Judith come back to the kitchen. Charlie travelled to balcony. "
            "Where is Charlie?\nAnswer: The most recent location of Charlie is balcony.\n</example>\n\n<example>\n"
            "Alan moved to the garage. Charlie went to the beach. Alan went to the shop. Rouse travelled to balcony. "
            "Where is Alan?\nAnswer: The most recent location of Alan is shop.\n</example>",
            "Always return your answer in the following format: The most recent location of ’person’ is "
            "’location’. Do not write anything else after that."),
    "qa2": ("I give you context with the facts about locations and actions of different persons hidden in some "
            "random text and a question.You need to answer the question based only on the information from the "
            "facts.\nIf a person got an item in the first location and travelled to the second location the item is "
            "also in the second location. If a person dropped an item in the first location and moved to the second "
            "location the item remains in the first location.",
            "<example>\nCharlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. Where is the "
            "bottle?\nAnswer: The bottle is in the balcony.\n</example>\n<example>\nAlan moved to the garage. Alan "
            "got a screw driver. Alan moved to the kitchen. Where is the screw driver?\nAnswer: The screw driver is "
            "in the kitchen.\n</example>",
            "Always return your answer in the following format: The ’item’ is in ’location’. Do not write anything "
            "else after that."),
    "qa3": ("I give you context with the facts about locations and actions of different persons hidden in some "
            "random text and a question. You need to answer the question based only on the information from the "
            "facts.\nIf a person got an item in the first location and travelled to the second location the item is "
            "also in the second location. If a person dropped an item in the first location and moved to the second "
            "location the item remains in the first location.",
            "<example>\nJohn journeyed to the bedroom. Mary grabbed the apple. Mary went back to the bathroom. Daniel "
            "journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the kitchen. Where was the apple "
            "before the kitchen?\nAnswer: Before the kitchen the apple was in the bathroom.\n</example>\n<example>\n"
            "John went back to the bedroom. John went back to the garden. John went back to the kitchen. Sandra took "
            "the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. Where was the football "
            "before the bedroom?\nAnswer: Before the bedroom the football was in the garden.\n</example>",
            "Always return your answer in the following format: Before the $location_1$ the $item$ was in the "
            "$location_2$. Do not write anything else after that."),
    "qa4": ("I will give you context with the facts about different people, their location and actions, hidden in "
            "some random text and a question. You need to answer the question based only on the information from "
            "the facts.",
            "<example>\nThe hallway is south of the kitchen. The bedroom is north of the kitchen. What is the kitchen "
            "south of?\nAnswer: bedroom\n</example>\n<example>\nThe garden is west of the bedroom. The bedroom is "
            "west of the kitchen. What is west of the bedroom?\nAnswer: garden\n</example>",
            "Your answer should contain only one word - location. Do not write anything else after that."),
    "qa5": ("I will give you context with the facts about locations and their relations hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts.",
            "<example>\nMary picked up the apple there. Mary gave the apple to Fred. Mary moved to the bedroom. Bill "
            "took the milk there. Who did Mary give the apple to?\nAnswer: Fred\n</example>\n<example>\nJeff took the "
            "football there. Jeff passed the football to Fred. Jeff got the milk there. Bill travelled to the "
            "bedroom. Who gave the football?\nAnswer: Jeff\n</example>\n<example>\nFred picked up the apple there. "
            "Fred handed the apple to Bill. Bill journeyed to the bedroom. Jeff went back to the garden. What did "
            "Fred give to Bill?\nAnswer: apple\n</example>",
            "Your answer should contain only one word. Do not write anything else after that. Do not explain your "
            "answer."),
}


@dataclass
class BabiSample:
    task: str
    length: int                   # requested length in model tokens (0: the facts alone); 0 for official files
    input_text: str               # the official prompt: what the model continues
    question: str
    target: str
    n_tokens: int                 # tokens of input_text in the model's tokenizer
    index: int = 0                # with (seed, task, length): all it takes to regenerate a generated sample
    source: str = "generated"     # "generated", or the official file the row came from
    split: str | None = None      # the official split (GPT-2 tokens: 0k .. 1M) of an official row
    fact_positions: list[int] = field(default_factory=list)  # character offsets of the facts in input_text

    @property
    def gpt2_tokens_estimate(self) -> int:
        return round(len(self.input_text) / CHARS_PER_GPT2_TOKEN)


def format_prompt(task: str, context: str, question: str) -> str:
    """BABILong's get_formatted_input: the template filled, the context stripped, the whole stripped."""
    instruction, examples, post_prompt = PROMPTS[task]
    return TEMPLATE.format(instruction=instruction, examples=examples, post_prompt=post_prompt, context=context.strip(),
                           question=question).strip()


def example_answers(task: str) -> list[str]:
    """The answers of the task's in-context examples, in the official format ("The most recent location of Charlie
    is balcony.")."""
    return [line.removeprefix("Answer: ") for line in PROMPTS[task][1].splitlines() if line.startswith("Answer: ")]


def answer_tokens(tokenizer, task: str, chars: int) -> int:
    """The token budget of a `chars`-character answer in this tokenizer: the tokens of that many characters of the
    task's example answers, one after another."""
    answers = " ".join(example_answers(task))
    text = (answers + " ") * (chars // (len(answers) + 1) + 1)
    return max(1, len(tokenizer.encode(text[:chars])))


def answer_complete(text: str, chars: int) -> bool:
    """Whether a generated answer can stop: its first sentence has ended (all the official rule reads), or it is
    `chars` characters long."""
    return "." in text or len(text) >= chars


def babilong_score(output: str, target: str, question: str, task: str) -> float:
    """The official rule: 1.0 iff the target is the only task label in the output's first sentence (lower-cased)
    once the labels the question mentions are set aside."""
    first = output.lower().split(".")[0].split("<context>")[0].split("<example>")[0]
    labels = {label.lower() for label in LABELS[task]}
    in_question = {label for label in labels if label in question.lower()}
    found = {label for label in labels if label in first} - in_question
    return float(found == {target.lower()})


class World:
    """People, their rooms and the objects they carry; every change is written as one bAbI fact."""

    def __init__(self, task: str, rng: random.Random):
        self.task, self.rng = task, rng
        self.where: dict[str, str | None] = dict.fromkeys(PEOPLE[task])
        self.holder: dict[str, str | None] = dict.fromkeys(OBJECTS)
        self.history: dict[str, list[str]] = {o: [] for o in OBJECTS}  # rooms each object has been in, in order
        if task == "qa5":  # bAbI's world puts everyone and everything in a room that no fact states (qa5 asks only
            self.where = {p: rng.choice(PLACES) for p in self.where}  # who gave what to whom, which needs no room)
            self.history = {o: [rng.choice(PLACES)] for o in OBJECTS}
        self.gives: list[tuple[str, str, str]] = []  # (giver, object, receiver)
        self.facts: list[str] = []

    def location(self, obj: str) -> str | None:
        return self.where[self.holder[obj]] if self.holder[obj] else (self.history[obj] or [None])[-1]

    def _note(self, obj: str) -> None:
        room = self.location(obj)
        if room and (not self.history[obj] or self.history[obj][-1] != room):
            self.history[obj].append(room)

    def _there(self) -> str:
        """bAbI writes picking up and dropping with or without "there" (always with it in qa5's examples)."""
        return " there" if self.task == "qa5" or self.rng.random() < 0.5 else ""

    def _options(self) -> dict[str, list[tuple[str, ...]]]:
        """Every fact the world allows now, by kind: moves, and (qa2, qa3, qa5) picking up and dropping, and (qa5)
        handing an object to someone in the same room."""
        people, room = list(self.where), self.where
        options = {"move": [(p, r) for p in people for r in PLACES if r != room[p]]}
        if self.task != "qa1":
            options["get"] = [(p, o) for p in people for o in OBJECTS
                              if room[p] and self.holder[o] is None and self.location(o) in (None, room[p])]
            options["drop"] = [(p, o) for o, p in self.holder.items() if p]
        if self.task == "qa5":
            options["give"] = [(p, o, q) for o, p in self.holder.items() if p for q in people
                               if q != p and room[q] == room[p]]
        return {kind: args for kind, args in options.items() if args}

    def step(self) -> None:
        """One fact, as bAbI's generator draws it: a kind of action at random among those possible (in qa3 as often as
        bAbI's own stories have each: KIND_WEIGHTS), then one of its possible instances."""
        rng, kinds = self.rng, sorted(self._options().items())
        weights = KIND_WEIGHTS.get(self.task)
        kind, options = rng.choices(kinds, [weights[k] for k, _ in kinds])[0] if weights else rng.choice(kinds)
        person, target, *receiver = rng.choice(options)
        if kind == "move":
            self.where[person] = target
            self.facts.append(f"{person} {rng.choice(MOVES)} the {target}.")
        elif kind == "get":
            self.holder[target] = person
            self.facts.append(f"{person} {rng.choice(PICKS)} the {target}{self._there()}.")
        elif kind == "drop":
            self.holder[target] = None
            self.facts.append(f"{person} {rng.choice(DROPS)} the {target}{self._there()}.")
        else:
            self.holder[target] = receiver[0]
            self.gives.append((person, target, receiver[0]))
            self.facts.append(f"{person} {rng.choice(GIVES)} the {target} to {receiver[0]}.")
        for obj in OBJECTS:
            self._note(obj)


def _relations_story(rng: random.Random) -> tuple[list[str], str, str]:
    """qa4 as bAbI builds it: three rooms on a line (north-south or east-west), one fact about each neighbouring pair,
    each written from either end, in either order; the question asks what lies in one direction of the middle room,
    so both facts concern the asked room and only the direction tells which one answers."""
    first, middle, last = rng.sample(PLACES, 3)
    line = rng.choice(("north", "east"))  # first is `line` of middle, middle is `line` of last

    def fact(a: str, b: str) -> str:  # "a is `line` of b", written from a or from b
        return f"The {a} is {line} of the {b}." if rng.random() < 0.5 else f"The {b} is {OPPOSITE[line]} of the {a}."

    facts = [fact(first, middle), fact(middle, last)]
    rng.shuffle(facts)
    asked = rng.choice((line, OPPOSITE[line]))
    answer = first if asked == line else last  # what is `asked` of the middle room
    if rng.random() < 0.5:
        return facts, f"What is {asked} of the {middle}?", answer
    return facts, f"What is the {middle} {OPPOSITE[asked]} of?", answer


def _earlier_arrivals(rooms: list[str]) -> list[int]:
    """Positions j >= 1 in an object's rooms where it last arrived in rooms[j], other than where it is now: the earlier
    rooms "Where was the X before the Y?" can ask about, answered by rooms[j - 1]."""
    return [j for j in range(1, len(rooms) - 1) if rooms[j] not in rooms[j + 1:]]


def _qa3_weight(n_rooms: int) -> int:
    """How often qa3 asks about an object that has been in n_rooms rooms. bAbI's qa3 asks about objects that have
    travelled: the asked object has been in 4.96 rooms on average (consecutive repeats merged; 2 rooms in 5.8% of its
    questions, 3 rooms in 26.1%), and "the object's first room" answers 18.3%. Asking only once some object has been
    in 3 rooms, with weight (n - 1)^2, comes near: 5.3 rooms (4% and 26%) and 23% (tests/evals/test_babilong.py)."""
    return (n_rooms - 1) ** 2


def _question(task: str, world: World, rng: random.Random) -> tuple[str, str] | None:
    """(question, answer) about the story so far, or None when the story cannot answer one of this task's kind."""
    if task == "qa1":
        known = [p for p, room in world.where.items() if room]
        person = rng.choice(known)
        return f"Where is {person}?", world.where[person]
    if task == "qa2":
        known = [o for o in OBJECTS if world.location(o)]
        obj = known and rng.choice(known)
        return (f"Where is the {obj}?", world.location(obj)) if obj else None
    if task == "qa3":
        rooms = world.history
        if max(map(len, rooms.values())) < 3:
            return None  # not yet: bAbI's questions are about objects that have mostly been in 3 rooms or more
        current = [(o, len(r) - 1) for o, r in rooms.items() if len(r) >= 2]
        earlier = [(o, j) for o in OBJECTS for j in _earlier_arrivals(rooms[o])]
        pool = current if not earlier or rng.random() < QA3_ASKS_CURRENT_ROOM else earlier
        obj, j = rng.choices(pool, [_qa3_weight(len(rooms[o])) for o, _ in pool])[0]
        return f"Where was the {obj} before the {rooms[obj][j]}?", rooms[obj][j - 1]
    if not world.gives:
        return None
    giver, obj, receiver = rng.choice(world.gives)
    latest = lambda ok: [g for g in world.gives if ok(g)][-1]  # noqa: E731  the latest matching hand-over
    form = rng.choices(range(5), QA5_FORM_WEIGHTS)[0]
    if form == 0:
        return f"Who gave the {obj} to {receiver}?", latest(lambda g: g[1:] == (obj, receiver))[0]
    if form == 1:
        return f"Who received the {obj}?", latest(lambda g: g[1] == obj)[2]
    if form == 2:
        return f"What did {giver} give to {receiver}?", latest(lambda g: (g[0], g[2]) == (giver, receiver))[1]
    if form == 3:
        return f"Who did {giver} give the {obj} to?", latest(lambda g: g[:2] == (giver, obj))[2]
    return f"Who gave the {obj}?", latest(lambda g: g[1] == obj)[0]


def story(task: str, rng: random.Random) -> tuple[list[str], str, str]:
    """(facts, question, target) of one bAbI story of the task: at least a drawn number of facts, then as many more
    as it takes until the story can answer a question of the task's kind."""
    if task == "qa4":
        return _relations_story(rng)
    lo, hi, step = FACT_COUNTS[task]
    world, n_facts = World(task, rng), rng.randrange(lo, hi + 1, step)
    while True:
        while len(world.facts) < n_facts:
            world.step()
        asked = _question(task, world, rng)
        if asked:
            return world.facts, *asked
        n_facts += 1


class BabiLongGenerator:
    def __init__(self, tokenizer, answer_chars: int = ANSWER_CHARS, filler: str | None = None, seed: int = 0):
        self.tokenizer, self.answer_chars, self.seed = tokenizer, answer_chars, seed
        text = filler if filler is not None else generated_essay(seed=seed)
        self.filler = prose_sentences(text)
        self._answer_tokens: dict[str, int] = {}

    def answer_tokens(self, task: str) -> int:
        """The answer's token budget for this task in this tokenizer (answer_tokens)."""
        if task not in self._answer_tokens:
            self._answer_tokens[task] = answer_tokens(self.tokenizer, task, self.answer_chars)
        return self._answer_tokens[task]

    def sample(self, task: str, length: int, index: int = 0) -> BabiSample:
        if task not in TASKS:
            raise ValueError(f"unknown BABILong task {task!r}; known: {', '.join(TASKS)}")
        rng = random.Random(f"{self.seed}/{task}/{length}/{index}")
        facts, question, target = story(task, rng)
        start, fractions = rng.randrange(len(self.filler)), sorted(rng.random() for _ in facts)
        head = len(format_prompt(task, "\x00", question).split("\x00")[0])

        def build(n: int) -> tuple[str, list[int]]:
            sentences = [self.filler[(start + i) % len(self.filler)] for i in range(n)]
            slots = [round(fraction * n) + i for i, fraction in enumerate(fractions)]  # ascending: facts keep order
            for slot, fact in zip(slots, facts):
                sentences.insert(slot, fact)
            offsets = [0]
            for sentence in sentences:
                offsets.append(offsets[-1] + len(sentence) + 1)
            return format_prompt(task, " ".join(sentences), question), [head + offsets[s] for s in slots]

        n = 0
        if length > 0:
            fits = lambda k: self._count(build(k)[0]) <= length - self.answer_tokens(task)  # noqa: E731
            if not fits(0):
                raise ValueError(f"{task}: length {length} is too short for the story and the question")
            n = largest_fitting(fits)
        text, positions = build(n)
        return BabiSample(task, length, text, question, target, self._count(text), index, fact_positions=positions)

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


SPLITS = {**{f"{k}k": (1000 * k, 1024 * k) for k in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)},
          "1M": (1_000_000, 1 << 20)}  # split name: the lengths in GPT-2 tokens that name it


def split_name(length: int) -> str:
    """The official split holding contexts of `length` GPT-2 tokens. BABILong names its splits 0k, 1k, 2k, 4k, ...,
    512k, 1M after lengths of 0, 1000, 2000, 4000, ... 1,000,000 tokens; the powers of two (1024, 4096, ... 2**20)
    name the same splits. Any other length names none: an error, never a neighbouring split."""
    for split, lengths in SPLITS.items():
        if length in lengths:
            return split
    raise ValueError(f"BABILong length {length} names no official split; the splits are {', '.join(SPLITS)}: "
                     f"0, 1000 or 1024 (1k), 2000 or 2048 (2k), ... 1000000 or 1048576 (1M)")


def load_official(data_dir: str | Path, task: str, split: str, tokenizer=None) -> list[BabiSample]:
    """Samples of the official BABILong files as downloaded: {data_dir}/{task}/{split}.json, rows with "input",
    "question", "target" (a JSON list, or one JSON object per line)."""
    path = Path(data_dir) / task / f"{split}.json"
    if not path.is_file():
        raise FileNotFoundError(f"BABILong file not found: {path} (expected the official layout <data>/<task>/<split>"
                                f".json, splits 0k, 1k, ... 128k, 512k, 1M)")
    text = path.read_text()
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    rows = [rows] if isinstance(rows, dict) else rows  # JSON lines with a single row
    samples = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not {"input", "question", "target"} <= set(row):
            raise ValueError(f"{path} row {i}: expected the fields input, question, target")
        prompt = format_prompt(task, row["input"], row["question"])
        n_tokens = len(tokenizer.encode(prompt)) if tokenizer else 0
        samples.append(BabiSample(task, 0, prompt, row["question"], str(row["target"]), n_tokens, i, str(path),
                                  split))
    return samples


# ---- the evaluation of `main.py test` -----------------------------------------------------------------------------
@dataclass
class BabiLongSettings:
    """BABILong.

    Args:
        tasks: BABILong tasks (qa1 .. qa5).
        lengths: Context lengths in tokens (0 = the facts alone).
        samples: Samples per task and length.
        answer_chars: The answer budget in characters (BABILong's 20 GPT-2 tokens: 80), turned into tokens for the
            model's tokenizer; generation also stops where the answer's first sentence ends (all the rule reads).
        data_dir: Official BABILong files as downloaded ({dir}/{task}/{split}.json) instead of generated samples;
            lengths are then read in the official unit (GPT-2 tokens) and name the splits (1000 or 1024 -> 1k,
            4096 -> 4k, 1048576 -> 1M; a length that names no split is refused).
    """

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    lengths: list[int] = field(default_factory=lambda: [0, 4096, 16384, 65536, 131072])
    samples: int = 5
    answer_chars: int = ANSWER_CHARS
    data_dir: str | None = None

    def __post_init__(self) -> None:
        require_among("eval.babilong.tasks", self.tasks, TASKS)
        require(bool(self.lengths) and all(n >= 0 for n in self.lengths), "eval.babilong.lengths",
                "must be lengths >= 0", self.lengths)
        require(self.samples >= 1, "eval.babilong.samples", "must be >= 1", self.samples)
        require(self.answer_chars >= 1, "eval.babilong.answer_chars", "must be >= 1", self.answer_chars)
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise FileNotFoundError(f"eval.babilong.data_dir not found: {self.data_dir}")
        for length in self.lengths if self.data_dir else ():
            try:
                split_name(length)
            except ValueError as err:
                raise ConfigError(f"eval.babilong.lengths: {err}") from None


@register
class BabiLong(Evaluation):
    name, title, order, Settings = "babilong", "BABILong", 20, BabiLongSettings

    def generator(self, tokenizer) -> BabiLongGenerator:
        return BabiLongGenerator(tokenizer, self.settings.answer_chars, self.context.essay, self.context.seed)

    def check(self, arch, data) -> None:
        if data is None or self.settings.data_dir:
            return  # the official files: split names are checked with the settings
        generator = self.generator(data.tokenizer)
        for task in self.settings.tasks:
            for length in (n for n in self.settings.lengths if n):  # 0: the facts alone, always fits
                try:
                    generator.sample(task, length, 0)
                except ValueError as err:
                    raise ConfigError(f"eval.babilong.lengths: {err}") from None

    def workload(self) -> tuple[int, int, int]:
        s = self.settings
        prompts, answer = len(s.tasks) * s.samples * len(s.lengths), round(s.answer_chars / CHARS_PER_GPT2_TOKEN)
        tokens = len(s.tasks) * s.samples * sum(max(length - answer, 512) for length in s.lengths)  # 0: the facts
        return prompts, tokens, prompts * answer  # the answer in BPE-like tokens of about 4 characters

    def items(self, generator, task: str, length: int) -> tuple[str, list]:
        """(column name, samples) of one task and length: generated, or the official split's first rows."""
        if self.settings.data_dir:
            split = split_name(length)
            rows = load_official(self.settings.data_dir, task, split, generator.tokenizer)
            return split, rows[:self.settings.samples]
        return str(length), [generator.sample(task, length, i) for i in range(self.settings.samples)]

    def run(self, model, data, samples: list) -> dict:
        generator, scores, official = self.generator(data.tokenizer), defaultdict(list), self.settings.data_dir
        for task in self.settings.tasks:
            for length in self.settings.lengths:
                column, items = self.items(generator, task, length)
                predictions = self.context.generate(
                    model, data.tokenizer, [item.input_text for item in items], generator.answer_tokens(task),
                    self.name, column, done=lambda text: answer_complete(text, self.settings.answer_chars),
                    desc=f"BABILong {task} {column}", total=len(items))
                for item, prediction in zip(items, predictions):
                    score = 100.0 * babilong_score(prediction, item.target, item.question, task)
                    scores[(task, column, None)].append(score)
                    record = {"eval": "babilong", "task": task, "length": column, "index": item.index,
                              "tokens": item.n_tokens, "gpt2_tokens_estimate": item.gpt2_tokens_estimate,
                              "question": item.question, "target": item.target, "prediction": prediction,
                              "score": score}
                    if official:
                        record["source"] = f"{task}/{column}.json row {item.index}"
                    else:
                        record["regenerate"] = f"babilong {task} {length} {item.index}"
                    samples.append(record)
        out = summarize(scores)
        if official:
            out["source"] = f"official BABILong files in {official}"
            out["length_unit"] = "official splits (GPT-2 tokens)"
        else:
            out["source"] = (f"generated (swax_lightning/evals/babilong.py, seed {self.context.seed}, filler: "
                             f"{'essay_file' if self.context.essay_file else 'generated prose'})")
            out["length_unit"] = "model tokens (each sample also records an estimate of its GPT-2 tokens)"
        return out

    @classmethod
    def report(cls, section: dict) -> list[str]:
        data = f"Data: {section['source']}; columns: {section['length_unit']}.\n"
        return score_table("BABILong (official rule, %)", section, data)

    @classmethod
    def scalars(cls, section: dict) -> dict[str, float]:
        return table_scalars(cls.name, section)
