"""RULER NIAH: the scoring rule on hand-made cases; the generator (determinism, length in tokens, depth, RULER's
singular rewrite and newline-joined haystacks); oracles run through the suite's own dealing and scoring: one that
reads the whole prompt scores 100 on every task, one that reads only the last W tokens at most 5 from 16W on."""
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest

from swax_lightning.data.tokenizer import ByteTokenizer
from swax_lightning.evals import essay, ruler
from swax_lightning.evals.suite import EvalSuite

TOK = ByteTokenizer()
NEEDLE_RE = re.compile(r"One of the special magic \w+ for (\S+) is: (\S+)\.")


@pytest.mark.parametrize("prediction,references,score", [
    (" 1234567.", ["1234567"], 100.0),
    (" are 1234567 and 7654321", ["7654321", "1234567"], 100.0),
    (" are 1234567 and 765432", ["7654321", "1234567"], 50.0),
    ("", ["1234567"], 0.0),
    (" TALL-CASTLE", ["tall-castle"], 100.0),             # case-insensitive
    (" 12345678", ["1234567"], 100.0),                    # substring, as RULER scores it
])
def test_string_match_all(prediction, references, score):
    assert ruler.string_match_all(prediction, references) == score


def test_string_match_all_needs_references():
    with pytest.raises(ValueError):
        ruler.string_match_all("x", [])


def oracle(text: str, question: str) -> str:
    """Every value of a needle in `text` whose key the question asks for."""
    keys = re.search(r" for (.+) mentioned in the provided text\?", question).group(1)
    keys = keys.replace(", and ", ", ").split(", ")
    return " ".join(value for key, value in NEEDLE_RE.findall(text) if key in keys)


@pytest.mark.parametrize("task", sorted(ruler.TASKS))
def test_niah_samples(task):
    gen = ruler.NIAHGenerator(TOK, seed=3)
    a, b = gen.sample(task, 4096, 0.5, index=2), gen.sample(task, 4096, 0.5, index=2)
    assert a == b  # deterministic for a seed
    assert gen.sample(task, 4096, 0.5, index=3).input_text != a.input_text
    assert ruler.NIAHGenerator(TOK, seed=4).sample(task, 4096, 0.5, index=2).input_text != a.input_text
    budget = 4096 - gen.max_new_tokens
    assert budget - 40 <= a.n_tokens <= budget  # fills the requested length in the model's tokens
    _, _, value_kind, _, n_values, n_queries = ruler.TASKS[task]
    singular = n_values * n_queries == 1
    assert a.input_text.startswith("A special magic" if singular else "Some special magic")
    assert a.input_text.endswith("mentioned in the provided text " + ("is" if singular else "are"))
    assert a.question.startswith(f"What is the special magic {value_kind[:-1]} for" if singular
                                 else f"What are all the special magic {value_kind} for")
    assert a.question in a.input_text
    assert len(a.references) == max(n_values, n_queries)
    assert ruler.string_match_all(oracle(a.input_text, a.question), a.references) == 100.0


def test_haystack_pieces_are_joined_as_ruler_joins_them():
    noise = ruler.NIAHGenerator(TOK).sample("niah_single_1", 2048, 0.5)
    start, end = noise.context_span
    lines = noise.input_text[start:end].split("\n")
    assert lines[0] == ruler.NOISE and len(lines) > 5  # one noise unit per line
    needles = ruler.NIAHGenerator(TOK).sample("niah_multikey_2", 2048, 0.5)
    start, end = needles.context_span
    assert all(line.startswith("One of the special magic") for line in needles.input_text[start:end].split("\n")[:-1])


def test_default_essay_is_not_the_training_text():
    """The tiny runs train on the standard library's sources and the language reference: the default haystack
    shares no sentence with the language reference and names no BABILong label."""
    from pydoc_data.topics import topics

    generated = set(essay.prose_sentences(essay.generated_essay(2000)))
    reference = set(essay.prose_sentences("\n".join(topics.values())))
    assert len(generated) > 1500 and not generated & reference
    text = essay.generated_essay(2000).lower()
    for word in ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office", "mary", "john", "daniel", "sandra",
                 "fred", "bill", "jeff", "apple", "football", "milk", "special magic"):
        assert word not in text
    sample = ruler.NIAHGenerator(TOK).sample("niah_single_2", 2048, 0.5)
    first = sample.input_text[sample.context_span[0]:].split(". ")[0] + "."
    assert first in essay.prose_sentences(essay.generated_essay())  # the default haystack is the generated prose


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_needle_sits_at_the_requested_depth(depth):
    sample = ruler.NIAHGenerator(TOK).sample("niah_single_2", 8192, depth)
    start, end = sample.context_span
    assert sample.input_text[sample.needle_char:].startswith("One of the special magic numbers for")
    assert abs((sample.needle_char - start) / (end - start) - depth) < 0.03


def test_depth_grid():
    grid = ruler.depth_grid()
    assert len(grid) == 40 and grid[0] == 0.0 and grid[-1] == 1.0
    assert all(abs((b - a) - 1 / 39) < 1e-5 for a, b in zip(grid, grid[1:]))
    rulers_own = [round(100 * i / 39) for i in range(40)]  # RULER's whole percents (no .5 ties: 100 i / 39 never is)
    assert max(abs(100 * d - r) for d, r in zip(grid, rulers_own)) <= 0.5


W = 256
QUESTION_RE = re.compile(r"What (?:is|are all) the special magic \w+ for .+ mentioned in the provided text\?")


def reader(window: int | None):
    """A model that answers every needle it can read: in the last `window` tokens of the prompt, or in all of it."""
    def answer(text: str) -> str:
        seen = TOK.decode(TOK.encode(text)[-window:]) if window else text
        return oracle(seen, QUESTION_RE.findall(seen)[-1]) if QUESTION_RE.search(seen) else ""
    return answer


def run_suite_niah(suite, window: int | None, answering) -> tuple[dict, list]:
    """The suite's own NIAH run (its job list, its samples, its scoring, its budget) with reader(window)."""
    answering(reader(window))
    samples = []
    return suite.evaluation("niah").run(None, SimpleNamespace(tokenizer=TOK), samples), samples


def test_a_window_only_model_scores_at_most_5_on_every_task_through_the_suites_dealing(answering):
    """The suite's default grid (40 depths, 40 samples per task and length), every task, answers generated 14 at a
    time as the retrofit configs do: a model that sees only its last W tokens scores at most 5% from 16W on, on
    every task, while one that reads the whole prompt scores 100.
    With the earlier dealing (depth (i x 8 + t) mod 40, 5 samples per task) each task saw 5 depths and the task
    listed last here, niah_single_3, scored 20 at 16W, 32W and 64W."""
    suite = EvalSuite(niah=dict(tasks=sorted(ruler.TASKS), lengths=[16 * W, 32 * W, 64 * W]), batch_size=14)
    niah = suite.evaluation("niah").settings
    assert niah.samples == 40 and len(niah.depths) == 40  # the defaults
    window, samples = run_suite_niah(suite, W, answering)
    for task in ruler.TASKS:
        for length in niah.lengths:
            cell = window["scores"][task][str(length)]
            assert cell["n"] == 40 and cell["mean"] <= 5.0, (task, length, cell)
    full, _ = run_suite_niah(suite, None, answering)
    assert all(c["mean"] == 100.0 for row in full["scores"].values() for c in row.values())
    depths = defaultdict(list)
    for sample in samples:
        depths[sample["task"], sample["length"]].append(sample["depth"])
    assert len(depths) == 8 * 3 and all(sorted(d) == ruler.depth_grid() for d in depths.values())  # every depth


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_a_model_answering_in_rulers_format_scores_100_on_every_task_with_any_tokenizer_and_a_blind_one_0(
        tokenizer, bpe_tokenizer, answering):
    """RULER's budget (128 new tokens of the model) holds the longest answer of every task in the format the prompt's
    answer prefix asks for (four uuids or numbers), for a byte tokenizer as for a BPE one: a reading model scores 100
    through the suite's own generation and scoring, a blind one 0."""
    tok = TOK if tokenizer == "byte" else bpe_tokenizer
    suite = EvalSuite(niah=dict(tasks=sorted(ruler.TASKS), lengths=[4096], samples=2, depths=2))
    answering(lambda text: " " + ", ".join(oracle(text, QUESTION_RE.findall(text)[-1]).split()) + ".")
    reading = suite.evaluation("niah").run(None, SimpleNamespace(tokenizer=tok), [])
    assert all(reading["scores"][task]["4096"]["mean"] == 100.0 for task in ruler.TASKS)
    answering(lambda text: " 0000000.")
    blind = suite.evaluation("niah").run(None, SimpleNamespace(tokenizer=tok), [])
    assert all(blind["scores"][task]["4096"]["mean"] == 0.0 for task in ruler.TASKS)


def test_few_depths_let_a_window_only_model_score_20(answering):
    """The test above can fail: with depths 0, .25, .5, .75, 1 the needle at depth 1 sits inside the window, and the
    window-only model scores 20 at 32W."""
    suite = EvalSuite(niah=dict(tasks=["niah_single_1"], lengths=[32 * W], samples=5, depths=5))
    window, _ = run_suite_niah(suite, W, answering)
    assert window["scores"]["niah_single_1"][str(32 * W)]["mean"] == 20.0


@pytest.mark.parametrize("length", [1024, 16384, 131072])
def test_niah_length_in_tokens_of_a_bpe_tokenizer(length, bpe_tokenizer):
    sample = ruler.NIAHGenerator(bpe_tokenizer).sample("niah_multikey_1", length, 0.4)
    assert length - 128 - 40 <= sample.n_tokens <= length - 128


@pytest.mark.parametrize("make,match", [
    (lambda: ruler.NIAHGenerator(TOK).sample("niah_single_9", 4096, 0.5), "unknown NIAH task"),
    (lambda: ruler.NIAHGenerator(TOK).sample("niah_multiquery", 300, 0.5), "too short"),
    (lambda: ruler.depth_grid(0), "at least one depth"),
])
def test_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_too_short_niah_length_is_refused_at_setup_before_any_training():
    """A study arm with a 256-token NIAH length trained for 4 minutes, then its test failed on the length."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=TOK))
    module = SimpleNamespace(arch=None)  # no window override: the model's shape is not consulted
    with pytest.raises(ValueError, match=r"eval.niah.lengths: niah_single_2: length 256 is too short"):
        EvalSuite(niah=dict(tasks=["niah_single_2"], lengths=[4096, 256], samples=40)).setup(trainer, module, "fit")
    EvalSuite(niah=dict(tasks=["niah_single_2"], lengths=[512], samples=40)).setup(trainer, module, "fit")
