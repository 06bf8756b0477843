"""Associative recall as data and as an evaluation: episodes an oracle answers and only the whole key names, training
gaps inside the long window, the evaluation's accuracy exactly what a reader of the pairs (100), a blind model (chance)
and a model that sees W tokens back (the queries with reach <= W) score, through the streaming inference."""
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from swax_lightning.data import mqar_episodes as mqar
from swax_lightning.data.recall_documents import RecallMix, training_document
from swax_lightning.data.tokenizer import load_tokenizer
from swax_lightning.evals.mqar import encode_episode, mqar_by_gap
from swax_lightning.evals.reports import flat_metrics, markdown
from tests.streaming_text_model import StreamingTextModel

ROOT = Path(__file__).resolve().parents[1]
PAIR = re.compile(r"([a-z]+)([A-Z])")


def answers_by_reading(text: str) -> list[tuple[str, str]]:
    """(value stated first for the key, value written at the query) for every repeated key of every line."""
    out = []
    for line in text.splitlines():
        stated = {}
        for key, value in PAIR.findall(line):
            if key in stated:
                out.append((stated[key], value))
            else:
                stated[key] = value
    return out


def test_training_documents_answer_every_query_inside_the_long_window():
    mix = RecallMix(kind="mqar", documents=1, pairs=6, key_length=2, max_gap=24, doc_chars=4000)
    doc, reaches = training_document(7, mix, seed=2)
    assert (doc, reaches) == training_document(7, mix, seed=2)  # a pure function of (seed, index)
    assert doc != training_document(8, mix, seed=2)[0] != training_document(7, mix, seed=3)[0]
    answered = answers_by_reading(doc)
    assert len(answered) == len(reaches) == 6 * len(doc.splitlines()) and all(a == b for a, b in answered)
    assert max(reaches) <= mqar.max_reach(6, 2, 24) == 57 and min(reaches) >= 3  # a long window of 64 holds them
    lead, body = doc[:mix.fresh_chars], doc[mix.fresh_chars:]
    assert lead.isdigit() and len(lead) == 64  # the leading filler: nothing before it is in a query's reach
    gaps = [len(re.search(r"\d*", line[6 * 3:]).group()) for line in body.splitlines()]
    assert min(gaps) == 0 and max(gaps) == 24


@pytest.mark.parametrize("pairs, key_length", [(4, 2), (6, 2), (8, 2), (8, 3)])
def test_only_the_whole_key_names_its_value(pairs, key_length):
    for index in range(20):
        ep = mqar.eval_episode(0, index, pairs, key_length)
        keys = PAIR.findall(ep.text)[:pairs]
        assert len({k for k, _ in keys}) == pairs and all(len(k) == key_length for k, _ in keys)
        for key, _ in keys:  # every part of a key short of the whole is shared with another key
            for p in range(key_length):
                assert any(other != key and all(other[q] == key[q] for q in range(key_length) if q != p)
                           for other, _ in keys)


def test_episode_reach_is_the_offset_from_the_stated_value_to_its_query():
    ep = mqar.eval_episode(37, 3, 6, 2)
    for j, (offset, reach, value) in enumerate(zip(ep.answer_offsets, ep.reaches, ep.values)):
        key = ep.text[offset - 2:offset]
        stated = ep.text.index(key) + 2
        i = stated // mqar.pair_chars(2)  # the pair's place among the stated ones
        assert ep.text[offset] == ep.text[stated] == value and offset - stated == reach == (6 + j - i) * 3 + 37
    assert len(ep.text) == mqar.episode_chars(6, 2, 37)
    reaches = [r for index in range(30) for r in mqar.eval_episode(37, index, 6, 2).reaches]
    assert max(reaches) == mqar.max_reach(6, 2, 37) and min(reaches) == 37 + mqar.pair_chars(2) == 40
    assert "".join(piece for piece, _ in ep.pieces()) == ep.text


def test_shapes_without_a_whole_key_set_are_refused_by_name():
    with pytest.raises(ValueError, match="RecallMix.pairs / key_length"):
        RecallMix(kind="mqar", pairs=5, key_length=2)
    with pytest.raises(ValueError, match="RecallMix.kind"):
        RecallMix(kind="pairs")
    with pytest.raises(ValueError, match="RecallMix.max_gap"):
        RecallMix(kind="mqar", max_gap=-1)
    # 8 one-letter keys per episode: 2 neighbours within 64 characters leave 10 letters, 3 (within 99) only 2
    RecallMix(kind="mqar", pairs=8, fresh_chars=66)
    with pytest.raises(ValueError, match=r"RecallMix.fresh_chars = 99: up to 3 earlier episodes .* leave 2 of 26"):
        RecallMix(kind="mqar", pairs=8, fresh_chars=99)


class SeesBack(StreamingTextModel):
    """A byte-level model of the MQAR format that answers a query when its key's stated value lies at most `window`
    tokens back (None: anywhere), and otherwise spreads its bet evenly over the 26 capitals."""

    def __init__(self, window: int | None, key_length: int = 2):
        super().__init__()
        self.window, self.key_length = window, key_length

    def next_token_logits(self, text: str) -> torch.Tensor:
        logits = torch.full((257,), -1e4)
        logits[[ord(c) for c in mqar.VALUES]] = 0.0
        line = text.rsplit("\n", 1)[-1]
        keys = re.findall(rf"(?<![a-z])[a-z]{{{self.key_length}}}", line)  # every key written so far, in order
        if keys and line.endswith(keys[-1]) and keys[-1] in keys[:-1]:  # a key asked again: its value comes next
            value_at = len(text) - len(line) + line.index(keys[-1]) + self.key_length
            if self.window is None or len(text) - value_at <= self.window:
                logits[ord(text[value_at])] = 50.0
        return logits


@pytest.mark.parametrize("chunk_len", [7, 4096])
def test_a_reader_of_the_pairs_scores_100_a_blind_model_chance(chunk_len):
    tok = load_tokenizer("byte")
    reader = mqar_by_gap(SeesBack(None), tok, [0, 40], 40, 6, 2, chunk_len=chunk_len)
    assert [(g["gap"], g["accuracy"], g["n"]) for g in reader["gaps"]] == [(0, 100.0, 240), (40, 100.0, 240)]
    assert all(g["loss"] < 1e-6 for g in reader["gaps"])
    blind = mqar_by_gap(SeesBack(0), tok, [0, 40], 40, 6, 2, chunk_len=chunk_len)
    for g in blind["gaps"]:
        assert g["loss"] == pytest.approx(math.log(26), abs=1e-4)
        assert g["accuracy_ci95"][0] <= 100 / 26 <= g["accuracy_ci95"][1]  # its "A" is right 1 time in 26


def test_a_model_that_sees_w_back_answers_exactly_the_queries_within_reach():
    # Out of its reach it bets evenly on the capitals, and argmax takes the first: "A".
    tok, window = load_tokenizer("byte"), 30
    out = mqar_by_gap(SeesBack(window), tok, [0, 10, 30], 16, 6, 2, chunk_len=64)
    for g in out["gaps"]:
        right = 0
        for s in (s for s in out["samples"] if s["gap"] == g["gap"]):
            ep = mqar.eval_episode(g["gap"], s["index"], 6, 2)
            expected = "".join(v if reach <= window else "A" for v, reach in zip(ep.values, ep.reaches))
            assert s["prediction"] == expected and s["references"] == "".join(ep.values)
            right += sum(p == v for p, v in zip(expected, ep.values))
        assert g["accuracy"] == pytest.approx(100 * right / g["n"])
    assert out["gaps"][0]["accuracy"] > 40 > 10 > out["gaps"][2]["accuracy"]  # gap 30: every pair is beyond 30


def test_pieces_tokenize_as_the_whole_text_and_values_are_single_tokens():
    tok = load_tokenizer("byte")
    ep = mqar.eval_episode(12, 0, 6, 2)
    ids, values = encode_episode(tok, ep)
    assert ids == tok.encode(ep.text) and [ids[v[0]] for v in values] == [ord(c) for c in ep.values]


def test_the_report_table_and_scalars_hold_every_gap():
    out = mqar_by_gap(SeesBack(None), load_tokenizer("byte"), [0, 64], 4, 6, 2)
    results = {"settings": {}, "mqar": {k: v for k, v in out.items() if k != "samples"}}
    assert flat_metrics(results) == {"eval/mqar/gap_0/accuracy": 100.0, "eval/mqar/gap_0/value_loss": pytest.approx(0),
                                     "eval/mqar/gap_64/accuracy": 100.0,
                                     "eval/mqar/gap_64/value_loss": pytest.approx(0)}
    rows = [line for line in markdown(results).splitlines() if line.startswith(("| 0 |", "| 64 |"))]
    assert [row.split(" | ")[2:] for row in rows] == [["100.0 [86, 100]", "0.000 [0.000, 0.000]", "24 |"]] * 2
    assert all(f" | {g['reach'][0]}-{g['reach'][1]} | " in row for g, row in zip(out["gaps"], rows))
    assert "3.8% knowing only the values' alphabet" in markdown(results)


def _mqar_data(tmp_path, documents=4):
    from swax_lightning.data.datamodule import TextDataModule

    source = tmp_path / "text"
    source.mkdir(exist_ok=True)
    for i in range(40):
        (source / f"doc{i}.txt").write_text(f"Plain document number {i}. " * 40)
    return TextDataModule(source=str(source), data_dir=str(tmp_path / "shards"), seq_len=64, batch_size=2,
                          val_fraction=0.2, test_fraction=0.2,
                          recall=RecallMix(kind="mqar", documents=documents, doc_chars=1500))


def test_mqar_documents_are_scored_on_their_queried_values_only(tmp_path):
    # Through the data module's shards and the training step's loss: in the training split the tokens of an MQAR
    # document that are scored are exactly its queried values, text is scored whole, and the loss is the mean
    # cross-entropy over exactly the scored targets.
    from litdata import StreamingDataset, TokensLoader

    from swax_lightning.data.loss_mask import CONTEXT_ONLY, inputs_and_targets
    from swax_lightning.kernels.ce.chunked import IGNORE_INDEX
    from swax_lightning.training.module import LanguageModule

    data = _mqar_data(tmp_path)
    data.prepare_data()
    stream = StreamingDataset(str(tmp_path / "shards/train"), item_loader=TokensLoader(block_size=65))
    blocks = torch.stack([torch.as_tensor(stream[i]) for i in range(len(stream))])
    raw = blocks.flatten().tolist()  # the split's token stream, as stored (one chunk: its blocks are contiguous)
    scored = [t < CONTEXT_ONLY for t in raw]
    text = bytes(t % CONTEXT_ONLY if t % CONTEXT_ONLY < 256 else 10 for t in raw).decode()
    for index in range(4):
        doc = training_document(index, data.recall)[0]
        start = text.find(doc[:200])
        if start < 0 or start + len(doc) > len(text):
            continue  # in the tail that the last whole block leaves out
        values = {line_start + offset for line_start, offsets in _queried_values(doc) for offset in offsets}
        assert [k for k in range(len(doc)) if scored[start + k]] == sorted(values), index
    plain = text.index("Plain document")
    assert all(scored[plain:plain + 100])
    module = LanguageModule(arch={"d_model": 32, "n_heads": 2, "mlstm_heads": 2, "n_layers": 2, "window": 8})
    module.configure_model()
    marked = (blocks >= CONTEXT_ONLY).any(1)
    batch = torch.cat([blocks[marked][:3], blocks[~marked][:3]])  # MQAR and text blocks
    inputs, targets = inputs_and_targets(batch)
    kept = targets != IGNORE_INDEX
    loss, n = module.loss(batch)
    reference = torch.nn.functional.cross_entropy(module.model(inputs)[kept], targets[kept])
    assert int(n) == int(kept.sum()) < kept.numel() and float(loss) == pytest.approx(float(reference), rel=1e-5)


def _queried_values(doc: str):
    """(offset of each line in doc, the offsets of its queried values within the line)."""
    start = 0
    for line in doc.split("\n")[:-1]:
        seen, offsets = set(), []
        for m in PAIR.finditer(line):
            if m.group(1) in seen:
                offsets.append(m.start(2))
            seen.add(m.group(1))
        yield start, offsets
        start += len(line) + 1


def test_a_batch_of_context_only_adds_nothing():
    from swax_lightning.data.loss_mask import CONTEXT_ONLY
    from swax_lightning.training.module import LanguageModule

    module = LanguageModule(arch={"d_model": 32, "n_heads": 2, "mlstm_heads": 2, "n_layers": 2, "window": 8})
    module.configure_model()
    loss, n = module.loss(torch.randint(0, 256, (2, 17)) + CONTEXT_ONLY)
    loss.backward()
    assert float(loss) == 0 and int(n) == 0
    assert all(p.grad is None or not p.grad.isnan().any() for p in module.parameters())


@pytest.mark.slow
def test_two_preparations_of_one_folder_take_turns(tmp_path):
    # A study's runs side by side prepare the same data_dir: the second waits for the first and reuses its shards
    # (without the lock both wrote a folder, the second replacing the first under any reader of it).
    import subprocess
    import sys

    _mqar_data(tmp_path)  # writes the source folder
    prepare = ("import os, sys; sys.path.insert(0, 'tests'); from pathlib import Path; "
               "from test_mqar import _mqar_data; "
               f"data = _mqar_data(Path({str(tmp_path)!r}), documents=2000); data.prepare_data(); "
               "print(os.stat(data.data_dir / 'meta.json').st_ino)")
    runs = [subprocess.Popen([sys.executable, "-c", prepare], cwd=Path(__file__).parents[1], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    written = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in written]
    inode = [out.splitlines()[-1] for out, _ in written]  # after the preparation's summary line, if it printed one
    assert inode[0] == inode[1]  # the same meta.json: one preparation wrote, the other reused it
    _mqar_data(tmp_path, documents=2000).setup("fit")  # complete, every checksum as recorded
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_the_training_loader_reads_marked_mqar_blocks_and_still_names_a_foreign_id(tmp_path):
    # A 2,000-step study arm stopped at its first MQAR batch: the loader's vocabulary check read the context-only
    # mark as a token id (1,073,741,946 against 257).
    from swax_lightning.core.errors import InputError
    from swax_lightning.data.datamodule import within_vocabulary
    from swax_lightning.data.loss_mask import CONTEXT_ONLY

    data = _mqar_data(tmp_path)
    data.prepare_data()
    data.setup("fit")
    batches = list(data.train_dataloader())
    assert any(bool((batch >= CONTEXT_ONLY).any()) for batch in batches)  # marked blocks went through
    foreign = batches[0].clone()
    foreign[0, 0] = 257
    with pytest.raises(InputError, match="holds token id 257, outside the tokenizer's 257 ids"):
        within_vocabulary(foreign, 257, tmp_path / "shards/train")


@pytest.mark.parametrize("fresh_chars", [64, 0])
def test_the_training_stream_holds_recall_beyond_the_window_and_no_stale_pair_within_it(tmp_path, fresh_chars):
    # Through the prepared shards of the study's mix (what training reads, documents shuffled among source text that
    # has camelCase names, copy episodes among the MQAR ones): with fresh_chars = the long window (64), every query's
    # nearest earlier pair with its key is its own stated pair, no pair with its key and another value lies within
    # 64 tokens, and a share of the queries reach beyond 64. With fresh_chars 0 (episodes drawn freely, as before)
    # stale pairs are there: the check can fail.
    from litdata import StreamingDataset, TokensLoader

    from swax_lightning.data.datamodule import TextDataModule
    from swax_lightning.data.loss_mask import CONTEXT_ONLY

    source = tmp_path / "text"
    source.mkdir()
    for i in range(30):
        (source / f"code{i}.py").write_text(f"def getAttr{i}(self):\n    return self.isA and self.hasB\n" * 20)
    study = yaml.safe_load((ROOT / "configs/study/_base.yaml").read_text())["data"]["recall"]  # the study's mix
    data = TextDataModule(source=str(source), data_dir=str(tmp_path / "shards"), seq_len=64, batch_size=2,
                          val_fraction=0.1, test_fraction=0.1,
                          recall=RecallMix(**study | {"documents": 12, "doc_chars": 3000, "fresh_chars": fresh_chars,
                                                       "short_gap_documents": 2}))
    data.prepare_data()
    stream = StreamingDataset(str(tmp_path / "shards/train"), item_loader=TokensLoader(block_size=65))
    raw = torch.cat([torch.as_tensor(stream[i]) for i in range(len(stream))]).tolist()
    text = "".join(chr(t % CONTEXT_ONLY) if t % CONTEXT_ONLY < 256 else "\n" for t in raw)
    queries = [p for p in range(1, len(raw))  # a scored value after a context-only key (not a copied character)
               if raw[p] < CONTEXT_ONLY <= raw[p - 1] and text[p].isupper() and text[p - 1].islower()]
    stale, reaches = 0, []
    for p in queries:
        key, value = text[p - 1], text[p]
        pairs = [j for j in range(p - 2, -1, -1) if text[j] == key and text[j + 1].isupper()]
        reaches.append(p - (pairs[0] + 1))
        stale += any(text[j + 1] != value for j in pairs if p - j <= 64)
        if fresh_chars:
            assert text[pairs[0] + 1] == value, p  # the nearest pair with this key is the one asked for
    assert len(queries) > 500
    if fresh_chars:
        assert stale == 0
        assert sum(r > 64 for r in reaches) / len(reaches) > 0.3  # recall beyond the long window
    else:
        assert stale / len(queries) > 0.03  # 6% here (max_gap 160); 31% at the old study's max_gap 16
