"""The window study's one command, end to end at a few steps: arms of configs/study train on text, MQAR and copy
episodes, evaluate (MQAR accuracy by gap, span copying by length, the test split) at their own window and at the
study's other one, two runs side by side, and collect into the table (each arm's mean and seed range per gap), the
claims and the plots; a second call skips them."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "2", "--data.batch_size", "2", "--eval.copy.lengths", "[8, 96]",
         "--eval.copy.samples", "2", "--eval.mqar.gaps", "[0, 64]", "--eval.mqar.samples", "4",
         "--data.recall.documents", "50", "--data.recall.short_gap_steps", "1",
         "--data.recall.short_gap_documents", "4"]


@pytest.mark.slow
def test_the_study_command_trains_evaluates_collects_and_resumes(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    for name in ("_base.yaml", "w_short.yaml", "w_long.yaml"):
        shutil.copy(ROOT / "configs/study" / name, study)
    cmd = [sys.executable, "-m", "swax_lightning", "study", "run", str(study), "--seeds", "0", "1", "--jobs", "2",
           "--save_dir", str(tmp_path / "runs"), "--records", str(tmp_path / "records"), "--", *SMALL]
    # From the temporary folder: each seed writes its own recall documents into its default data folder there.
    first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "runs/study"
    lines = (out / "study.md").read_text().splitlines()
    header = lines.index("| arm | seeds | gap 0 | gap 64 |")  # the MQAR accuracy table comes first
    for arm in ("w_long", "w_short"):
        row = next(line for line in lines[header:] if line.startswith(f"| {arm} | 2 | "))
        assert row.count("(") == 2  # each gap: the mean over the two seeds (lowest-highest)
        for seed in (0, 1):
            run = out / f"{arm}-s{seed}"
            results = json.loads((run / "eval/results.json").read_text())
            assert [g["gap"] for g in results["mqar"]["gaps"]] == [0, 64]
            assert json.loads((run / "environment.json").read_text())["threads"] == 1
            assert _scalar_tags(run) >= {"eval/mqar/gap_0/accuracy", "eval/mqar/gap_64/value_loss", "val/loss",
                                         "eval/copy/length_96/accuracy"}
            other = 64 if arm == "w_short" else 2  # each arm also at the study's other window
            at_other = json.loads((run / f"eval_w{other}/results.json").read_text())
            assert (at_other["settings"]["window"], results["settings"]["window"]) == (other, 66 - other)
            assert set(at_other["test_split"]) >= {"test/loss", "test/bpb"}
    assert any(line.startswith("- 4 run(s): ") and "1 thread(s)" in line for line in lines)
    table = lines[lines.index("| arm | evaluated at | MQAR beyond | copy inside | test bpb |"):]
    assert any(line.startswith("| w_long | 64 (own) | ") for line in table)
    assert any(line.startswith("| w_long | 2 | ") for line in table)
    for plot in ("mqar_accuracy_vs_gap.png", "mqar_loss_vs_gap.png", "copy_accuracy_vs_length.png",
                 "short_context_per_arm.png"):
        assert (out / plot).stat().st_size > 0
    assert len(list((tmp_path / "data").glob("embedded-byte-512-recall-*"))) == 2  # one data folder per seed
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done before") == 4, again.stdout[-2000:]
    # The records alone, in another checkout whose runs/ is gone, give the same report.
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        "w_long-s0.json", "w_long-s1.json", "w_short-s0.json", "w_short-s1.json"]
    elsewhere = tmp_path / "elsewhere"
    from_records = subprocess.run([sys.executable, "-m", "swax_lightning", "study", "collect", str(elsewhere / "study"),
                                   "--records", str(tmp_path / "records")], cwd=ROOT, capture_output=True, text=True,
                                  timeout=300)
    assert from_records.returncode == 0, from_records.stderr[-3000:]
    assert (elsewhere / "study/study.md").read_text() == (out / "study.md").read_text()
    # ... and the same command there trains none of the runs its records keep.
    kept = subprocess.run([*cmd[:cmd.index("--save_dir") + 1], str(elsewhere), *cmd[cmd.index("--save_dir") + 2:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert kept.returncode == 0 and kept.stdout.count("kept in ") == 4, kept.stdout[-2000:]
    assert not list((elsewhere / "study").glob("*-s*")) and "main.py fit" not in kept.stdout


def _scalar_tags(run: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in run.glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags


def test_the_report_gives_each_arm_its_mean_and_seed_range_per_gap():
    # Two seeds of one arm, one of another: every column is the seeds' mean (lowest-highest); a single seed is its
    # value alone; a missing measurement is NaN, not a silent zero; each run's intervals and environment are listed.
    from swax_lightning.study.sweep import report

    def run(val, accuracy, loss, niah, recall, threads=1):
        gap = {"gap": 0, "reach": [5, 55], "accuracy": accuracy, "accuracy_ci95": [accuracy - 3, accuracy + 4],
               "loss": loss, "n": 96}
        return {"val/loss": val, "environment": {"cpu": "EPYC", "cpu_capability": "AVX512", "threads": threads,
                                                 "gpu": None, "python": "3.11", "platform": "Linux",
                                                 "packages": {"torch": "2.13.0"}},
                "results": {"settings": {"window": 64},
                            "mqar": {"gaps": [gap], "episode": "16 episodes", "chance": "3.8%"},
                            "niah": {"scores": {"average": {"512": {"mean": niah, "ci95": [niah - 5, niah + 5]}}}},
                            "recall": {"buckets": [{"from": 1, "to": 8, "loss": recall}]}}}

    runs = {("w_short", 0): run(2.0, 30.0, 2.0, 10.0, 1.0), ("w_short", 1): run(3.0, 50.0, 1.0, 30.0, 2.0),
            ("xlstm", 0): {"val/loss": 2.5, "environment": {}, "results": {}}}
    lines = report(runs).splitlines()
    assert lines[lines.index("| arm | seeds | gap 0 |") + 2:][:2] == ["| w_short | 2 | 40.0 (30.0-50.0) |",
                                                                        "| xlstm | 1 | nan |"]
    assert "| w_short | 2 | 1.500 (1.000-2.000) |" in lines  # value loss
    assert "| w_short | 2 | 2.500 (2.000-3.000) | nan | nan | 20 (10-30) | 1.500 (1.000-2.000) |" in lines  # secondary
    assert "| xlstm | 1 | 2.500 | nan | nan | nan | nan |" in lines
    assert "| w_short | 1 | 3.000 | 50 [47, 54] | 30 [25, 35] |" in lines  # every run, with its intervals
    assert any(line.startswith("- 2 run(s): EPYC (AVX512), 1 thread(s)") for line in lines)
    assert "- xlstm-s0: not recorded" in lines


def test_the_claims_are_read_seed_by_seed_with_paired_intervals():
    # Five seeds. Beyond the long window (gap 512: every pair beyond 64; gap 0 is not counted) w_short beats w_long in
    # every seed, the stochastic arm in 3 of 5 by a margin whose interval reaches below 0; the long window wins short
    # context (copying inside it; span 96 is beyond it and not counted; and bits per byte) in every seed; the
    # stochastic arm is better than short and not worse than long. The verdicts follow.
    from swax_lightning.study.sweep import report

    def run(beyond, inside, copy, bpb):
        gaps = [{"gap": 0, "reach": [2, 31], "accuracy": inside, "accuracy_ci95": [0, 100], "loss": 1.0, "n": 96},
                {"gap": 512, "reach": [514, 543], "accuracy": beyond, "accuracy_ci95": [0, 100], "loss": 1.0,
                 "n": 96}]
        spans = [{"length": 32, "reach": 33, "accuracy": copy}, {"length": 96, "reach": 97, "accuracy": 50.0}]
        return {"test/bpb": bpb, "environment": {}, "results": {
            "settings": {"window": 64}, "mqar": {"gaps": gaps, "episode": "e", "chance": "c"},
            "copy": {"lengths": spans, "episode": "e", "chance": "c"}}}

    stochastic_beyond = [9.0, 2.0, 8.0, 1.0, 6.0]  # against w_long's 4.0: better in 3 of 5, mean +1.2
    runs = {}
    for seed in range(5):
        runs[("w_long", seed)] = run(4.0, 90.0, 80.0 + seed, 1.50 + 0.01 * seed)
        runs[("w_short", seed)] = run(20.0 + seed, 10.0, 10.0, 1.70 + 0.01 * seed)
        runs[("stochastic_p0.5", seed)] = run(stochastic_beyond[seed], 90.0, 80.0 + seed, 1.50 + 0.01 * seed)
    lines = report(runs).splitlines()
    rows = {tuple(cell.strip() for cell in line.split("|")[1:4]): line for line in lines if line.startswith("| 1.")
            or line.startswith("| 2.") or line.startswith("| 3.")}
    beyond, copy, bpb = ("MQAR accuracy beyond W = 64 (points)", "copy accuracy inside W = 64 (points)",
                         "test bits per byte (negated)")
    assert "| 5 of 5 | +18.000 [+16.800, +19.200] | holds |" in rows[("1. recall beyond the long window",
                                                                        "w_short vs w_long", beyond)]
    stochastic = rows[("1. recall beyond the long window", "stochastic_p0.5 vs w_long", beyond)]
    assert "| 3 of 5 | +1.200 [" in stochastic and stochastic.endswith("| does not hold |")
    assert "| 5 of 5 | +72.000 [+70.800, +73.200] | holds |" in rows[("2. the long window wins short context",
                                                                       "w_long vs w_short", copy)]
    assert "| 5 of 5 | +0.200 [+0.200, +0.200] | holds |" in rows[("2. the long window wins short context",
                                                                     "w_long vs w_short", bpb)]
    for measure in (copy, bpb):
        assert rows[("3. stochastic keeps short context: better than short", "stochastic_p0.5 vs w_short",
                     measure)].endswith("| holds |")
        assert "| 0 of 5 | +0.000 [+0.000, +0.000] | holds |" in rows[("3. ... and not worse than long",
                                                                         "stochastic_p0.5 vs w_long", measure)]
    two = {key: run for key, run in runs.items() if key[1] < 2}  # two seeds: counted, no verdict
    assert f"| w_short vs w_long | {beyond} | 2 of 2 | +16.500 [+16.000, +17.000] | too few seeds for a verdict " \
           "(n < 3) |" in report(two)
    del runs[("w_short", 0)], runs[("w_short", 1)], runs[("w_short", 2)], runs[("w_short", 3)], runs[("w_short", 4)]
    assert f"| w_short vs w_long | {beyond} | not measured | | |" in report(runs)


def _finished_run(folder: Path, accuracy: float, window: int = 64) -> None:
    (folder / "eval").mkdir(parents=True)
    results = {"settings": {"window": window}, "mqar": {"gaps": [{"gap": 0, "accuracy": accuracy, "loss": 1.0}]},
               "test_split": {"test/loss": 1.5, "test/bpb": 2.0}}
    (folder / "eval/results.json").write_text(json.dumps(results))
    (folder / "eval_w2").mkdir()
    (folder / "eval_w2/results.json").write_text(json.dumps({**results, "settings": {"window": 2}}))


def test_records_keep_finished_runs_across_checkouts_and_refuse_a_contradiction(tmp_path, capsys):
    # A study spread over several machines: seed 0 ran in one checkout, seed 1 in another; each run's record joins
    # the report; a record that disagrees with a run folder of the same arm and seed, or a damaged one, is named
    # in one line and nothing is rewritten.
    from swax_lightning.study.sweep import load_runs, main

    records = tmp_path / "records"
    _finished_run(tmp_path / "first/study/w_long-s0", 30.0)
    first = load_runs(tmp_path / "first/study", records)
    assert list(first) == [("w_long", 0)] and first[("w_long", 0)]["at_other_windows"][2]["settings"]["window"] == 2
    _finished_run(tmp_path / "second/study/w_long-s1", 40.0)
    both = load_runs(tmp_path / "second/study", records)
    assert sorted(both) == [("w_long", 0), ("w_long", 1)]
    assert both[("w_long", 0)] == first[("w_long", 0)]  # the record gives back the run as collected
    assert load_runs(tmp_path / "nowhere", records) == both

    kept = (records / "w_long-s1.json").read_text()
    _finished_run(tmp_path / "third/study/w_long-s1", 41.0)
    with pytest.raises(SystemExit) as stop:
        main(["collect", str(tmp_path / "third/study"), "--records", str(records)])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and error.count("\n") == 1 and "third/study/w_long-s1 and " in error, error
    assert f"{records / 'w_long-s1.json'} hold different results" in error
    assert (records / "w_long-s1.json").read_text() == kept

    (records / "w_long-s0.json").write_text('{"results": ')
    with pytest.raises(ValueError, match=r"w_long-s0.json is corrupt .*git checkout"):
        load_runs(tmp_path / "nowhere", records)


def test_the_report_in_the_docs_is_what_the_committed_records_give(tmp_path):
    # docs/study/kept_report.md is the report a reader sees of the kept runs: the user's command on the records alone
    # (no run folder) must give it back to the character, so a record added without its report, or a report edited by
    # hand, fails here.
    collected = subprocess.run([sys.executable, "-m", "swax_lightning", "study", "collect", str(tmp_path / "study"),
                                "--records", str(ROOT / "docs/study/records")], cwd=ROOT, capture_output=True,
                               text=True, timeout=300)
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert (tmp_path / "study/study.md").read_text() == (ROOT / "docs/study/kept_report.md").read_text()


def test_a_run_is_kept_as_it_finishes_so_a_later_failure_loses_none(tmp_path, monkeypatch):
    # The study's commands faked: seed 0 "trains" (its test writes the results), seed 1's fit fails. The study stops
    # with that error, and seed 0's record is already there.
    from swax_lightning.study import sweep

    def fake_main(subcommand, config, seed, save_dir, extra, threads, *more):
        if seed == 1:
            raise RuntimeError("fit of seed 1 failed")
        folder = sweep.arm_run_dir(config, seed, save_dir)
        folder.mkdir(parents=True, exist_ok=True)
        if subcommand == "test" and "--eval.output_dir" not in more:
            _finished_run(folder, 30.0)

    study = tmp_path / "study"
    study.mkdir()
    shutil.copy(ROOT / "configs/study/xlstm.yaml", study)  # a control: tested at its own window only
    shutil.copy(ROOT / "configs/study/_base.yaml", study)
    monkeypatch.setattr(sweep, "_main", fake_main)
    with pytest.raises(RuntimeError, match="seed 1 failed"):
        sweep.run_all(study, [0, 1], tmp_path / "runs", [], 1, 1, tmp_path / "records")
    assert [p.name for p in (tmp_path / "records").iterdir()] == ["xlstm-s0.json"]
    assert sweep.load_records(tmp_path / "records")[("xlstm", 0)]["results"]["mqar"]["gaps"][0]["accuracy"] == 30.0


def test_compare_flags_a_cell_where_one_sweeps_mean_leaves_the_others_seed_range():
    # Gap 0: the sweeps' means (20, 21) lie inside each other's seed ranges; gap 512: the second sweep's mean (30)
    # lies above every seed of the first (3-5): that cell differs, and the count says so.
    from swax_lightning.study.sweep import compare

    def sweep(*per_seed):
        return {("w_long", seed): {"environment": {}, "results": {"mqar": {"gaps": [
            {"gap": gap, "accuracy": accuracy, "loss": 1.0} for gap, accuracy in zip((0, 512), accuracies)]}}}
            for seed, accuracies in enumerate(per_seed)}

    text = compare(sweep((10.0, 3.0), (30.0, 5.0)), sweep((18.0, 25.0), (24.0, 35.0)))
    assert "| w_long | 20.0 (10.0-30.0) / 21.0 (18.0-24.0) | 4.0 (3.0-5.0) / 30.0 (25.0-35.0) **differ** |" in text
    assert "1 of 2 cells agree within the seed spread." in text


@pytest.mark.slow
def test_the_gpu_study_configs_train_a_step_and_evaluate_on_cpu_at_toy_size(tmp_path):
    # configs/study_gpu at a toy size on CPU: every arm's config parses (print_config), and one windowed arm fits a
    # step and runs its evaluations at its own window and the study's other one through the study command.
    source = tmp_path / "text"
    source.mkdir()
    for i in range(30):
        (source / f"doc{i}.txt").write_text(" ".join(f"word{(i * 7 + j) % 50} is: {j % 10}." for j in range(300)))
    toy = ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_steps", "1",
           "--trainer.val_check_interval", "1", "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches",
           "1", "--model.arch.d_model", "64", "--model.arch.n_layers", "4", "--model.arch.n_heads", "2",
           "--model.arch.mlstm_heads", "2", "--data.source", str(source), "--data.data_dir", str(tmp_path / "data"),
           "--data.batch_size", "2", "--data.num_workers", "0", "--data.recall.documents", "4",
           "--data.recall.doc_chars", "2000", "--eval.copy.samples", "2", "--eval.mqar.samples", "2",
           "--eval.mqar.gaps", "[0, 128]", "--eval.chunk_len", "512"]
    for arm in sorted((ROOT / "configs/study_gpu").glob("[!_]*.yaml")):
        printed = subprocess.run([sys.executable, "main.py", "fit", "--config", str(arm), *toy, "--print_config"],
                                 cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert printed.returncode == 0 and "seq_len: 512" in printed.stdout, printed.stderr[-2000:]
    study = tmp_path / "study_gpu"
    study.mkdir()
    for name in ("_base.yaml", "w_short.yaml", "stochastic_p0.5.yaml"):
        shutil.copy(ROOT / "configs/study_gpu" / name, study)
    run = subprocess.run([sys.executable, "-m", "swax_lightning", "study", "run", str(study), "--seeds", "0",
                          "--save_dir", str(tmp_path / "runs"), "--", *toy], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    arm = tmp_path / "runs/study_gpu/stochastic_p0.5-s0"
    results = json.loads((arm / "eval/results.json").read_text())
    assert results["settings"]["window"] == 64 and [c["length"] for c in results["copy"]["lengths"]] == [8, 24, 48, 96]
    assert json.loads((arm / "eval_w2/results.json").read_text())["settings"]["window"] == 2


def test_an_arm_is_tested_at_every_study_window_but_its_own_and_a_control_at_none(tmp_path):
    # Its own window is its eval_window, or the model's window where the schedule leaves it empty (the callback's
    # default); an arm without a window schedule (attention, xLSTM) has no other window.
    from swax_lightning.study.sweep import other_windows, study_windows

    (tmp_path / "_base.yaml").write_text("model:\n  arch:\n    window: 64\n")
    arms = {"short.yaml": "window:\n  windows: [2]\n  eval_window: 2\n",
            "long.yaml": "window:\n  windows: [64]\n",  # evaluated at the model's window, 64
            "stochastic.yaml": "window:\n  windows: [2, 64]\n  eval_window: 64\n",
            "control.yaml": "model:\n  arch:\n    pattern: A\n"}
    for name, text in arms.items():
        (tmp_path / name).write_text("extends: _base.yaml\n" + text)
    windows = study_windows(tmp_path)
    assert windows == [2, 64]
    assert {name: other_windows(tmp_path / name, windows) for name in arms} == {
        "short.yaml": [64], "long.yaml": [2], "stochastic.yaml": [2], "control.yaml": []}
