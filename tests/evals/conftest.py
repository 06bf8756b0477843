"""Shared by the evaluation tests: a small byte-level BPE tokenizer, trained offline on the generated essay, for the
checks that must hold beyond the byte tokenizer."""
import pytest

from swax_lightning.evals import essay


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from swax_lightning.data.tokenizer import HFTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator([essay.generated_essay(3000)], trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("bpe") / "t.json"
    tok.save(str(path))
    return HFTokenizer(path)
