"""lm-evaluation-harness: the adapter on local, offline task files (multiple choice, generation, rolling
log-likelihood), and its log-likelihood against the model computed directly."""
import json

import pytest
import torch

from swax_lightning.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


# ---- lm-evaluation-harness through the adapter, offline, on local task files ----------------------------------------
MC_TASK = """task: swax_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GEN_TASK = """task: swax_tiny_code
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "{{{{text}}}}\\n[BEGIN]\\n"
doc_to_target: "{{{{tests}}}}"
target_delimiter: ""
metric_list:
  - metric: !function utils.pass_at_1
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["[DONE]"]
  max_gen_toks: 8
"""
PPL_TASK = """task: swax_tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""


def test_lm_eval_through_the_adapter_offline(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from swax_lightning.config import ModelConfig
    from swax_lightning.evals.lm_eval_adapter import run_lm_eval
    from swax_lightning.model import SWAXModel

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing can come from the hub
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    rows = {"mc": [{"question": f"{i} plus one is", "choices": [f" {i + 1}", f" {i + 2}"], "label": 0}
                   for i in range(4)],
            "code": [{"text": "Write add(a, b).", "tests": "assert add(1, 2) == 3"}] * 2,
            "ppl": [{"text": "The grass is green. The sky is blue."}] * 2}
    for name, data in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in data))
    (tasks / "mc.yaml").write_text(MC_TASK.format(data=tmp_path / "mc.jsonl"))
    (tasks / "code.yaml").write_text(GEN_TASK.format(data=tmp_path / "code.jsonl"))
    (tasks / "ppl.yaml").write_text(PPL_TASK.format(data=tmp_path / "ppl.jsonl"))
    (tasks / "utils.py").write_text("from swax_lightning.evals.code_exec import pass_at_1  # noqa: F401\n")
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8)).eval()
    results = run_lm_eval(model, TOK, ["swax_tiny_mc", "swax_tiny_code", "swax_tiny_ppl"], str(tasks))
    assert 0.0 <= results["swax_tiny_mc"]["acc"] <= 1.0 and "acc_norm" in results["swax_tiny_mc"]
    assert results["swax_tiny_code"]["pass_at_1"] == 0.0  # a random model writes no working add()
    assert results["swax_tiny_ppl"]["bits_per_byte"] > 0
    with pytest.raises(ValueError, match="unknown lm-eval task"):
        run_lm_eval(model, TOK, ["no_such_task"], str(tasks))


def test_adapter_loglikelihood_matches_the_model():
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from swax_lightning.config import ModelConfig
    from swax_lightning.evals.lm_eval_adapter import SwaxLM
    from swax_lightning.model import SWAXModel

    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8)).eval()
    lm = SwaxLM(model, TOK, chunk_len=4)
    (total, greedy), = lm.loglikelihood([SimpleNamespace(args=("ab", "cd"))], disable_tqdm=True)
    ids = torch.tensor([TOK.encode("abcd")])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids)[0, :-1].float(), -1)
    expected = logprobs[1, ord("c")] + logprobs[2, ord("d")]
    assert total == pytest.approx(float(expected), abs=1e-4)
    assert greedy == bool(logprobs[1].argmax() == ord("c") and logprobs[2].argmax() == ord("d"))
    out = lm.generate_until([SimpleNamespace(args=("ab", {"until": ["zz"], "max_gen_toks": 5}))], disable_tqdm=True)
    assert len(out[0]) <= 5 and "zz" not in out[0]
