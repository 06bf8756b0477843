"""Tokenizers: bytes by default (no file, no download), or any HF `tokenizers` tokenizer.json for real corpora.

Decisions:
- The byte tokenizer maps UTF-8 bytes to ids 0..255 and adds one end-of-text id (256) that separates documents, so
  its vocabulary is 257 and bits per byte is simply the loss in bits per token.
- Both expose the same small interface: encode, decode, vocab_size, eos_id, eos_token, name, fingerprint. Bits
  per byte is computed by the data module from the bytes and tokens it wrote, whatever the tokenizer.
- `fingerprint` identifies the vocabulary itself, not the path it was read from ("byte", or the sha256 of the
  tokenizer.json): shards record it, so a different tokenizer than the shards were made with is refused even when
  the file was moved or replaced in place.
"""
from __future__ import annotations

import hashlib
from pathlib import Path


class ByteTokenizer:
    vocab_size = 257
    eos_id = 256
    eos_token = "<|endoftext|>"
    name = "byte"
    fingerprint = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer.json from HF `tokenizers` (e.g. a byte-level BPE trained offline in seconds)."""

    def __init__(self, path: str | Path, eos_token: str | None = None):
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        self.name = str(path)
        self.fingerprint = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        candidates = [eos_token] if eos_token else ["<|endoftext|>", "</s>", "<eos>", "[SEP]"]
        ids = [self._tok.token_to_id(t) for t in candidates if t and self._tok.token_to_id(t) is not None]
        if not ids:
            raise ValueError(f"{path}: no end-of-text token among {candidates}; add one or name it")
        self.eos_id = ids[0]
        self.eos_token = self._tok.id_to_token(self.eos_id)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids))


def load_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    """'byte' or a path to a tokenizer.json."""
    return ByteTokenizer() if spec == "byte" else HFTokenizer(spec)
