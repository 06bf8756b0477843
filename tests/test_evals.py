"""Evaluations: scoring rules on hand-made cases, the generators (determinism, depth, length, recoverable answers),
the MBPP executor, lm-eval through the adapter on local task files, reports and the comparison command."""
import json
import re

import pytest
import torch

from swax_lightning.evals import babilong
from swax_lightning.evals.code_exec import pass_at_1, passes
from swax_lightning.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


# ---- scoring -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("output,target,question,task,correct", [
    ("kitchen", "kitchen", "Where is Mary?", "qa1", 1.0),
    ("The kitchen. Then the garden.", "kitchen", "Where is Mary?", "qa1", 1.0),    # only the first sentence counts
    ("kitchen or garden", "kitchen", "Where is Mary?", "qa1", 0.0),                 # another label: wrong
    ("Garden.", "kitchen", "Where is Mary?", "qa1", 0.0),
    ("the hallway, not the office", "hallway", "What is north of the office?", "qa4", 1.0),  # label in the question
    ("Mary", "mary", "Who gave the milk to Fred?", "qa5", 1.0),
    ("Mary gave it to Fred", "mary", "Who gave the milk to Fred?", "qa5", 1.0),       # fred is in the question
    ("Mary and Bill", "mary", "Who gave the milk to Fred?", "qa5", 0.0),
    ("", "kitchen", "Where is Mary?", "qa1", 0.0),
])
def test_babilong_official_rule(output, target, question, task, correct):
    assert babilong.babilong_score(output, target, question, task) == correct


# ---- generators --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", babilong.TASKS)
@pytest.mark.parametrize("length", [0, 2048])
def test_babilong_samples(task, length):
    gen = babilong.BabiLongGenerator(TOK, seed=1)
    a = gen.sample(task, length, index=4)
    assert a == gen.sample(task, length, index=4)
    if length:
        assert length - gen.max_new_tokens - 200 <= a.n_tokens <= length - gen.max_new_tokens
    facts = [a.input_text[p:].split(".")[0] for p in a.fact_positions]
    assert facts and all(len(f.split()) >= 3 for f in facts)  # the recorded positions hold the facts
    assert any(a.target.lower() in f.lower() for f in facts)   # the answer is stated by a fact
    assert a.input_text.endswith(f"Question: {a.question}\nAnswer:")


def test_babilong_answers_follow_from_the_facts():
    """qa1 by replaying the moves: the answer is the person's last location."""
    gen = babilong.BabiLongGenerator(TOK)
    for i in range(20):
        sample = gen.sample("qa1", 0, index=i)
        person = re.match(r"Where is (\w+)\?", sample.question).group(1)
        moves = re.findall(rf"{person} (?:moved|went|journeyed|travelled|went back) to the (\w+)\.", sample.input_text)
        assert moves[-1] == sample.target


def test_official_babilong_files(tmp_path):
    (tmp_path / "4k").mkdir()
    rows = [{"input": "Mary went to the office.", "question": "Where is Mary?", "target": "office"}]
    (tmp_path / "4k" / "qa1.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    samples = babilong.load_official(tmp_path, "qa1", "4k")
    assert samples[0].target == "office" and "Mary went to the office." in samples[0].input_text
    with pytest.raises(FileNotFoundError, match="qa2"):
        babilong.load_official(tmp_path, "qa2", "4k")


@pytest.mark.parametrize("make,match", [
    (lambda: babilong.BabiLongGenerator(TOK).sample("qa9", 0), "unknown BABILong task"),
    (lambda: babilong.BabiLongGenerator(TOK).sample("qa2", 200), "too short"),
])
def test_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_suite_rejects_bad_settings(tmp_path):
    from swax_lightning.evals.suite import EvalSuite

    with pytest.raises(ValueError, match="niah_tasks"):
        EvalSuite(niah_tasks=["niah_single_7"])
    with pytest.raises(ValueError, match="babilong_tasks"):
        EvalSuite(babilong_tasks=["qa6"])
    with pytest.raises(FileNotFoundError, match="essay.txt"):
        EvalSuite(niah_tasks=["niah_single_2"], essay_file=str(tmp_path / "essay.txt"))
    with pytest.raises(FileNotFoundError, match="babi"):
        EvalSuite(babilong_tasks=["qa1"], babilong_data_dir=str(tmp_path / "babi"))


# ---- MBPP executor -----------------------------------------------------------------------------------------------
def test_code_executor():
    tests = "assert add(2, 3) == 5\nassert add(0, 0) == 0"
    assert passes("def add(a, b):\n    return a + b", tests)
    assert not passes("def add(a, b):\n    return a * b", tests)
    assert not passes("def add(a, b) return", tests)                        # syntax error
    assert not passes("while True:\n    pass", tests, timeout=2)             # killed at the timeout
    assert not passes("x = bytearray(4 << 30)", "", timeout=5)               # over the memory limit
    assert not passes("import os\nassert 'HOME' in os.environ", "")          # stripped environment
    assert pass_at_1([tests, tests], [["def add(a, b):\n    return a + b"], ["def add(a, b): return 0"]]) == 0.5


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


# ---- reports and the comparison command ---------------------------------------------------------------------------
def test_reports_and_comparison(tmp_path):
    from swax_lightning.evals.compare import main as compare_main
    from swax_lightning.evals.suite import summarize, write_reports

    for arm, score in (("w16", 100.0), ("w64", 50.0)):
        niah = summarize({("niah_single_1", 4096, 0.0): [score], ("niah_single_1", 8192, 0.5): [score / 2],
                          ("niah_multikey_1", 4096, 0.5): [0.0]})
        write_reports({"settings": {}, "niah": niah, "samples": []}, tmp_path / arm / "eval")
    report = json.loads((tmp_path / "w16/eval/results.json").read_text())
    assert report["niah"]["scores"]["average"] == {"4096": 50.0, "8192": 50.0}
    assert report["niah"]["depth_x_length"]["0.5"] == {"8192": 50.0, "4096": 0.0}
    assert (tmp_path / "w16/eval/niah_heatmap.png").stat().st_size > 1000
    assert "| niah_single_1 | 100.0 | 50.0 |" in (tmp_path / "w16/eval/results.md").read_text()
    compare_main([str(tmp_path / "w16/eval/results.json"), str(tmp_path / "w64/eval/results.json"), "--out",
                  str(tmp_path / "cmp")])
    table = (tmp_path / "cmp/comparison.md").read_text()
    assert "| w16 | 50.0 | 50.0 |" in table and "| w64 | 25.0 | 25.0 |" in table
    assert (tmp_path / "cmp/niah_vs_length.png").stat().st_size > 1000
    with pytest.raises(FileNotFoundError, match="missing.json"):
        compare_main([str(tmp_path / "missing.json")])
