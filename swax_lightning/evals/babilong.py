"""BABILong: bAbI reasoning facts hidden in long filler prose, generated offline (qa1-qa5) or read from the official
files, with the official scoring rule.

Tasks (bAbI, Weston et al. 2015): qa1 single supporting fact ("Where is Mary?"), qa2 two supporting facts (where is
an object someone carried), qa3 three supporting facts (where was an object before a place), qa4 two-argument
relations (what is north of the office), qa5 three-argument relations (who gave the milk to Fred).

Decisions:
- A small world simulator writes each story (people move, pick up, drop and give objects; rooms have directions), so
  every answer follows from the facts; the facts keep their order and are spread over the filler at seeded positions
  (recorded in the sample), the filler being sentences of the essay prose (PG-19 books in the official set).
- Lengths are in the model's tokens, like RULER: the filler is sized so the prompt fills `length - max_new_tokens`
  tokens; length 0 means the facts alone.
- Scoring is the official rule: keep the first sentence of the output; correct iff the target is in it and no other
  task label that is not in the question is.
- Official files: `{data_dir}/{length}/{task}.jsonl` (or .json), rows with "input", "question", "target", as the
  official dataset ships them (length folders named like 0k, 4k, 128k).
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from swax_lightning.evals.essay import generated_essay, prose_sentences
from swax_lightning.evals.ruler import largest_fitting

PEOPLE = ["Mary", "John", "Daniel", "Sandra", "Fred", "Bill", "Julie", "Jeff"]
PLACES = ["bathroom", "hallway", "kitchen", "garden", "office", "bedroom"]
OBJECTS = ["football", "apple", "milk"]
DIRECTIONS = {"north": "south", "south": "north", "east": "west", "west": "east"}
MOVES = ["moved to", "went to", "journeyed to", "travelled to", "went back to"]
TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")
LABELS = {"qa1": PLACES, "qa2": PLACES, "qa3": PLACES, "qa4": PLACES, "qa5": [p.lower() for p in PEOPLE] + OBJECTS}
INSTRUCTION = ("I will give you context with the facts about people, objects and places hidden in some random text "
               "and a question. Answer the question based only on the facts. If something was in different places, "
               "use the latest one unless the question asks otherwise.")
PROMPT = "{instruction}\n<context>\n{context}\n</context>\nQuestion: {question}\nAnswer:"


@dataclass
class BabiSample:
    task: str
    length: int
    input_text: str
    question: str
    target: str
    fact_positions: list[int]     # character offsets of the facts in input_text
    n_tokens: int

    def to_dict(self) -> dict:
        return asdict(self)


def babilong_score(output: str, target: str, question: str, task: str) -> float:
    """Official BABILong rule: 1.0 iff the target is in the first sentence of the output and no other label of the
    task (except those in the question) is."""
    first = output.strip().lower().split(".")[0]
    question = question.lower()
    others = {label for label in LABELS[task] if label not in question} - {target.lower()}
    return float(target.lower() in first and not any(label in first for label in others))


def _story(task: str, rng: random.Random) -> tuple[list[str], str, str]:
    """(facts, question, target) of one bAbI-style story."""
    if task == "qa4":
        a, b = rng.sample(PLACES, 2)
        direction = rng.choice(list(DIRECTIONS))
        c, d = rng.sample([p for p in PLACES if p not in (a, b)], 2)
        distractor = f"The {c} is {rng.choice(list(DIRECTIONS))} of the {d}."
        facts = [f"The {a} is {direction} of the {b}.", distractor]
        rng.shuffle(facts)
        if rng.random() < 0.5:
            return facts, f"What is {direction} of the {b}?", a
        return facts, f"What is the {b} {DIRECTIONS[direction]} of?", a
    where = {p: None for p in PEOPLE}
    holder: dict[str, str | None] = {o: None for o in OBJECTS}
    obj_at: dict[str, str | None] = {o: None for o in OBJECTS}
    history: dict[str, list[str]] = {o: [] for o in OBJECTS}
    facts, gives = [], []
    people = rng.sample(PEOPLE, 4)
    for _ in range(rng.randint(8, 14)):
        person = rng.choice(people)
        action = rng.random()
        held = [o for o in OBJECTS if holder[o] == person]
        free = [o for o in OBJECTS if holder[o] is None and where[person] and obj_at[o] in (None, where[person])]
        if task in ("qa2", "qa3", "qa5") and action < 0.3 and free and where[person]:
            obj = rng.choice(free)
            holder[obj], obj_at[obj] = person, where[person]
            facts.append(f"{person} {rng.choice(['picked up', 'got', 'grabbed'])} the {obj}.")
        elif task in ("qa2", "qa3") and action < 0.4 and held:
            obj = rng.choice(held)
            holder[obj] = None
            facts.append(f"{person} {rng.choice(['dropped', 'discarded', 'put down'])} the {obj}.")
        elif task == "qa5" and action < 0.6 and held:
            obj = rng.choice(held)
            others = [p for p in people if p != person and where[p] == where[person]] or \
                [p for p in people if p != person]
            receiver = rng.choice(others)
            holder[obj] = receiver
            gives.append((person, obj, receiver))
            facts.append(f"{person} gave the {obj} to {receiver}.")
        else:
            place = rng.choice([p for p in PLACES if p != where[person]])
            where[person] = place
            facts.append(f"{person} {rng.choice(MOVES)} the {place}.")
        for obj in OBJECTS:
            if holder[obj] is not None:
                obj_at[obj] = where[holder[obj]]
            if obj_at[obj] and (not history[obj] or history[obj][-1] != obj_at[obj]):
                history[obj].append(obj_at[obj])
    if task == "qa1":
        person = rng.choice([p for p in people if where[p]])
        return facts, f"Where is {person}?", where[person]
    if task == "qa2":
        known = [o for o in OBJECTS if obj_at[o]]
        if known:
            obj = rng.choice(known)
            return facts, f"Where is the {obj}?", obj_at[obj]
    if task == "qa3":
        known = [o for o in OBJECTS if len(history[o]) >= 2]
        if known:
            obj = rng.choice(known)
            return facts, f"Where was the {obj} before the {history[obj][-1]}?", history[obj][-2]
    if task == "qa5" and gives:
        giver, obj, receiver = gives[-1]
        kind = rng.randrange(3)
        if kind == 0:
            return facts, f"Who gave the {obj} to {receiver}?", giver
        if kind == 1:
            return facts, f"Who received the {obj}?", receiver
        return facts, f"What did {giver} give to {receiver}?", obj
    return _story(task, rng)  # the walk did not make the question answerable: draw another


class BabiLongGenerator:
    def __init__(self, tokenizer, max_new_tokens: int = 16, filler: str | None = None, seed: int = 0):
        self.tokenizer, self.max_new_tokens, self.seed = tokenizer, max_new_tokens, seed
        text = filler if filler is not None else generated_essay(seed=seed)
        self.filler = prose_sentences(text)

    def sample(self, task: str, length: int, index: int = 0) -> BabiSample:
        if task not in TASKS:
            raise ValueError(f"unknown BABILong task {task!r}; known: {', '.join(TASKS)}")
        rng = random.Random(f"{self.seed}/{task}/{length}/{index}")
        facts, question, target = _story(task, rng)
        start, fractions = rng.randrange(len(self.filler)), sorted(rng.random() for _ in facts)

        def build(n: int) -> tuple[str, list[int]]:
            sentences = [self.filler[(start + i) % len(self.filler)] for i in range(n)]
            for i, (fraction, fact) in enumerate(zip(fractions, facts)):  # fractions ascend: the facts keep order
                sentences.insert(round(fraction * n) + i, fact)
            context = " ".join(sentences)
            head = len(PROMPT.format(instruction=INSTRUCTION, context="\x00", question=question).split("\x00")[0])
            positions, offset = [], 0
            for sentence in sentences:
                if sentence in facts and len(positions) < len(facts):
                    positions.append(head + offset)
                offset += len(sentence) + 1
            return PROMPT.format(instruction=INSTRUCTION, context=context, question=question), positions

        n = 0
        if length > 0:
            fits = lambda k: self._count(build(k)[0]) <= length - self.max_new_tokens  # noqa: E731
            if not fits(0):
                raise ValueError(f"{task}: length {length} is too short for the story and the question")
            n = largest_fitting(fits)
        text, positions = build(n)
        return BabiSample(task, length, text, question, target, positions, self._count(text))

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


def load_official(data_dir: str | Path, task: str, length_name: str) -> list[BabiSample]:
    """Samples of the official BABILong files: {data_dir}/{length_name}/{task}.jsonl or .json."""
    folder = Path(data_dir) / length_name
    path = next((p for p in (folder / f"{task}.jsonl", folder / f"{task}.json") if p.exists()), None)
    if path is None:
        raise FileNotFoundError(f"BABILong file not found: {folder / task}.jsonl (or .json)")
    text = path.read_text()
    rows = json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines() if line]
    samples = []
    for i, row in enumerate(rows):
        if not {"input", "question", "target"} <= set(row):
            raise ValueError(f"{path} row {i}: expected the fields input, question, target")
        prompt = PROMPT.format(instruction=INSTRUCTION, context=row["input"], question=row["question"])
        samples.append(BabiSample(task, 0, prompt, row["question"], row["target"], [], 0))
    return samples
