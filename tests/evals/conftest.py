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


@pytest.fixture
def answering(monkeypatch):
    """answering(answer): the suite's generations become those of a model that writes answer(prompt), token by token
    as inference.generate does: at most max_new_tokens tokens of the tokenizer, asking should_stop after each."""
    from swax_lightning.evals import suite as suite_module

    def install(answer):
        def continue_texts(model, tokenizer, texts, max_new_tokens, should_stop=None, **decoding):
            outputs = []
            for b, text in enumerate(texts):
                out = []
                for token in tokenizer.encode(answer(text))[:max_new_tokens]:
                    out.append(token)
                    if should_stop is not None and should_stop(b, out):
                        break
                outputs.append(tokenizer.decode(out))
            return outputs

        monkeypatch.setattr(suite_module, "continue_texts", continue_texts)

    return install
