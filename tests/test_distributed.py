"""Sharded training and evaluation are one model: K processes under FSDP2 compute what one process computes, and no
rank ever waits forever.

Training. The oracle: K ranks with batch b per rank against one process trained in this test on exactly the global
batches the ranks consumed (the K batches of a step concatenated in rank order): the same per-step loss (the mean of
the ranks' losses) within 1e-5 in fp32, the same all-gathered parameters on every rank after every step, and final
weights (from the consolidated distributed checkpoint) equal to the 1-process run's within 1e-5. Run for K = 2
through the rehearsal command of docs/scale-out.md (Lightning launches the processes; full sharding, as the paper
configs) and for 2 "nodes" x 2 devices with HSDP, through two torchrun launches on localhost.

Evaluation. Both runs use the config's own batch size (16) and validation limit (16 batches per rank), only the step
count lowered: the validation split's 20 batches were dealt 9 and 11 to 2 ranks by litdata, which hung the first
validation. Their validation loss at the last step equals that of a 1-process `main.py validate` of the same
checkpoint with limit_val_batches = 16 x K (what the per-rank limit covers: here the whole split). `main.py test` of
the 2-rank distributed checkpoint on 3 ranks, without a test limit (the test split's 56 batches: 19 per rank, one of
them padding), scores the test loss and the suite of a 1-process run on its consolidated file.

Leaving. Ranks that leave right after their last collective while rank 0 goes on (the evaluation suite) end with
code 0 (tests/gloo_leave.py, through FSDP2Strategy's teardown pause).

No hang. A rank that runs one forward more than the others at the end of a validation (what the uneven split did)
ends every rank with one line naming it and the phase, once collective_timeout passes; SIGTERM to rank 0 of such a
hung run ends every rank with one line. torchrun with fewer processes than devices is one line per rank.

Then: a run killed with SIGKILL inside a validation resumes on all ranks from last.ckpt and continues exactly (the
interrupted validation runs again); the consolidated file loads in generate and resumes a 1-process fit; a
distributed checkpoint given to a 1-process run is one clear error line.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from swax_lightning.data.datamodule import TextDataModule
from swax_lightning.training.checkpoints import consolidate
from tests.train_probe import read_records

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs/tiny_stochastic.yaml")
# The 2-process rehearsal of a cluster run that docs/scale-out.md prints (checked below).
REHEARSAL = (".venv/bin/python main.py fit --config configs/tiny_stochastic.yaml --trainer.devices 2 "
             "--trainer.strategy fsdp2")
STEPS = 4
# The config's own sizes, which the runs keep: batch 16 per rank, 16 validation batches per rank.
BATCH = yaml.safe_load((ROOT / "configs/base/tiny_data.yaml").read_text())["batch_size"]
VAL_LIMIT = yaml.safe_load((ROOT / "configs/base/tiny_trainer.yaml").read_text())["limit_val_batches"]
# Sharded and 1-process mean losses differ by the order of the fp32 sums only (seen: 0, 1.0e-7 and 2.0e-7 relative).
LOSS_RTOL = 1e-5
RUN_TIMEOUT_S = 400  # a run still going after this hung: its process group is killed and the test fails
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("shards") / "tiny"
    TextDataModule(source="embedded", data_dir=str(path), seq_len=256).prepare_data()
    return path


def _common(tmp, data_dir, record_dir):
    """Data, run folder and the recording probe: everything else is the config's."""
    return ["--data.data_dir", str(data_dir), "--trainer.logger.init_args.save_dir", str(tmp / "runs"),
            "--trainer.enable_progress_bar", "false", "--trainer.callbacks+=tests.train_probe.RecordTraining",
            f"--trainer.callbacks.out_dir={record_dir}"]


def _args(tmp, data_dir, record_dir, *extra):
    """The config's sizes, with only the step count lowered (and a validation every 2 steps, to see one mid-run)."""
    return [*_common(tmp, data_dir, record_dir), "--trainer.max_steps", str(STEPS), "--trainer.val_check_interval",
            "2", *extra]


def _start(cmd, **popen):
    """cmd in a process group of its own, so that every rank of a hung run can be killed. One CPU thread per process
    for every launch: torchrun sets OMP_NUM_THREADS=1 and Lightning's own launcher does not, and matrix products
    split over another number of threads sum in another order (seen: the same step's weights differing in the last
    bits between a torchrun run and a Lightning-launched one), which the exact comparisons here would report."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, start_new_session=True, **popen)


def _finish(*processes, timeout=RUN_TIMEOUT_S) -> list[tuple[str, str]]:
    """(stdout, stderr) of each started run. Runs still going after `timeout` hung: all of them are stopped and the
    test fails."""
    deadline = time.monotonic() + timeout
    try:
        return [process.communicate(timeout=max(1.0, deadline - time.monotonic())) for process in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            _stop(process)
        pytest.fail(f"still running after {timeout} s (hung), stopped: {' '.join(map(str, processes[0].args[:6]))}")


def _stop(process) -> None:
    """SIGTERM to the run's process group (torchrun passes it on to its workers, which it starts in sessions of their
    own, and kills them 30 s later), then SIGKILL."""
    for signum, grace in ((signal.SIGTERM, 60), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            process.communicate(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _run(cmd, timeout=RUN_TIMEOUT_S):
    process = _start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    [(out, err)] = _finish(process, timeout=timeout)
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


def _rehearsal(*args):
    cmd = REHEARSAL.split()
    return [sys.executable, *cmd[1:], *args]


def _torchrun(nnodes, node_rank, port, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(node_rank),
            "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
            str(ROOT / "main.py"), *args]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ckpt(tmp) -> Path:
    return tmp / "runs/tiny/stochastic_p0.5/checkpoints/last.ckpt"


def _reference(tmp, data_dir, records, steps=STEPS):
    """One process trained on the ranks' global batches; returns (per-step loss, final state_dict)."""
    from swax_lightning.commands.cli import SwaxCLI
    from swax_lightning.training.module import LanguageModule

    ranks = sorted(records)
    batches = [torch.tensor(sum((records[r]["steps"][s]["batch"] for r in ranks), [])) for s in range(steps)]
    cli = SwaxCLI(LanguageModule, TextDataModule, seed_everything_default=0, run=False, args=[
        "--config", CONFIG, *_args(tmp / "ref", data_dir, tmp / "ref/records"), "--trainer.limit_val_batches", "0"])
    cli.datamodule.train_dataloader = lambda: DataLoader(batches, batch_size=None)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    ref = read_records(tmp / "ref/records")[0]["steps"]
    return [ref[s]["loss"] for s in range(steps)], cli.model.state_dict()


def _assert_one_model(records, ref_losses, ref_state, ckpt, steps=STEPS):
    ranks = sorted(records)
    rows = [tuple(row) for r in ranks for s in range(steps) for row in records[r]["steps"][s]["batch"]]
    assert len(set(rows)) == len(rows), "ranks must read different data"
    for s in range(steps):
        per_rank = [records[r]["steps"][s] for r in ranks]
        assert len({rec["params"] for rec in per_rank}) == 1, f"ranks hold different models after step {s}"
        assert len({rec["window"] for rec in per_rank}) == 1, f"ranks trained at different windows at step {s}"
        global_loss = sum(rec["loss"] for rec in per_rank) / len(ranks)
        assert abs(global_loss - ref_losses[s]) <= 1e-5, (s, global_loss, ref_losses[s])
    state = torch.load(_consolidated(ckpt), weights_only=False)["state_dict"]
    assert set(state) == set(ref_state)
    for name, value in ref_state.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-5, msg=name)


def _consolidated(ckpt: Path) -> Path:
    full = ckpt.with_name("full.ckpt")
    return full if full.is_file() else consolidate(ckpt, full)


def _one_process(subcommand, tmp, data_dir, ckpt, *extra) -> dict:
    """`main.py <subcommand>` of a checkpoint file in 1 process (this one): the probe's records."""
    from swax_lightning.commands.cli import main

    main([subcommand, "--config", CONFIG, *_common(tmp, data_dir, tmp / "records"), "--ckpt_path", str(ckpt), *extra])
    return read_records(tmp / "records")[0]


def _assert_same_loss(sharded: float, single: float) -> None:
    assert abs(sharded - single) <= LOSS_RTOL * single, (sharded, single)


def _assert_validates_as_one_process(tmp, data_dir, records, ckpt) -> None:
    """The sharded run's validation at its last step (every rank logs the synced value) equals a 1-process validate of
    its last checkpoint over the same batches: the per-rank limit on K ranks covers the first limit x K batches."""
    last = {rank: records[rank]["validations"][-1] for rank in records}
    assert len({(v["step"], v["loss"]) for v in last.values()}) == 1 and last[0]["step"] == STEPS, last
    limit = VAL_LIMIT * len(records)
    single = _one_process("validate", tmp, data_dir, _consolidated(ckpt), "--trainer.limit_val_batches", str(limit))
    _assert_same_loss(last[0]["loss"], single["validations"][-1]["loss"])


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, data_dir):
    """The rehearsal command with the config's sizes, 4 steps with a validation every 2."""
    tmp = tmp_path_factory.mktemp("k2")
    run = _run(_rehearsal(*_args(tmp, data_dir, tmp / "records")))
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp


def test_the_scale_out_page_prints_the_rehearsal_command():
    assert REHEARSAL in (ROOT / "docs/scale-out.md").read_text()


def test_the_rehearsal_keeps_the_config_sizes(two_rank_run):
    records = read_records(two_rank_run / "records")
    assert {len(records[r]["steps"][s]["batch"]) for r in records for s in range(STEPS)} == {BATCH} == {16}
    assert VAL_LIMIT == 16


def test_two_ranks_train_what_one_process_trains(tmp_path, data_dir, two_rank_run):
    records = read_records(two_rank_run / "records")
    assert sorted(records) == [0, 1]
    ref_losses, ref_state = _reference(tmp_path, data_dir, records)
    _assert_one_model(records, ref_losses, ref_state, _ckpt(two_rank_run))


def test_two_ranks_validate_what_one_process_validates(tmp_path, data_dir, two_rank_run):
    _assert_validates_as_one_process(tmp_path, data_dir, read_records(two_rank_run / "records"), _ckpt(two_rank_run))


def test_two_nodes_of_two_devices_train_and_validate_one_model_under_hsdp(tmp_path, data_dir):
    """HSDP (shard inside a node, replicate across nodes) only differs from full sharding with 2+ nodes of 2+ devices,
    so the multi-node launch is proven with it; full sharding (the paper configs') is the rehearsal's K = 2 run, and
    its 4-rank and 64-rank meshes are checked in tests/test_fsdp2.py. 4 ranks share the 20 validation batches 5/5/5/5
    (litdata: 4/4/4/8)."""
    port = _free_port()
    args = ["fit", "--config", CONFIG, *_args(tmp_path, data_dir, tmp_path / "records"), "--trainer.num_nodes", "2",
            "--trainer.devices", "2", "--trainer.strategy", "hsdp"]
    nodes = [_start(_torchrun(2, n, port, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in (0, 1)]
    outputs = [out for out, _ in _finish(*nodes)]
    assert all(node.returncode == 0 for node in nodes), outputs[0][-3000:] + outputs[1][-3000:]
    records = read_records(tmp_path / "records")
    assert sorted(records) == [0, 1, 2, 3]
    ref_losses, ref_state = _reference(tmp_path, data_dir, records)
    _assert_one_model(records, ref_losses, ref_state, _ckpt(tmp_path))
    _assert_validates_as_one_process(tmp_path / "single", data_dir, records, _ckpt(tmp_path))


def test_kill_during_validation_then_resume_continues_exactly(tmp_path, data_dir, two_rank_run):
    fit = ["fit", "--config", CONFIG, "--trainer.devices", "2", "--trainer.strategy", "fsdp2"]
    killed = _run(_torchrun(1, 0, _free_port(), *fit, *_args(tmp_path, data_dir, tmp_path / "records"),
                            "--trainer.callbacks.kill_in_validation_at=4"))
    assert killed.returncode != 0
    saved = torch.load(_ckpt(tmp_path) / "meta.pt", weights_only=False)
    assert saved["global_step"] == 2  # the validation at step 4 never finished, so last.ckpt is step 2's
    resumed = _run(_torchrun(1, 0, _free_port(), *fit, *_args(tmp_path, data_dir, tmp_path / "records"),
                             "--ckpt_path", "last"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = read_records(tmp_path / "records"), read_records(two_rank_run / "records")
    for rank in (0, 1):
        assert sorted(got[rank]["steps"]) == list(range(STEPS))
        for s in range(STEPS):
            for key in ("loss", "window", "params"):
                assert got[rank]["steps"][s][key] == want[rank]["steps"][s][key], (rank, s, key)
        validated = {v["step"]: v["loss"] for v in got[rank]["validations"]}
        assert validated == {v["step"]: v["loss"] for v in want[rank]["validations"]}  # step 4's ran again


SMALL_EVAL = ["--eval.niah.tasks", "[niah_single_1, niah_multikey_2]", "--eval.niah.lengths", "[512, 1024]",
              "--eval.niah.samples", "2", "--eval.niah.depths", "2", "--eval.babilong.tasks", "[qa1]",
              "--eval.babilong.lengths", "[0, 2048]", "--eval.babilong.samples", "2", "--eval.perplexity.length", "512",
              "--eval.perplexity.samples", "2", "--eval.niah.max_new_tokens", "8"]


@pytest.fixture(scope="module")
def consolidated(two_rank_run):
    """The consolidation command of docs/scale-out.md on the rehearsal's last.ckpt."""
    full = two_rank_run / "full.ckpt"
    run = _run([sys.executable, "-m", "swax_lightning", "consolidate", str(_ckpt(two_rank_run)), "--out", str(full)])
    assert run.returncode == 0 and full.is_file(), run.stderr[-2000:]
    return full


def test_a_damaged_shard_is_one_line_naming_the_checkpoint(tmp_path, two_rank_run):
    damaged = tmp_path / "last.ckpt"
    shutil.copytree(_ckpt(two_rank_run), damaged)
    shard = sorted(damaged.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated, as a full disk or a copy cut
    run = _run([sys.executable, "-m", "swax_lightning", "consolidate", str(damaged)])
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith(f"error: cannot read the shards of distributed checkpoint {damaged}")
    assert not damaged.with_name("last-full.ckpt").exists()


def test_sharded_test_on_an_uneven_split_scores_what_one_process_scores(tmp_path, data_dir, two_rank_run,
                                                                        consolidated):
    """`main.py test` on 3 ranks of the 2-rank checkpoint, no test limit: the whole test split (56 batches of 16, 19
    per rank with one padding batch) and the suite score what 1 process scores on the consolidated file."""
    sharded = _run([sys.executable, str(ROOT / "main.py"), "test", "--config", CONFIG,
                    *_common(tmp_path, data_dir, tmp_path / "records"), *SMALL_EVAL, "--trainer.devices", "3",
                    "--trainer.strategy", "fsdp2", "--ckpt_path", str(_ckpt(two_rank_run)),
                    "--eval.output_dir", str(tmp_path / "sharded")])
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    losses = {rank: [t["loss"] for t in record["tests"]] for rank, record in read_records(tmp_path / "records").items()}
    assert sorted(losses) == [0, 1, 2] and losses[0] == losses[1] == losses[2] and len(losses[0]) == 1
    single = _one_process("test", tmp_path / "single", data_dir, consolidated, *SMALL_EVAL,
                          "--eval.output_dir", str(tmp_path / "single"))
    _assert_same_loss(losses[0][0], single["tests"][-1]["loss"])
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("sharded", "single"))
    evaluated = [run["settings"].pop("checkpoint")["path"] for run in (a, b)]  # each names its own file
    assert evaluated == [str(_ckpt(two_rank_run)), str(consolidated)]
    split_a, split_b = a.pop("test_split"), b.pop("test_split")  # the test loop's figures: sums in another order
    assert split_a.keys() == split_b.keys() >= {"test/loss", "test/bpb"}
    for name in split_a:
        _assert_same_loss(split_a[name], split_b[name])
    assert a == b and a["niah"] and a["babilong"] and a["perplexity"]


def test_a_distributed_checkpoint_in_one_process_is_one_clear_line(capsys, data_dir, two_rank_run):
    from swax_lightning.commands.cli import main
    from swax_lightning.core.errors import ConfigError
    from swax_lightning.training.checkpoints import load_model

    with pytest.raises(SystemExit) as exit_:
        main(["test", "--config", CONFIG, "--data.data_dir", str(data_dir), "--ckpt_path", str(_ckpt(two_rank_run))])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert "is a distributed checkpoint" in err[0] and "python -m swax_lightning consolidate" in err[0]
    with pytest.raises(ConfigError, match="distributed checkpoint.*python -m swax_lightning consolidate"):
        load_model(_ckpt(two_rank_run))


def test_consolidated_checkpoint_loads_in_generate_and_resumes_one_process(tmp_path, data_dir, consolidated):
    from swax_lightning.training.checkpoints import load_model

    model, tokenizer = load_model(consolidated)
    assert torch.isfinite(model(torch.tensor([tokenizer.encode("def main(")]))).all()
    resumed = _run([sys.executable, str(ROOT / "main.py"), "fit", "--config", CONFIG,
                    *_args(tmp_path, data_dir, tmp_path / "records"), "--data.batch_size", str(2 * BATCH),
                    "--trainer.max_steps", str(STEPS + 2), "--trainer.limit_val_batches", "2",  # resuming is the test
                    "--ckpt_path", str(consolidated)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(read_records(tmp_path / "records")[0]["steps"]) == [STEPS, STEPS + 1]


# ---- a rank leaves cleanly -----------------------------------------------------------------------------------------
def test_ranks_leaving_right_after_a_collective_end_with_code_0():
    """tests/gloo_leave.py: 3 gloo ranks over a device mesh; two leave right after their last collective while rank
    0 computes, through FSDP2Strategy's teardown pause (let_collectives_go). Every rank ends with code 0 in 12 rounds
    (without the pause some round sees a rank abort at interpreter shutdown: the figures in tests/gloo_leave.py)."""
    done = subprocess.run([sys.executable, str(ROOT / "tests/gloo_leave.py"), "--rounds", "12"], cwd=ROOT,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.splitlines() == ["0 of 12 rounds failed"], done.stdout + done.stderr


def test_the_strategy_pauses_at_teardown(monkeypatch):
    """The pause is in the path every FSDP2 run takes: FSDP2Strategy.teardown ends with it."""
    from swax_lightning.training import strategy

    paused = []
    monkeypatch.setattr(strategy, "let_collectives_go", lambda: paused.append(True))
    monkeypatch.setattr(strategy.ModelParallelStrategy, "teardown", lambda self: None)
    strategy.FSDP2Strategy().teardown()
    assert paused == [True]


# ---- no rank waits forever -----------------------------------------------------------------------------------------
# 1 step, then a 2-batch validation at whose end rank 1 runs one forward more than rank 0 (tests/train_probe.py).
STALL = ["--trainer.max_steps", "1", "--trainer.val_check_interval", "1", "--trainer.limit_val_batches", "2",
         "--trainer.num_sanity_val_steps", "0", "--trainer.callbacks.extra_forward_in_validation_at=1"]


def _rank_lines(stderr: str) -> dict[int, str]:
    lines = [line for line in stderr.splitlines() if line.startswith("error: rank ")]
    by_rank = {int(line.split()[2].rstrip(":")): line for line in lines}
    assert len(by_rank) == len(lines), lines  # one line per rank
    return by_rank


def test_a_rank_left_waiting_in_a_collective_ends_every_rank_with_one_line(tmp_path, data_dir):
    """Rank 1 waits in the extra forward's all-gather, rank 0 in the validation's metric sync: with
    collective_timeout 10 s both end, each with one line naming its rank and the phase, and no traceback."""
    strategy = ('{"class_path": "swax_lightning.training.strategy.FSDP2Strategy", '
                '"init_args": {"collective_timeout": 10}}')
    run = _run([sys.executable, str(ROOT / "main.py"), "fit", "--config", CONFIG, "--trainer.devices", "2",
                "--trainer.strategy", strategy, *_common(tmp_path, data_dir, tmp_path / "records"), *STALL])
    assert run.returncode != 0 and (tmp_path / "records/extra-forward-rank1").exists()
    lines = _rank_lines(run.stderr)
    # Whichever watchdog fires first stops the other rank, so that rank says "SIGTERM during validate" or
    # "no progress in validate": both name the phase.
    assert sorted(lines) == [0, 1] and all(" validate" in line for line in lines.values()), lines
    assert "no progress in validate" in "".join(lines.values()) and "Traceback" not in run.stderr


def test_sigterm_ends_every_rank_of_a_hung_run_with_one_line(tmp_path, data_dir):
    """The same hang under the default timeout (30 min): SIGTERM to rank 0 alone (the rehearsal's launching process)
    ends it and the rank it launched, each with one line, status 143."""
    run = _start(_rehearsal(*_common(tmp_path, data_dir, tmp_path / "records"), *STALL), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (tmp_path / "records/extra-forward-rank1").exists() and run.poll() is None:
        assert time.monotonic() < deadline, "the run never reached its validation"
        time.sleep(0.5)
    time.sleep(2)  # rank 1 is inside the extra forward, rank 0 in the metric sync
    run.send_signal(signal.SIGTERM)
    [(_, stderr)] = _finish(run, timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    lines = _rank_lines(stderr)
    assert lines == {rank: f"error: rank {rank}: SIGTERM during validate: stopped" for rank in (0, 1)}, stderr[-3000:]


def test_a_frozen_rank_ends_the_run_in_one_line_and_does_not_outlive_it(tmp_path, data_dir):
    """SIGSTOP on rank 1 (the process rank 0 launched) once it trains: rank 0's watchdog ends the run after
    collective_timeout with one line, and stops rank 1 first, which a SIGTERM alone cannot (it is frozen)."""
    strategy = ('{"class_path": "swax_lightning.training.strategy.FSDP2Strategy", '
                '"init_args": {"collective_timeout": 10}}')
    run = _start([sys.executable, str(ROOT / "main.py"), "fit", "--config", CONFIG, "--trainer.devices", "2",
                  "--trainer.strategy", strategy, *_common(tmp_path, data_dir, tmp_path / "records"),
                  "--trainer.max_steps", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not list((tmp_path / "records").glob("rank1-pid*.json")) and run.poll() is None:
        assert time.monotonic() < deadline, "rank 1 never trained"
        time.sleep(0.2)
    [record] = (tmp_path / "records").glob("rank1-pid*.json")
    rank1 = int(record.stem.split("pid")[1])
    os.kill(rank1, signal.SIGSTOP)
    [(_, stderr)] = _finish(run, timeout=120)
    assert run.returncode == 1 and "error: rank 0: no progress in train" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr
    stat = Path(f"/proc/{rank1}/stat")
    state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else "gone"
    assert state in ("gone", "Z"), f"rank 1 is left in state {state}"  # Z: ended, waiting for a reaper


def test_torchrun_with_fewer_processes_than_devices_is_one_clear_line(tmp_path, data_dir):
    """Each rank checks its world before any collective and says why in one line. torchrun stops the other rank as
    soon as the first one exits, so the second copy of the line may or may not make it out: one or two copies, never
    a traceback."""
    run = _run(_torchrun(1, 0, _free_port(), "fit", "--config", CONFIG, "--trainer.devices", "4",
                         "--trainer.strategy", "fsdp2", *_common(tmp_path, data_dir, tmp_path / "records")))
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    expected = {"error: trainer.devices (4) x trainer.num_nodes (1) = 4 ranks, but the launcher "
                "(TorchElasticEnvironment) started 2 processes: set devices and num_nodes to what it starts "
                "(e.g. torchrun --nproc-per-node = devices, --nnodes = num_nodes)"}
    assert set(errors) == expected, run.stderr[-3000:]
    assert len(errors) in (1, 2), errors
    assert "[rank0]: Traceback" not in run.stderr
