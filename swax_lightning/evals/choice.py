"""Short-context multiple choice, generated offline: four task families scored by log-likelihood through the
lm-evaluation-harness adapter, for comparing a pretrained model with its converted variants on short prompts.

Tasks (4 choices each, chance 25%; one item = a prompt the model continues with one of the choices):
- choice_capitals: "The capital of France is" -> Paris | Madrid | Ottawa | Cairo (what the model knows).
- choice_opposites: "The opposite of hot is" -> cold | ... (word knowledge).
- choice_sequences: "Monday, Tuesday, Wednesday," -> Thursday | ... (days and months, wrapping around; counting
  by 1, 2, 5 or 10; letters).
- choice_in_context: "Anna has a red hat. Omar has a blue hat. ... The hat of Omar is" -> blue | red | ... (reading the
  prompt itself: four people, four colours, one asked).

Decisions:
- Generated here, from the word lists of this file and a seed: no benchmark data can be fetched offline, and none of
  these items is in any training data of this project (the embedded corpus is Python's own sources and reference;
  the retrofit trains on that and on recall documents). Every variant of a model sees the same items.
- Why it is fair for the comparison: the items test what a conversion must keep (the teacher's knowledge, and its
  use of a short prompt), with prompts of 5 to 40 tokens. A sliding window at least that long computes exactly the
  full-attention model on them, so SWA variants score what the model scores, by construction; a linear-attention
  retrofit changes every layer and may not.
- The harness's multiple-choice scoring (acc: the choice of highest log-likelihood; acc_norm: per character), with
  its target delimiter " " between prompt and choice. Distractors are drawn from the same list as the answer and,
  for sequences, never from the prompt: no rule that ignores the task (always the first, the longest, the shortest,
  the one in or not in the prompt, the most frequent answer) beats chance by more than 5 points (tests/test_choice.py).
- Written as lm-eval task files (a YAML file per task, `dataset_path: json`, and its JSON-lines data), so the
  evaluation suite runs them as it runs any local task (`eval.lm_eval.tasks`, `eval.lm_eval.include_path`), and so
  does lm-eval's own command line: `swax choice-tasks <folder>` writes them and prints that command.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from swax_lightning.core.atomic import written_atomically

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "Greece": "Athens",
    "Canada": "Ottawa", "Austria": "Vienna", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Ireland": "Dublin", "Poland": "Warsaw", "Hungary": "Budapest", "Kenya": "Nairobi",
    "Argentina": "Buenos Aires", "Peru": "Lima", "Thailand": "Bangkok", "South Korea": "Seoul",
    "the United Kingdom": "London", "Belgium": "Brussels", "the Netherlands": "Amsterdam", "Cuba": "Havana",
    "Turkey": "Ankara", "Iran": "Tehran", "Iraq": "Baghdad", "India": "New Delhi", "Mexico": "Mexico City",
    "Chile": "Santiago", "Colombia": "Bogota", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "Czechia": "Prague",
    "Switzerland": "Bern", "Australia": "Canberra",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "young": "old", "rich": "poor", "light": "dark",
    "up": "down", "open": "closed", "early": "late", "hard": "soft", "wet": "dry", "full": "empty", "long": "short",
    "strong": "weak", "loud": "quiet", "thick": "thin", "heavy": "light", "high": "low", "true": "false",
    "clean": "dirty", "inside": "outside", "first": "last", "win": "lose", "push": "pull", "day": "night",
    "love": "hate", "buy": "sell", "top": "bottom", "north": "south", "east": "west", "friend": "enemy",
    "question": "answer", "begin": "end", "accept": "refuse", "arrive": "leave", "remember": "forget",
    "safe": "dangerous", "cheap": "expensive", "sweet": "bitter",
}
SEQUENCES = {
    "days": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "months": ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December"],
    "letters": list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
}
COUNT_STEPS = (1, 2, 5, 10)
CYCLIC = ("days", "months")  # "Saturday, Sunday, Monday," goes on; the alphabet and counting do not
NEAR = 8  # choice_sequences draws its distractors from the NEAR items closest to the answer, the prompt's excluded
NAMES = ("Anna", "Omar", "Lucia", "Peter", "Rosa", "Tomas", "Elena", "Victor", "Nadia", "Hugo", "Ines", "Karl")
COLOURS = ("red", "blue", "green", "black", "white", "yellow", "brown", "grey")
THINGS = ("hat", "coat", "bag", "car", "bicycle", "scarf", "umbrella", "door")
TASKS = ("choice_capitals", "choice_opposites", "choice_sequences", "choice_in_context")
N_CHOICES = 4
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def _item(query: str, answer: str, pool: list[str], rng: random.Random) -> dict:
    """A prompt, the answer among N_CHOICES - 1 distractors from `pool` (the answer's own list), shuffled."""
    choices = [answer, *rng.sample([c for c in dict.fromkeys(pool) if c != answer], N_CHOICES - 1)]
    rng.shuffle(choices)
    return {"query": query, "choices": choices, "label": choices.index(answer)}


def capitals(rng: random.Random) -> dict:
    country = rng.choice(sorted(CAPITALS))
    return _item(f"The capital of {country} is", CAPITALS[country], list(CAPITALS.values()), rng)


def opposites(rng: random.Random) -> dict:
    word = rng.choice(sorted(OPPOSITES))
    return _item(f"The opposite of {word} is", OPPOSITES[word], list(OPPOSITES.values()), rng)


def sequences(rng: random.Random) -> dict:
    kind = rng.choice([*sorted(SEQUENCES), "counting"])
    if kind == "counting":
        step = rng.choice(COUNT_STEPS)
        items = [str(step * i) for i in range(1, 41)]
    else:
        items = SEQUENCES[kind]
    start = rng.randrange(len(items) if kind in CYCLIC else len(items) - 4)
    shown = 3 if len(items) < 8 else rng.randint(3, 4)  # a week has only three days left to offer as distractors
    positions = [(start + i) % len(items) for i in range(shown + 1)]
    answer = items[positions[-1]]
    # Distractors: the items near the answer that the prompt does not show. Drawn from the prompt they would leave
    # "the choice not in the prompt" as the answer; drawn near it, neither size nor position gives the answer away.
    def distance(p: int) -> int:
        d = abs(p - positions[-1])
        return min(d, len(items) - d) if kind in CYCLIC else d
    # An open sequence's first three items are never the answer: never a distractor either, or they would tell.
    candidates = range(len(items)) if kind in CYCLIC else range(3, len(items))
    near = sorted((p for p in candidates if p not in positions), key=distance)[:NEAR]
    shown_items = [items[p] for p in positions[:-1]]
    return _item(", ".join(shown_items) + ",", answer, [items[p] for p in near], rng)


def in_context(rng: random.Random) -> dict:
    people, colours, thing = rng.sample(NAMES, 4), rng.sample(COLOURS, 4), rng.choice(THINGS)
    facts = " ".join(f"{person} has a {colour} {thing}." for person, colour in zip(people, colours))
    asked = rng.randrange(4)
    return _item(f"{facts} The {thing} of {people[asked]} is", colours[asked], colours, rng)


GENERATORS = {"choice_capitals": capitals, "choice_opposites": opposites, "choice_sequences": sequences,
              "choice_in_context": in_context}


def items(task: str, n: int, seed: int = 0) -> list[dict]:
    """n items of one task, a pure function of (task, n's index, seed)."""
    if task not in GENERATORS:
        raise ValueError(f"unknown multiple-choice task {task!r}; known: {', '.join(TASKS)}")
    return [GENERATORS[task](random.Random(f"{seed}/{task}/{i}")) for i in range(n)]


def write_tasks(folder: str | Path, n: int, seed: int = 0, tasks: tuple[str, ...] = TASKS) -> Path:
    """The lm-eval task files of `tasks` with n items each, in `folder` (written atomically, replaced if there):
    give it to the evaluation suite as eval.lm_eval.include_path, with eval.lm_eval.tasks = the task names."""
    if n < 1:
        raise ValueError(f"multiple-choice items per task must be >= 1 (got {n})")
    folder = Path(folder).resolve()
    with written_atomically(folder) as tmp:
        tmp.mkdir(parents=True)
        for task in tasks:
            (tmp / f"{task}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in items(task, n, seed)))
            (tmp / f"{task}.yaml").write_text(TASK_YAML.format(task=task, data=folder / f"{task}.jsonl"))
    return folder


def main(argv: list[str] | None = None) -> None:
    """`swax choice-tasks <folder>`: write the task files, then say how to run them."""
    parser = argparse.ArgumentParser(prog="swax choice-tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where the task files go (replaced if there)")
    parser.add_argument("--items", type=int, default=20, help="items per task (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    args = parser.parse_args(argv)
    if args.items < 1:
        parser.error(f"--items must be >= 1 (got {args.items})")
    folder = write_tasks(args.folder, args.items, args.seed, tuple(args.tasks))
    print(f"wrote {len(args.tasks)} tasks of {args.items} items in {folder}; run them with\n"
          f"  lm_eval --model swax --model_args ckpt_path=<checkpoint> --include_path {folder} "
          f"--tasks {','.join(args.tasks)}")
