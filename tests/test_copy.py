"""Span copying, the window study's short-context task, as data and as an evaluation: a copy episode's queries are
exactly the copied characters, each length + 1 tokens after its original; the evaluation's accuracy is 100 for an
exact copier, chance for a blind model, and for a model that sees W tokens back exactly the spans shorter than W,
through the streaming inference; training documents mix copies among MQAR episodes without breaking fresh keys."""
import pytest
import torch

from swax_lightning.data import mqar_episodes as mqar
from swax_lightning.data.recall_documents import RecallMix, training_document, training_pieces
from swax_lightning.data.tokenizer import load_tokenizer
from swax_lightning.evals.copy import copy_by_length
from swax_lightning.evals.regenerate import prompt
from tests.streaming_text_model import StreamingTextModel


class CopiesBack(StreamingTextModel):
    """A byte-level model of the copy format that, inside the copy, predicts the span's next character when that
    character lies at most `window` tokens back (None: anywhere), and otherwise spreads its bet evenly over the 26
    capitals (argmax: "A")."""

    def __init__(self, window: int | None):
        super().__init__()
        self.window = window

    def next_token_logits(self, text: str) -> torch.Tensor:
        logits = torch.full((257,), -1e4)
        logits[[ord(c) for c in mqar.VALUES]] = 0.0
        line = text.rsplit("\n", 1)[-1]
        if mqar.COPY_MARK in line:
            length = line.index(mqar.COPY_MARK)
            copied = len(line) - length - 1
            # The next character is the span's `copied`-th, length + 1 tokens before the one to predict.
            if copied < length and (self.window is None or length + 1 <= self.window):
                logits[ord(line[copied])] = 50.0
        return logits


def test_a_copy_episodes_queries_are_the_copied_characters_at_reach_length_plus_1():
    import random

    ep = mqar.copy_episode(random.Random(0), 12)
    span = ep.text[:12]
    assert ep.text == f"{span}={span}\n" and "".join(ep.values) == span and set(span) <= set(mqar.VALUES)
    assert [ep.text[o] for o in ep.answer_offsets] == list(span) and ep.reaches == [13] * 12
    assert all(o - r == i for i, (o, r) in enumerate(zip(ep.answer_offsets, ep.reaches)))  # the original's offset
    assert prompt("copy", "span", 12, 3, None, load_tokenizer("byte"), 0) == mqar.eval_copy_episode(12, 3).text


@pytest.mark.parametrize("chunk_len", [5, 4096])
def test_a_model_that_sees_w_back_copies_exactly_the_spans_shorter_than_w(chunk_len):
    tok = load_tokenizer("byte")
    exact = copy_by_length(CopiesBack(None), tok, [8, 40], 4, chunk_len=chunk_len)
    assert [(c["length"], c["reach"], c["accuracy"], c["n"]) for c in exact["lengths"]] == [(8, 9, 100.0, 32),
                                                                                           (40, 41, 100.0, 160)]
    assert all(c["loss"] < 1e-6 for c in exact["lengths"])
    windowed = copy_by_length(CopiesBack(16), tok, [8, 15, 16, 40], 4, chunk_len=chunk_len)
    for cell in windowed["lengths"]:
        spans = [s for s in windowed["samples"] if s["length"] == cell["length"]]
        if cell["reach"] <= 16:
            assert cell["accuracy"] == 100.0 and all(s["prediction"] == s["references"] for s in spans)
        else:  # its bet is even: argmax "A", right exactly where the span has an A
            assert all(s["prediction"] == "A" * cell["length"] for s in spans)
            assert cell["accuracy"] == pytest.approx(100 * sum(s["references"].count("A") for s in spans) / cell["n"])
            assert cell["loss"] == pytest.approx(3.2581, abs=1e-3)  # ln 26


def test_training_documents_mix_copies_without_stale_keys_and_keep_the_mqar_stream_when_there_are_none():
    mix = RecallMix(kind="mqar", max_gap=160, fresh_chars=64, copy_share=0.3, copy_lengths=[8, 48], doc_chars=20_000)
    text, reaches = training_document(0, mix, seed=5)
    assert text[:64].isdigit()
    lines = text[64:].splitlines()  # after the leading filler: one episode per line
    copies = [line.split(mqar.COPY_MARK) for line in lines if mqar.COPY_MARK in line]
    assert 0.2 < len(copies) / len(lines) < 0.4
    assert all(8 <= len(span) <= 48 and span == again for span, again in copies)
    scored = "".join(piece for piece, is_value in training_pieces(0, mix, seed=5) if is_value)
    assert len(scored) == len(reaches) == sum(len(span) for span, _ in copies) + 8 * (len(lines) - len(copies))
    for i, line in enumerate(lines):  # no MQAR episode shares a key letter with one ending within 64 characters
        keys = {c for c in line if c.islower()}
        back, j = 0, i - 1
        while j >= 0 and back < 64:
            assert not keys & {c for c in lines[j] if c.islower()}, (i, j)
            back, j = back + len(lines[j]) + 1, j - 1
    plain = RecallMix(kind="mqar", max_gap=160, fresh_chars=64, doc_chars=20_000)
    assert mqar.COPY_MARK not in training_document(0, plain, 5)[0]


def test_copy_settings_out_of_range_are_refused_by_name():
    with pytest.raises(ValueError, match=r"RecallMix.copy_lengths must be \[shortest, longest\].*\(got \[9, 4\]\)"):
        RecallMix(kind="mqar", copy_lengths=[9, 4])
    with pytest.raises(ValueError, match=r"RecallMix.copy_share must be in \[0, 1\] \(got 1.5\)"):
        RecallMix(kind="mqar", copy_share=1.5)
