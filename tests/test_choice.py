"""The generated multiple-choice tasks (swax_lightning/evals/choice.py): every item's labelled choice is the right
answer by the task's own rule, items are reproducible, and lm-evaluation-harness reads the written task files back
with the same prompts, choices and targets."""
import json

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
            assert sequence[sequence.index(shown[-1]) + 1] == answer(item)
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
