"""RULER NIAH: the scoring rule on hand-made cases; the generator (determinism, length in tokens, depth, RULER's
singular rewrite and newline-joined haystacks); oracles: one that reads the whole prompt scores 100 on every task,
one that reads only the last W tokens scores no more than the share of the haystack inside its window."""
import re

import pytest

from swax_lightning.evals import essay, ruler
from swax_lightning.tokenizer import ByteTokenizer

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


W = 256


def window_only_score(task: str, length: int, depths: list[float]) -> tuple[float, float, float]:
    """(score of an oracle that reads only the last W tokens, share of the haystack inside those W tokens, score of
    the same oracle reading the whole prompt), over one sample per depth."""
    gen = ruler.NIAHGenerator(TOK)
    window = visible = full = 0.0
    for i, depth in enumerate(depths):
        sample = gen.sample(task, length, depth, i)
        ids = TOK.encode(sample.input_text)
        seen = TOK.decode(ids[-W:])
        window += ruler.string_match_all(oracle(seen, sample.question), sample.references)
        full += ruler.string_match_all(oracle(sample.input_text, sample.question), sample.references)
        start, end = sample.context_span
        visible += max(0, end - (len(sample.input_text) - len(seen))) / (end - start)
    return window / len(depths), 100 * visible / len(depths), full / len(depths)


@pytest.mark.parametrize("task", sorted(ruler.TASKS))
def test_a_window_only_model_scores_the_share_of_the_haystack_it_sees(task):
    """On RULER's 40-depth grid a model that sees only its last W tokens scores at most the share of the haystack
    inside its window (plus one depth of 40): at most 5% from 32W on, while reading the whole prompt scores 100.
    (At 4W the window holds about a tenth of the haystack here, so 5% cannot hold there for any grid.)"""
    for length in (4 * W, 32 * W):
        window, visible, full = window_only_score(task, length, ruler.depth_grid())
        assert full == 100.0
        assert window <= visible + 100 / 40, (length, window, visible)
        if length >= 32 * W:
            assert window <= 5.0, (length, window)


def test_the_old_five_depth_grid_inflated_window_only_scores():
    """The test above can fail: with depths 0, .25, .5, .75, 1 the window-only oracle scores 20 at 32W."""
    window, _, _ = window_only_score("niah_single_1", 32 * W, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert window == 20.0


@pytest.mark.parametrize("length", [1024, 16384, 131072])
def test_niah_length_in_tokens_of_a_bpe_tokenizer(length, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from swax_lightning.tokenizer import HFTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator([essay.generated_essay(3000)], trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "t.json"))
    sample = ruler.NIAHGenerator(HFTokenizer(tmp_path / "t.json")).sample("niah_multikey_1", length, 0.4)
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

    from swax_lightning.evals.suite import EvalSuite

    trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=TOK))
    with pytest.raises(ValueError, match=r"EvalSuite.niah_lengths: niah_single_2: length 256 is too short"):
        EvalSuite(niah_tasks=["niah_single_2"], niah_lengths=[4096, 256], niah_samples=40).setup(trainer, None, "fit")
    EvalSuite(niah_tasks=["niah_single_2"], niah_lengths=[512], niah_samples=40).setup(trainer, None, "fit")
