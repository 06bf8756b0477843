"""Tokenizers: bytes by default (no file, no download), or any HF `tokenizers` tokenizer.json for real corpora.

Decisions:
- The byte tokenizer maps UTF-8 bytes to ids 0..255 and adds one end-of-text id (256) that separates documents, so
  its vocabulary is 257 and bits per byte is simply the loss in bits per token.
- Both expose the same small interface: encode, encode_prompt, decode, vocab_size, eos_id, eos_token, bos_ids,
  stop_ids, name, fingerprint. Bits per byte is computed by the data module from the bytes and tokens it wrote,
  whatever the tokenizer.
- `encode` gives the text's own tokens, no special token (shards, token counts); `encode_prompt` is a model input
  that starts a sequence: the start-of-sequence ids the tokenizer.json's own template puts before a text (bos_ids:
  a Llama-family tokenizer's BOS; none for SmolLM2's, Qwen's or the byte tokenizer), then the text's tokens. So a
  prompt reaches a pretrained model as it was trained, with no BOS setting to keep beside the file.
- `eos_id` is the end-of-text id that separates documents in shards: the first of END_OF_TEXT the vocabulary has.
  `stop_ids` is every id generation stops at: those of END_OF_TEXT and END_OF_TURN the vocabulary has (an instruct
  model ends its answer with <|im_end|> or <|eot_id|>, a base model with end-of-text). Both count only the tokens
  the vocabulary marks special when it marks any of them (a Gemma vocabulary has "</s>" as plain text).
- `fingerprint` identifies the vocabulary itself, not the path it was read from ("byte", or the sha256 of the
  tokenizer.json): shards record it, so a different tokenizer than the shards were made with is refused even when
  the file was moved or replaced in place.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

# Document separators, in order of preference, then the end-of-turn tokens of chat models (stops only).
END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>", "[SEP]", "<|end_of_text|>")
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


class ByteTokenizer:
    vocab_size = 257
    eos_id = 256
    eos_token = "<|endoftext|>"
    bos_ids: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] = (256,)
    name = "byte"
    fingerprint = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

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
        candidates = [eos_token] if eos_token else list(END_OF_TEXT)
        ids = self._ids_of(candidates)
        if not ids:
            raise ValueError(f"{path}: no end-of-text token among {candidates}; add one or name it")
        self.eos_id = ids[0]
        self.eos_token = self._tok.id_to_token(self.eos_id)
        self.stop_ids = tuple(dict.fromkeys([self.eos_id, *self._ids_of(END_OF_TEXT + END_OF_TURN)]))
        self.bos_ids = self._template_prefix()

    def _ids_of(self, tokens) -> list[int]:
        """The ids of `tokens` that the vocabulary marks special; if it marks none of them, those it has at all. A
        big vocabulary may hold another model's marker as plain text (Gemma 3's has "</s>" beside its
        special <eos>), which must not end a document or a generation."""
        found = [self._tok.token_to_id(t) for t in tokens if t and self._tok.token_to_id(t) is not None]
        special = {i for i, added in self._tok.get_added_tokens_decoder().items() if added.special}
        return [i for i in found if i in special] or found

    def _template_prefix(self) -> tuple[int, ...]:
        """The ids the tokenizer's template (its post-processor) puts before a single text: its BOS, if any."""
        text = "a"
        plain = self._tok.encode(text, add_special_tokens=False).ids
        full = self._tok.encode(text, add_special_tokens=True).ids
        start = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
        return tuple(full[:start])

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        return [*self.bos_ids, *self.encode(text)]

    def token(self, token_id: int) -> str:
        """The vocabulary entry of an id (special tokens included, which decode leaves out)."""
        return self._tok.id_to_token(token_id)

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids))


def load_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    """'byte' or a path to a tokenizer.json."""
    return ByteTokenizer() if spec == "byte" else HFTokenizer(spec)
