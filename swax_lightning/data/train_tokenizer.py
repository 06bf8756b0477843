"""Train a byte-level BPE tokenizer.json offline, from the training split of a text source (the embedded corpus by
default), in seconds; the GPU window study's subword tokenizer (configs/study_gpu/).

    python -m swax_lightning tokenizer --vocab_size 8192 --out data/tokenizers/embedded-8192.json

Decisions:
- Byte-level, with GPT-2's pre-tokenizer pattern: every string encodes; letters never merge with the punctuation or
  spaces around them, so an MQAR value (a capital after "=", mqar_episodes.py) is a token of its own and an
  episode tokenizes the same whole or in pieces.
- Digits are split one by one: a 7-digit needle value is 7 tokens whatever its digits, so recalling it means copying
  digits, never looking up a number memorised as one token.
- Trained on the training split's documents only (corpus.split_of with the data module's default fractions), so the
  held-out text stays unseen; the end-of-text token is `<|endoftext|>`, which HFTokenizer finds.
- The same source, fractions and vocab_size give the same file; it is written to a temporary name and renamed, and
  an existing file is kept (delete it to train again).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from swax_lightning.core import atomic
from swax_lightning.data.corpus import EMBEDDED, document_refs, read_documents, split_of

EOS = "<|endoftext|>"


def training_texts(source: str, val_fraction: float, test_fraction: float):
    for ref in document_refs(source):
        for name, text in read_documents(ref, source):
            if split_of(name, val_fraction, test_fraction) == "train":
                yield text


def train(source: str, vocab_size: int, out: Path, val_fraction: float = 0.02, test_fraction: float = 0.02) -> Path:
    """Trains the tokenizer and writes it to `out` (kept if already there); returns `out`."""
    if vocab_size < 512:
        raise ValueError(f"--vocab_size must be >= 512 (256 byte symbols, the end-of-text token, merges; got "
                         f"{vocab_size})")
    if out.exists():
        return out
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_texts(source, val_fraction, test_fraction), trainer)
    with atomic.written_atomically(out) as tmp:
        tok.save(str(tmp))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=EMBEDDED, help="'embedded' or a folder/file of text (as data.source)")
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    print(train(args.source, args.vocab_size, args.out))


if __name__ == "__main__":
    main()
