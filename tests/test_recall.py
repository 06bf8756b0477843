"""Synthetic recall documents and the answer-token loss by distance: oracles, blind baselines, held-out separation."""
import math
import re

import pytest
import torch

from swax_lightning.data.recall_documents import RecallMix, eval_sample, training_document
from swax_lightning.data.tokenizer import load_tokenizer
from swax_lightning.evals.essay import generated_essay, prose_sentences
from swax_lightning.evals.recall_loss import answer_loss, bucket_distances, recall_losses
from swax_lightning.evals.ruler import load_words

FACT = re.compile(r"One of the special magic numbers for (\w+) is: (\d+)\.")
QUESTION = re.compile(r"What is the special magic number for (\w+)\? The special magic number for \1 is: (\d+)\.")


def test_every_question_repeats_a_fact_stated_at_its_distance():
    mix = RecallMix(near_limit=128, max_distance=900, far_share=0.25)
    doc, distances = training_document(3, mix, seed=1)
    assert (doc, distances) == training_document(3, mix, seed=1)  # a pure function of (seed, index)
    facts = {m.group(1): m.group(2) for m in FACT.finditer(doc)}
    questions = list(QUESTION.finditer(doc))
    assert len(questions) == len(distances) > 20
    for q in questions:  # an oracle reading the document answers every question
        assert facts[q.group(1)] == q.group(2)
    assert min(distances) >= mix.min_distance and max(distances) <= mix.max_distance + 80
    far = sum(d >= mix.near_limit for d in distances) / len(distances)
    assert 0.1 < far < 0.6  # most recalls are near, some beyond the long window


def test_recall_mix_checks_its_fields():
    with pytest.raises(ValueError, match="near_limit"):
        RecallMix(min_distance=8, near_limit=4)
    with pytest.raises(ValueError, match="RecallMix.far_share"):
        RecallMix(far_share=1.5)


def test_held_out_samples_share_no_key_or_filler_with_training():
    adjectives, nouns = load_words()
    keys = [f"{a}-{n}" for a in adjectives for n in nouns]
    filler = prose_sentences(generated_essay(seed=1))
    training = "".join(training_document(i, RecallMix())[0] for i in range(20))
    train_keys = {m.group(1) for m in FACT.finditer(training)}
    for i in range(20):
        sample = eval_sample(300, i, filler, keys)
        assert sample.key not in train_keys and sample.key not in training and "-" in sample.key
        gap = sample.prompt.split("\n", 1)[1].rsplit("\n", 1)[0]
        assert len(gap) == 300 and gap[:40] not in training


class OneChunk(torch.nn.Module):
    """Test models that read a whole text at once: the scorer's streaming interface with no state to carry (the
    answer loss reads its text in one chunk)."""

    def new_caches(self, batch, dtype):
        return []

    def forward(self, ids, caches=None, positions=None, logits_at=None):
        logits = self.all_logits(ids)
        return logits if logits_at is None else logits[logits_at]


class Oracle(OneChunk):
    """Knows the full token stream it is evaluated on: logits one-hot on the true next token."""

    def __init__(self, stream, vocab=257):
        super().__init__()
        self.stream, self.vocab, self.w = stream, vocab, torch.nn.Parameter(torch.zeros(1))

    def all_logits(self, ids):
        nxt = torch.tensor(self.stream[1:ids.shape[1] + 1])
        return 50.0 * torch.nn.functional.one_hot(nxt, self.vocab).float()[None]


class Blind(OneChunk):
    def __init__(self, vocab=257):
        super().__init__()
        self.vocab, self.w = vocab, torch.nn.Parameter(torch.zeros(1))

    def all_logits(self, ids):
        return torch.zeros(1, ids.shape[1], self.vocab)


class Copier(OneChunk):
    """Predicts that each next token repeats the one `offset` tokens before it."""

    def __init__(self, offset, vocab=257):
        super().__init__()
        self.offset, self.vocab, self.w = offset, vocab, torch.nn.Parameter(torch.zeros(1))

    def all_logits(self, ids):
        back = torch.cat([torch.zeros(ids.shape[0], self.offset - 1, dtype=ids.dtype), ids], 1)[:, :ids.shape[1]]
        return 50.0 * torch.nn.functional.one_hot(back, self.vocab).float()


def test_reach_is_the_offset_from_value_to_answer():
    adjectives, nouns = load_words()
    keys = [f"{a}-{n}" for a in adjectives for n in nouns]
    sample = eval_sample(40, 0, prose_sentences(generated_essay(seed=1)), keys)
    tok = load_tokenizer("byte")
    loss, exact = answer_loss(Copier(sample.reach), tok, sample.prompt, sample.value)
    assert loss < 1e-6 and exact  # a layer that sees exactly `reach` back answers
    assert not answer_loss(Copier(sample.reach - 1), tok, sample.prompt, sample.value)[1]
    assert sample.reach > sample.distance + 90  # the fact's tail and the question lie between


def test_answer_loss_oracle_is_zero_and_blind_is_chance():
    tok = load_tokenizer("byte")
    prompt, answer = "the code of kavo is: ", "4819273"
    loss, exact = answer_loss(Oracle(tok.encode(prompt) + tok.encode(answer)), tok, prompt, answer)
    assert loss < 1e-6 and exact
    loss, exact = answer_loss(Blind(), tok, prompt, answer)
    assert loss == pytest.approx(math.log(257)) and not exact


def test_buckets_hold_their_distances_and_report_intervals():
    edges = [1, 8, 128, 1024]
    jobs = bucket_distances(edges, 5, seed=0)
    assert all(lo <= d < hi for lo, hi, d in jobs) and len(jobs) == 15
    with pytest.raises(ValueError, match="eval.recall.edges"):
        bucket_distances([8, 8], 1, 0)
    out = recall_losses(Blind(), load_tokenizer("byte"), edges, 3)
    assert [(b["from"], b["to"], b["n"]) for b in out["buckets"]] == [(1, 8, 3), (8, 128, 3), (128, 1024, 3)]
    assert all(b["exact"] == 0 and b["loss"] == pytest.approx(math.log(257)) for b in out["buckets"])
    for b in out["buckets"]:
        reaches = [r["reach"] for r in out["samples"] if r["from"] == b["from"]]
        assert b["reach"] == [min(reaches), max(reaches)] and b["reach"][0] > b["from"] + 90


def test_recall_documents_go_to_the_training_split_only(tmp_path):
    from litdata import StreamingDataset, TokensLoader

    from swax_lightning.data.datamodule import TextDataModule

    source = tmp_path / "text"
    source.mkdir()
    for i in range(40):
        (source / f"doc{i}.txt").write_text(f"Plain document number {i}. " * 40)
    data = TextDataModule(source=str(source), data_dir=str(tmp_path / "shards"), seq_len=64, batch_size=1,
                          val_fraction=0.2, test_fraction=0.2, recall=RecallMix(documents=3, doc_chars=2000))
    data.prepare_data()
    data.setup()
    assert 0.1 < data.meta["recall_share_of_train"] < 0.4 and data.meta["recall"]["documents"] == 3
    tok = load_tokenizer("byte")
    for split, has_recall in (("train", True), ("val", False), ("test", False)):
        stream = StreamingDataset(str(tmp_path / "shards" / split), item_loader=TokensLoader(block_size=65))
        text = "".join(tok.decode(stream[i].tolist()) for i in range(len(stream)))
        assert ("special magic number" in text) == has_recall, split
        if split == "train":
            # Written in a shuffled document order: a short run, which reads a chunk or two, sees both kinds. In
            # source order the recall documents came after every text document.
            assert text.index("special magic number") < text.rindex("Plain document")


def test_window_mqar_sequences_are_answerable_by_an_oracle_and_only_by_it():
    """experiments/window_mqar.py: reading each row's pairs answers every masked position (oracle, accuracy 1); the
    masked positions are the pairs' keys, each asked once, after the gap; a constant guess scores about 1/64. Keys of
    three tokens: only the whole key names the value (every two-token suffix is shared by two keys)."""
    from experiments import window_mqar as mqar
    pairs, gap = 8, 37
    for k in (1, 3):
        x, mask = mqar.batch(seed=5, size=64, pairs=pairs, gap=(gap, gap), key_tokens=k)
        span = k + 1
        assert x.shape == (64, 2 * span * pairs + gap) and mask.shape == (64, x.shape[1] - 1)
        assert torch.equal(x, mqar.batch(seed=5, size=64, pairs=pairs, gap=(gap, gap), key_tokens=k)[0])
        hits, blind = 0, 0
        for row, m in zip(x.tolist(), mask):
            table = {tuple(row[j:j + k]): row[j + k] for j in range(0, span * pairs, span)}
            assert len(table) == pairs and all(mqar.KEYS[0] <= t < mqar.KEYS[1] for key in table for t in key)
            if k > 1:
                suffixes = [key[1:] for key in table]
                assert all(suffixes.count(s) == 2 for s in suffixes)
            asked = m.nonzero().flatten().tolist()
            assert sorted(tuple(row[p - k + 1:p + 1]) for p in asked) == sorted(table)
            assert min(asked) == span * pairs + gap + k - 1
            hits += sum(table[tuple(row[p - k + 1:p + 1])] == row[p + 1] for p in asked)
            blind += sum(row[p + 1] == mqar.VALUES[0] for p in asked)
        assert hits == 64 * pairs
        assert blind < 64 * pairs * 0.05


def test_window_mqar_arms_and_gap_curriculum():
    """experiments/window_mqar.py: the attention arm is full attention only (no window, no memory), --repeats stacks
    the arm's two blocks, --short_gap_steps N draws the first N steps' gaps in 0..16, the rest in 0..--train_gap,
    --attention_conv K puts width-K convolutions on every attention layer (none by default) and --igate_bias sets the
    mLSTM input-gate bias (0 by default)."""
    from experiments import window_mqar as mqar
    from swax_lightning.model.mlstm import MLSTMLayer
    args = mqar.parse_args(["--d_model", "16", "--repeats", "2", "--train_gap", "160", "--short_gap_steps", "3"])
    attention = mqar.arm_model("attention", args)
    assert [b.kind for b in attention.blocks] == ["A"] * 4 and not attention.attention_layers(sliding=True)
    hybrid = mqar.arm_model("long", args)
    assert [b.kind for b in hybrid.blocks] == ["S", "X", "S", "X"]
    assert sum(isinstance(b.mixer, MLSTMLayer) for b in hybrid.blocks) == 2
    assert [mqar.training_gaps(step, args) for step in range(5)] == [(0, 16)] * 3 + [(0, 160)] * 2
    assert mqar.training_gaps(0, mqar.parse_args(["--train_gap", "48"])) == (0, 48)
    assert all(layer.convs is None for layer in hybrid.attention_layers())
    assert all(b.mixer.igate.bias.eq(0).all() for b in hybrid.blocks if b.kind == "X")
    tuned = mqar.arm_model("long", mqar.parse_args(["--d_model", "16", "--attention_conv", "4", "--igate_bias", "-10"]))
    assert all(conv.kernel == 4 for layer in tuned.attention_layers() for conv in layer.convs)
    assert all(b.mixer.igate.bias.eq(-10).all() for b in tuned.blocks if b.kind == "X")


def test_copy_loss_at_gap_scores_the_repeated_letters():
    """recall_emergence.py --eval_gaps: a layer that copies from exactly length + gap back scores 0 on the second
    string's letters 2..length; one that looks a letter short is wrong on them."""
    from experiments import recall_emergence as emergence
    for gap in (0, 8, 100):
        assert emergence.copy_loss_at_gap(Copier(16 + gap), gap, 16) < 1e-6
        assert emergence.copy_loss_at_gap(Copier(16 + gap - 1), gap, 16) > 10


def test_recall_emergence_scores_exactly_the_recalled_characters():
    """experiments/recall_emergence.py --task: in each task's documents every scored range is a recall (the value the
    same key was stated with earlier, or the rest of a list that appeared earlier), every question's answer is
    scored, and in a batch the masked positions are exactly those whose next byte lies in a scored range."""
    import argparse
    import re

    from experiments import recall_emergence as emergence
    prose, mix = emergence.prose(), RecallMix(near_limit=64, max_distance=450)
    for task in ("facts", "needle", "spans"):
        doc, scored = emergence.document(task, 3, prose, pairs=4, chars=4096, mix=mix)
        assert scored and all(b - a >= 7 for a, b in scored)
        for a, b in scored:
            if task == "spans":
                assert doc[a:b] in doc[:a - 4], task
            else:
                key = re.search(r"for (\w+) is: $", doc[:a]).group(1)
                stated = re.findall(rf"numbers for {key} is: (\d+)\.", doc[:a])
                assert stated[-1] == doc[a:b], task
        if task != "spans":
            assert len(scored) == doc.count("The special magic number for")
        args = argparse.Namespace(task=task, batch=6, seq=128, pairs=4, min_distance=8, near_limit=64)
        x, mask = emergence.recall_batch(2, args, prose)
        assert torch.equal(x, emergence.recall_batch(2, args, prose)[0])  # a pure function of the step
        for i, row in enumerate(x.tolist()):
            doc, scored = emergence.document(task, 2 * 6 + i, prose, 4, 256, mix)
            start = doc.index(bytes(row).decode())
            wanted = [any(a <= start + j + 1 < b for a, b in scored) for j in range(128)]
            assert mask[i].tolist() == wanted, task
