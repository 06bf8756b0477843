"""Evaluation reports and the suite's settings: cells with counts and 95% intervals, deterministic results.json,
the heatmap (title, token and depth axes, blank empty cells), the comparison command with intervals, the NIAH
depth deal (every (length, depth) cell the same count), regenerating a sample's prompt from its recorded arguments."""
import json
from types import SimpleNamespace

import pytest

from swax_lightning.data.tokenizer import ByteTokenizer
from swax_lightning.evals import babilong, reports, ruler
from swax_lightning.evals.suite import EvalSuite


@pytest.mark.parametrize("mean,n,interval", [
    (0.0, 1, [0.0, 79.35]), (100.0, 1, [20.65, 100.0]), (50.0, 40, [35.20, 64.80]), (0.0, 0, [0.0, 100.0])])
def test_wilson_interval(mean, n, interval):
    assert reports.wilson_interval(mean, n) == pytest.approx(interval, abs=0.01)


def make_results():
    niah = reports.summarize({("niah_single_1", 4096, 0.0): [100.0, 100.0], ("niah_single_1", 8192, 0.5): [50.0],
                              ("niah_multikey_1", 4096, 0.5): [0.0, 0.0]})
    return {"settings": {}, "niah": niah, "samples": []}


def test_cells_carry_count_and_interval(tmp_path):
    reports.write_reports(make_results(), tmp_path)
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["niah"]["scores"]["average"]["4096"] == {"mean": 50.0, "n": 4, "ci95": [15.0, 85.0]}
    assert report["niah"]["depth_x_length"]["0.5"]["4096"]["n"] == 2
    assert "8192" not in report["niah"]["depth_x_length"]["0"]  # an empty cell is absent, not a number
    table = (tmp_path / "results.md").read_text()
    assert "| niah_single_1 | 100.0 [34, 100] n=2 | 50.0 [" in table
    assert "| niah_multikey_1 | 0.0 [0, 66] n=2 |  |" in table  # no sample at 8192: blank
    reports.write_reports(make_results(), tmp_path / "again")
    assert (tmp_path / "again/results.json").read_bytes() == (tmp_path / "results.json").read_bytes()
    assert not list(tmp_path.glob(".*tmp*"))  # temporary files renamed away


def test_heatmap_is_titled_and_leaves_empty_cells_blank():
    fig = ruler.heatmap_figure(make_results()["niah"])
    ax = fig.axes[0]
    assert "RULER NIAH" in ax.get_title() and "mean over 2 tasks, n = 1/2" in ax.get_title()
    assert ax.get_xlabel() == "context length (tokens)" and "depth" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4k", "8k"]
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["0", "100", "50"] and "nan" not in texts  # 3 cells with samples, 1 blank


def test_each_task_has_its_own_heatmap(tmp_path):
    results = make_results()
    ax = ruler.heatmap_figure(results["niah"], "niah_multikey_1").axes[0]
    assert "(niah_multikey_1, n = 2 samples per cell)" in ax.get_title()
    assert sorted(t.get_text() for t in ax.texts) == ["0"]  # its one cell: depth 0.5 at 4k
    reports.write_reports(results, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("niah_heatmap*.png")) == [
        "niah_heatmap.png", "niah_heatmap_niah_multikey_1.png", "niah_heatmap_niah_single_1.png"]


def test_comparison_shows_intervals(tmp_path, capsys):
    from swax_lightning.evals.compare import main as compare_main

    for arm in ("w16", "w64"):
        reports.write_reports(make_results(), tmp_path / arm / "eval")
    compare_main([str(tmp_path / "w16/eval/results.json"), str(tmp_path / "w64/eval/results.json"), "--out",
                  str(tmp_path / "cmp")])
    table = (tmp_path / "cmp/comparison.md").read_text()
    assert "| w16 | 50.0 [15, 85] n=4 | 50.0 [5, 95] n=1 |" in table and "| w64 |" in table
    assert "95% interval" in capsys.readouterr().out
    assert (tmp_path / "cmp/niah_vs_length.png").stat().st_size > 1000
    with pytest.raises(FileNotFoundError, match="missing.json"):
        compare_main([str(tmp_path / "missing.json")])


def test_every_task_length_depth_cell_gets_the_same_count():
    suite = EvalSuite(niah=dict(tasks=list(ruler.TASKS), lengths=[4096, 8192], samples=80))
    jobs = suite.evaluation("niah").jobs()
    assert len(suite.evaluation("niah").settings.depths) == 40 and len(jobs) == 2 * 8 * 80
    for task in ruler.TASKS:
        for length in (4096, 8192):
            depths = [d for t, n, _, d in jobs if (t, n) == (task, length)]
            assert sorted(depths) == sorted(ruler.depth_grid() * 2)  # each depth twice, for every task and length
    with pytest.raises(ValueError, match="eval.niah.samples must be a multiple of the 40 depths"):
        EvalSuite(niah=dict(tasks=list(ruler.TASKS), samples=5))  # the old default: 8 x 5 filled 40 depths, per task 5
    suite = EvalSuite(niah=dict(tasks=["niah_single_1"], samples=4, depths=4))
    assert suite.evaluation("niah").settings.depths == pytest.approx([0, 1 / 3, 2 / 3, 1], abs=1e-6)


def test_a_sample_regenerates_from_its_recorded_arguments(capsys):
    from swax_lightning.evals.regenerate import main as regenerate

    sample = ruler.NIAHGenerator(ByteTokenizer(), seed=2).sample("niah_single_2", 2048, 0.25, 3)
    regenerate(["--tokenizer", "byte", "--seed", "2", "niah", "niah_single_2", "2048", "0.25", "3"])
    assert capsys.readouterr().out == sample.input_text + "\n"
    with pytest.raises(SystemExit):
        regenerate(["niah", "niah_single_2", "2048", "3"])  # a NIAH sample needs its depth
    suite = EvalSuite(seed=2, babilong=dict(tasks=["qa2"], lengths=[2048], samples=1, answer_chars=40))
    command = suite._settings(SimpleNamespace(window=None, attention_windows=lambda: {}, cfg=SimpleNamespace(
        pattern="A"), n_sink=0), SimpleNamespace(name="byte"))["regenerate"]
    arguments = command.split("regenerate ")[1].replace(" <sample's regenerate>", "").split()
    regenerate([*arguments, "babilong", "qa2", "2048", "0"])  # the settings' options + the sample's arguments
    sample = babilong.BabiLongGenerator(ByteTokenizer(), 40, seed=2).sample("qa2", 2048, 0)
    assert capsys.readouterr().out == sample.input_text + "\n"


def test_suite_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="eval.niah.tasks"):
        EvalSuite(niah=dict(tasks=["niah_single_7"]))
    with pytest.raises(ValueError, match="eval.babilong.tasks"):
        EvalSuite(babilong=dict(tasks=["qa6"]))
    with pytest.raises(ValueError, match="eval.niah.depths"):
        EvalSuite(niah=dict(tasks=["niah_single_1"], depths=[0.5, 1.5]))
    with pytest.raises(FileNotFoundError, match="essay.txt"):
        EvalSuite(niah=dict(tasks=["niah_single_2"]), essay_file=str(tmp_path / "essay.txt"))
    with pytest.raises(FileNotFoundError, match="babi"):
        EvalSuite(babilong=dict(tasks=["qa1"], data_dir=str(tmp_path / "babi")))


def test_official_babilong_files_through_the_suite(tmp_path):
    """The suite reads the official layout, names the splits and the source, and points each sample at its row."""
    import torch

    from swax_lightning.model.config import ModelConfig
    from swax_lightning.model.model import SWAXModel

    (tmp_path / "qa1").mkdir()
    rows = [{"input": "Mary went to the office.", "question": "Where is Mary?", "target": "office"}] * 2
    (tmp_path / "qa1" / "4k.json").write_text(json.dumps(rows))
    suite = EvalSuite(babilong=dict(tasks=["qa1"], lengths=[4096], samples=1, data_dir=str(tmp_path)))
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8)).eval()
    samples = []
    result = suite.evaluation("babilong").run(model, SimpleNamespace(tokenizer=ByteTokenizer()), samples)
    assert result["source"] == f"official BABILong files in {tmp_path}" and "GPT-2" in result["length_unit"]
    assert result["scores"]["qa1"]["4k"]["n"] == 1
    assert samples[0]["source"] == "qa1/4k.json row 0" and samples[0]["target"] == "office"
    assert samples[0]["question"] == "Where is Mary?" and samples[0]["tokens"] > 0


def test_the_cost_estimate_counts_the_tokens_the_suite_reads():
    """The estimate printed before a suite runs (evals/cost.py) counts the NIAH and BABILong prompt tokens that the
    suite's own samples then hold, within their tails, and times them from the model's measured speed."""
    import torch

    from swax_lightning.evals.cost import estimate, workload
    from swax_lightning.model.config import ModelConfig
    from swax_lightning.model.model import SWAXModel

    suite = EvalSuite(niah=dict(tasks=["niah_single_1", "niah_multikey_2"], lengths=[1024, 2048], samples=2, depths=2,
                                max_new_tokens=4), babilong=dict(tasks=["qa1"], lengths=[2048], samples=2))
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8)).eval()
    samples = []
    suite.evaluation("niah").run(model, SimpleNamespace(tokenizer=ByteTokenizer()), samples)
    suite.evaluation("babilong").run(model, SimpleNamespace(tokenizer=ByteTokenizer()), samples)
    counted = workload(suite)
    for name, kind in (("RULER NIAH", "niah"), ("BABILong", "babilong")):
        read = [s["tokens"] for s in samples if s["eval"] == kind]
        assert counted[name][0] == len(read)
        assert abs(counted[name][1] - sum(read)) <= 0.05 * sum(read), (name, counted[name], sum(read))
    text = estimate(suite, model)
    assert text.startswith("evaluation cost (this machine: ") and "RULER NIAH: 8 prompts, 0.01M tokens" in text
