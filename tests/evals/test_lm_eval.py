"""lm-evaluation-harness: `lm_eval --model swax` from the harness's own command line on a local task; the adapter
in-process on local, offline task files; metrics keyed by filter; log-likelihoods against the model computed
directly, batched equal to one at a time, the harness's edge cases; stop strings that end generation early;
do_sample and temperature honoured."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swax_lightning.data.tokenizer import ByteTokenizer
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel

pytest.importorskip("lm_eval")
from swax_lightning.evals import reports  # noqa: E402
from swax_lightning.evals.lm_eval_adapter import SwaxLM, metric_cell, run_lm_eval  # noqa: E402

TOK = ByteTokenizer()
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
TWO_FILTERS_TASK = """task: swax_tiny_filters
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "{{{{text}}}}"
doc_to_target: "{{{{text}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
metric_list:
  - metric: exact_match
filter_list:
  - name: raw
    filter:
      - function: take_first
  - name: first_word
    filter:
      - function: regex
        regex_pattern: "(\\\\w+)"
      - function: take_first
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


def tiny_model() -> SWAXModel:
    torch.manual_seed(0)
    return SWAXModel(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8)).eval()


def write_tasks(folder: Path) -> Path:
    tasks = folder / "tasks"
    tasks.mkdir()
    rows = {"mc": [{"question": f"{i} plus one is", "choices": [f" {i + 1}", f" {i + 2}"], "label": 0}
                   for i in range(4)],
            "code": [{"text": "Write add(a, b).", "tests": "assert add(1, 2) == 3"}] * 2,
            "filters": [{"text": "hello world"}] * 2,
            "ppl": [{"text": "The grass is green. The sky is blue."}] * 2}
    for name, data in rows.items():
        (folder / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in data))
    for name, template in (("mc", MC_TASK), ("code", GEN_TASK), ("filters", TWO_FILTERS_TASK), ("ppl", PPL_TASK)):
        (tasks / f"{name}.yaml").write_text(template.format(data=folder / f"{name}.jsonl"))
    (tasks / "utils.py").write_text("from swax_lightning.evals.code_exec import pass_at_1  # noqa: F401\n")
    return tasks


CLEAN = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.slow
def test_lm_eval_command_line_runs_the_swax_model_from_any_folder(tmp_path):
    """The console scripts as a user types them, from a temporary folder, in an environment holding nothing but PATH,
    HF_HOME and the offline switches (no PYTHONPATH): `swax choice-tasks` writes the generated multiple-choice tasks
    and `lm_eval --model swax --model_args ckpt_path=...` runs them and local tasks (setup.sh's start-up file
    registers the name; without it the harness answers that no model of that name exists)."""
    from swax_lightning.training.module import LanguageModule

    module = LanguageModule(arch=ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8))
    module.configure_model()
    ckpt = tmp_path / "tiny.ckpt"
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict(),
                "datamodule_hyper_parameters": {"tokenizer": "byte"}}, ckpt)
    tasks = write_tasks(tmp_path)
    env = {**CLEAN, "HF_HOME": str(tmp_path / "hf")}
    written = subprocess.run(["swax", "choice-tasks", str(tasks / "choice"), "--items", "3"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert written.returncode == 0 and "lm_eval --model swax" in written.stdout, written.stderr[-3000:]
    out = subprocess.run(["lm_eval", "--model", "swax", "--model_args", f"ckpt_path={ckpt},chunk_len=16",
                          "--tasks", "swax_tiny_mc,swax_tiny_filters,choice_capitals", "--include_path", str(tasks),
                          "--batch_size", "2", "--output_path", str(tmp_path / "out")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    assert 0.0 <= results["swax_tiny_mc"]["acc,none"] <= 1.0 and 0.0 <= results["choice_capitals"]["acc,none"] <= 1.0
    assert {"exact_match,raw", "exact_match,first_word"} <= set(results["swax_tiny_filters"])


@pytest.mark.slow
def test_lm_evals_own_hf_model_scores_an_export_as_the_swax_model_does(tmp_path):
    """An exported checkpoint through lm-eval's stock `hf` model (transformers + accelerate, the `hf` group) gives the
    log-likelihoods, hence the accuracies, of `--model swax` on the checkpoint itself."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="the `hf` group: bash setup.sh hf")
    from swax_lightning.commands.export import export
    from swax_lightning.training.module import LanguageModule

    module = LanguageModule(arch=ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8))
    module.configure_model()
    ckpt = tmp_path / "tiny.ckpt"
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict(),
                "datamodule_hyper_parameters": {"tokenizer": "byte"}}, ckpt)
    folder = export(ckpt, tmp_path / "hf-export")
    tasks = write_tasks(tmp_path)
    env = {**CLEAN, "HF_HOME": str(tmp_path / "hf")}
    scores = {}
    for model, args in (("swax", f"ckpt_path={ckpt}"), ("hf", f"pretrained={folder},trust_remote_code=True")):
        out = subprocess.run(["lm_eval", "--model", model, "--model_args", args, "--tasks", "swax_tiny_mc",
                              "--include_path", str(tasks), "--output_path", str(tmp_path / model), "--device", "cpu"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        results = json.loads(next((tmp_path / model).rglob("results_*.json")).read_text())["results"]
        scores[model] = {k: v for k, v in results["swax_tiny_mc"].items() if k.startswith("acc")}
    assert scores["hf"] == scores["swax"] and "acc,none" in scores["hf"]


def test_lm_eval_in_process(tmp_path, monkeypatch):
    """What `main.py test` runs: generation scored by the contained executor, rolling log-likelihood."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing can come from the hub
    tasks = write_tasks(tmp_path)
    model = tiny_model()
    results = run_lm_eval(model, TOK, ["swax_tiny_code", "swax_tiny_ppl"], str(tasks))
    # a random model writes no working add(): 0 of 2, with the Wilson interval of 0/2 rather than a bare 0
    assert results["swax_tiny_code"]["pass_at_1,none"] == {"value": 0.0, "n": 2, "ci95": [0.0, 0.6576],
                                                           "interval": "wilson"}
    assert results["swax_tiny_ppl"]["bits_per_byte,none"]["value"] > 0
    assert results["swax_tiny_ppl"]["bits_per_byte,none"]["n"] == 2
    reports.write_reports({"settings": {}, "lm_eval": results, "samples": []}, tmp_path / "eval")
    table = (tmp_path / "eval/results.md").read_text()
    assert "| swax_tiny_code | pass_at_1,none | 0.0000 | [0.0000, 0.6576] (wilson) | 2 |" in table
    assert reports.flat_metrics({"lm_eval": results})["eval/lm_eval/swax_tiny_code/pass_at_1/none"] == 0.0


def test_a_share_of_0_1_scores_gets_a_wilson_interval_and_others_the_harness_stderr():
    assert metric_cell(0.75, [1, 1, 1.0, 0], 0.25) == {"value": 0.75, "n": 4, "ci95": [0.3006, 0.9544],
                                                         "interval": "wilson"}
    normal = metric_cell(2.0, [(1.0, 2.0)] * 4, 0.5)  # a corpus-level metric: its per-document values are pairs
    assert normal["ci95"] == pytest.approx([2.0 - 1.96 * 0.5, 2.0 + 1.96 * 0.5], abs=1e-3) and normal["n"] == 4
    assert metric_cell(0.4, [0.2, 0.6], "N/A")["ci95"] is None


@pytest.mark.slow
def test_an_unknown_task_is_named(tmp_path):  # slow: it indexes the harness's 14,000 task files
    with pytest.raises(ValueError, match="no_such_task"):
        run_lm_eval(tiny_model(), TOK, ["no_such_task"], str(write_tasks(tmp_path)))


def request(*args):
    return SimpleNamespace(args=args)


def test_loglikelihood_matches_the_model_and_the_harness_edge_cases():
    model = tiny_model()
    lm = SwaxLM(model, TOK, chunk_len=2)  # the 3 input tokens in 2 chunks, the state carried between them
    (total, greedy), = lm.loglikelihood([request("ab", "cd")], disable_tqdm=True)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([TOK.encode("abcd")]))[0, :-1].float(), -1)
    assert total == pytest.approx(float(logprobs[1, ord("c")] + logprobs[2, ord("d")]), abs=1e-4)
    assert greedy == bool(logprobs[1].argmax() == ord("c") and logprobs[2].argmax() == ord("d"))
    # the harness's rules: an empty continuation scores (0, True); trailing spaces move to the continuation
    assert lm.loglikelihood([request("abc", "")], disable_tqdm=True) == [(0.0, True)]
    spaced, moved = lm.loglikelihood([request("ab ", "cd"), request("ab", " cd")], disable_tqdm=True)
    assert spaced == pytest.approx(moved)
    # an empty document has log-likelihood 0; a document scores as the tokens after end-of-text
    empty, doc = lm.loglikelihood_rolling([request(""), request("xy")], disable_tqdm=True)
    assert empty == 0.0 and doc == pytest.approx(lm.loglikelihood([request("", "xy")], disable_tqdm=True)[0][0])


def test_batched_equals_one_at_a_time():
    model = tiny_model()
    requests = [request("The grass is green", " and the sky"), request("a", "b"), request("Here we go", " again."),
                request("x" * 40, "yz"), request("", "start")]
    one = SwaxLM(model, TOK, chunk_len=8, batch_size=1).loglikelihood(requests, disable_tqdm=True)
    many = SwaxLM(model, TOK, chunk_len=8, batch_size="3").loglikelihood(requests, disable_tqdm=True)
    for (a, ga), (b, gb) in zip(one, many):
        assert a == pytest.approx(b, abs=1e-4) and ga == gb
    gen = [request(c, {"until": ["\n"], "max_gen_toks": 6}) for c in ("ab", "The grass", "xyz" * 5)]
    assert SwaxLM(model, TOK, batch_size=1).generate_until(gen, disable_tqdm=True) == \
        SwaxLM(model, TOK, batch_size=3).generate_until(gen, disable_tqdm=True)


def test_stop_strings_end_generation_early(monkeypatch):
    model = tiny_model()
    lm = SwaxLM(model, TOK, chunk_len=64)
    context = "Once upon a time"
    full, = lm.generate_until([request(context, {"until": [], "max_gen_toks": 40})], disable_tqdm=True)
    assert len(full) >= 10, full
    stop = full[4:6]
    steps = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: steps.append(1) or forward(*a, **k))
    cut, = lm.generate_until([request(context, {"until": [stop], "max_gen_toks": 40})], disable_tqdm=True)
    assert cut == full[:full.index(stop)]
    assert len(steps) <= 1 + 8  # one prefill chunk, then a few steps past the stop: not the 40 tokens of budget


def test_every_alias_of_the_token_budget_is_honoured():
    """The harness's aliases of max_gen_toks, in its order of precedence (max_new_tokens was ignored: 5 asked, 256
    generated)."""
    lm = SwaxLM(tiny_model(), TOK, chunk_len=64)
    five, default = lm.generate_until([request("ab", {"until": [], "max_gen_toks": 5}), request("ab", {"until": []})],
                                      disable_tqdm=True)
    assert len(five) <= 5 < len(default)  # one byte token is at most one character
    for alias in ("max_new_tokens", "max_tokens", "max_completion_tokens"):
        assert lm.generate_until([request("ab", {"until": [], alias: 5})], disable_tqdm=True) == [five], alias
    both = {"until": [], "max_gen_toks": 5, "max_new_tokens": 9}  # max_gen_toks first, as in the harness
    assert lm.generate_until([request("ab", both)], disable_tqdm=True) == [five]


def test_do_sample_and_temperature_are_honoured():
    model = tiny_model()
    greedy = {"until": [], "max_gen_toks": 12}
    base, = SwaxLM(model, TOK).generate_until([request("ab", greedy)], disable_tqdm=True)
    # as in the harness's HF model (its normalize_gen_kwargs): do_sample false stays greedy whatever the temperature,
    # and a temperature above 0 without do_sample samples
    assert SwaxLM(model, TOK).generate_until([request("ab", {**greedy, "do_sample": False, "temperature": 2.0})],
                                             disable_tqdm=True) == [base]
    hot = SwaxLM(model, TOK).generate_until([request("ab", {**greedy, "temperature": 2.0})] * 4, disable_tqdm=True)
    assert hot != [base] * 4 and len(set(hot)) > 1
    sampled = [request("ab", {**greedy, "do_sample": True, "temperature": 2.0})] * 4
    outputs = SwaxLM(model, TOK).generate_until(sampled, disable_tqdm=True)
    assert outputs != [base] * 4 and len(set(outputs)) > 1  # sampled, and each request its own draw
    assert SwaxLM(model, TOK).generate_until(sampled, disable_tqdm=True) == outputs  # reproducible


def test_model_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="ckpt_path"):
        SwaxLM()
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        SwaxLM(ckpt_path=str(tmp_path / "missing.ckpt"))
    with pytest.raises(ValueError, match="batch_size"):
        SwaxLM(tiny_model(), TOK, batch_size=0)
    assert SwaxLM(tiny_model(), TOK, batch_size="auto").batch == 8
