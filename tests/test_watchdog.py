"""The watchdog (swax_lightning/training/watchdog.py) in a process of its own: no beat for `timeout` while watching
ends the process with one line naming the rank and the phase; resting (the evaluation suite) is never cut; SIGTERM
ends a process whose main thread is blocked in C code (as in a collective), with one line and status 143; a forked
child's SIGTERM is not taken for the parent's. The same inside real sharded runs: tests/test_distributed.py."""
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from swax_lightning.training.watchdog import SIGTERM_STATUS, collective_failure

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from swax_lightning.training.watchdog import Watchdog

    mode, timeout = sys.argv[1], float(sys.argv[2])
    dog = Watchdog(rank=3, timeout=timeout)
    dog.start()
    dog.beat("validate")
    if mode == "stops":
        time.sleep(60)
    elif mode == "rests":
        dog.rest("suite")
        time.sleep(3 * timeout)
    elif mode == "blocked":
        read_end, _ = os.pipe()
        print("blocked", flush=True)
        os.read(read_end, 1)  # nobody writes: the main thread waits in C, as in a collective
    elif mode == "forks":
        child = os.fork()
        if child == 0:
            signal.pause()  # until the parent's SIGTERM, which the inherited Python handler ignores
            os._exit(0)
        time.sleep(0.5)
        os.kill(child, signal.SIGTERM)
        os.waitpid(child, 0)
        dog.rest("done")
        time.sleep(2)  # time for the watchdog to (wrongly) take the child's SIGTERM for its own
""")


def _watched(mode: str, timeout: float = 1.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, mode, str(timeout)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_no_beat_for_the_timeout_ends_the_process_with_one_line():
    process = _watched("stops")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert err == ("error: rank 3: no progress in validate for 1 s: a collective is waiting for a rank that stopped "
                   "or took another path; stopped (FSDP2Strategy.collective_timeout = 1 s)\n")


def test_a_resting_process_is_never_ended():
    process = _watched("rests")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and err == ""


def test_sigterm_ends_a_process_blocked_in_c_with_one_line():
    process = _watched("blocked", timeout=3600)
    assert process.stdout.readline() == "blocked\n"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == SIGTERM_STATUS == 143
    assert err == "error: rank 3: SIGTERM during validate: stopped\n"


def test_a_forked_childs_sigterm_is_not_the_parents():
    process = _watched("forks", timeout=3600)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and err == "", err


GLOO_CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:51936. This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize("error,reason", [
    (RuntimeError(GLOO_CLOSED), "Connection closed by peer [127.0.0.1]:51936"),
    (dist.DistBackendError("NCCL communicator was aborted. Rank 1"), "NCCL communicator was aborted"),
    (RuntimeError("[model.py:12] shapes do not match"), None),
    (ValueError("bad value"), None)])
def test_collective_failures_are_told_from_bugs(error, reason):
    assert collective_failure(error) == reason
    try:
        raise ValueError("wrapped") from error
    except ValueError as wrapped:
        assert collective_failure(wrapped) == reason
