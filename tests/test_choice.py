"""The generated multiple-choice tasks (swax_lightning/evals/choice.py): every item's labelled choice is the right
answer by the task's own rule, items are reproducible, and lm-evaluation-harness reads the written task files back
with the same prompts, choices and targets."""
import json
import re
from collections import Counter

import pytest

from swax_lightning.evals import choice


def answer(item: dict) -> str:
    return item["choices"][item["label"]]


def test_every_label_is_the_right_answer():
    for item in choice.items("choice_capitals", 30):
        country = item["query"].removeprefix("The capital of ").removesuffix(" is")
        assert answer(item) == choice.CAPITALS[country]
    for item in choice.items("choice_opposites", 30):
        assert answer(item) == choice.OPPOSITES[item["query"].removeprefix("The opposite of ").removesuffix(" is")]
    for item in choice.items("choice_sequences", 60):
        shown = item["query"].rstrip(",").split(", ")
        if shown[0].isdigit():
            step = int(shown[1]) - int(shown[0])
            assert int(answer(item)) == int(shown[-1]) + step and step in choice.COUNT_STEPS
        else:
            sequence = next(s for s in choice.SEQUENCES.values() if shown[0] in s)
            following = sequence.index(shown[-1]) + 1  # days and months go on after the last, letters do not
            assert sequence[following % len(sequence)] == answer(item) and (following < 26 or len(sequence) < 26)
            assert not set(item["choices"]) & set(shown)  # no distractor is in the prompt
    for item in choice.items("choice_in_context", 30):
        facts, question = item["query"].rsplit(". The ", 1)
        thing, person = question.removesuffix(" is").split(" of ")
        assert f"{person} has a {answer(item)} {thing}" in facts


def test_items_have_four_distinct_choices_and_are_reproducible():
    for task in choice.TASKS:
        items = choice.items(task, 40, seed=3)
        assert items == choice.items(task, 40, seed=3) and items != choice.items(task, 40, seed=4)
        assert all(len(set(item["choices"])) == choice.N_CHOICES for item in items)
        labels = {item["label"] for item in items}
        assert labels == set(range(choice.N_CHOICES))  # the answer's place is shuffled
    with pytest.raises(ValueError, match="unknown multiple-choice task"):
        choice.items("choice_trivia", 1)


def test_the_harness_reads_the_task_files_back(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager, get_task_dict

    folder = choice.write_tasks(tmp_path / "tasks", 5, seed=1)
    tasks = get_task_dict(list(choice.TASKS), TaskManager(include_path=str(folder), include_defaults=False))
    for name in choice.TASKS:
        task = tasks[name]
        docs = list(task.test_docs())
        expected = [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
        assert docs == expected == choice.items(name, 5, seed=1)
        for doc in docs:
            assert task.doc_to_text(doc) == doc["query"] and task.doc_to_choice(doc) == doc["choices"]
            assert task.doc_to_target(doc) == doc["label"]


def _in_prompt(item: dict, choice_text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(choice_text)}(?!\w)", item["query"]) is not None


def _pick_first(item: dict, keep) -> int:
    return next((i for i, c in enumerate(item["choices"]) if keep(c)), 0)


TRIVIAL_RULES = {
    "always first": lambda item, prior: 0,
    "longest": lambda item, prior: max(range(4), key=lambda i: len(item["choices"][i])),
    "shortest": lambda item, prior: min(range(4), key=lambda i: len(item["choices"][i])),
    "in the prompt": lambda item, prior: _pick_first(item, lambda c: _in_prompt(item, c)),
    "not in the prompt": lambda item, prior: _pick_first(item, lambda c: not _in_prompt(item, c)),
    "most frequent answer": lambda item, prior: max(range(4), key=lambda i: prior[item["choices"][i]]),
}


def trivial_rule_scores(task: str, n: int = 400) -> dict[str, float]:
    """Percent of n items each rule gets right without reading the task: ties go to the earlier choice, and the
    answer-frequency prior is the answers' distribution, estimated on 10 n other items (another seed)."""
    items = choice.items(task, n, seed=11)
    prior = Counter(answer(item) for item in choice.items(task, 10 * n, seed=12))
    return {rule: 100 * sum(pick(item, prior) == item["label"] for item in items) / n
            for rule, pick in TRIVIAL_RULES.items()}


@pytest.mark.parametrize("task", choice.TASKS)
def test_no_rule_that_ignores_the_task_beats_chance(task):
    scores = trivial_rule_scores(task)
    assert all(score <= 100 / choice.N_CHOICES + 5 for score in scores.values()), scores
