"""Watchdog: a rank of a sharded run that waits on the others too long, or gets SIGTERM, ends with one line naming its
rank and phase instead of hanging.

Under FSDP2 every forward needs every rank (its all-gathers), and metric syncs, barriers and checkpoints are
collectives too: a rank that stops, or takes another path, leaves the others blocked in a collective for good.
FSDP2Strategy (strategy.py) starts one Watchdog per process and reports progress (`beat`) when each step it runs
(training, backward, optimizer, validation, test, predict) starts and ends.

Decisions:
- A thread, not the collective's own timeout: a rank blocked in a collective does not return to Python until that
  timeout (gloo then raises; NCCL's own watchdog tears the process down), so only another thread can end it with one
  line, and at a time of our choosing. With no
  beat for `timeout` seconds while watching, it writes `error: rank R: no progress in <phase> for T s ...` to stderr
  and ends the process with status 1 (os._exit: the main thread is stuck, so nothing else could run), after stopping
  the processes it launched (`on_end`, as for SIGTERM below: a frozen child rank would outlive it).
- Watching is on inside Lightning's loops (train, sanity_check, validate, test, predict), from the first step on, and
  off before it (start-up, data preparation, checksums, checkpoint loading: bounded by the process group's own
  timeout, which FSDP2Strategy sets a minute longer), after teardown, and on rank 0 during the evaluation suite
  (`rest("suite")`): the suite has no collective and may run for hours (NIAH at 131k tokens), so it is never cut
  short. The other ranks leave once the unsharded copy is gathered; nothing waits for rank 0, so a rank 0 that dies
  in the suite leaves nobody hanging.
- SIGTERM: Lightning's handler sets a flag its loops read between batches, so a rank blocked in a collective never
  stopped (`timeout` without -k). Python's C-level handler writes the signal number to a wakeup fd even while the
  main thread is blocked, and the thread reads it: `error: rank R: SIGTERM during <phase>`, status 143 (128 + 15),
  after passing SIGTERM on to the processes this one launched (`on_end`: Lightning's launcher, on rank 0). Forked
  children (data loader workers) drop the wakeup fd, so their own SIGTERM (the loader stopping them) is not taken for
  this process's.
- A collective that fails instead of hanging (gloo sees the connection to a rank that ended close; NCCL raises
  DistError) is the same event seen from another rank: FSDP2Strategy.on_exception ends that rank with one line too
  (`collective_failure` tells such errors from bugs, which keep their traceback).
- Leaving cleanly: FSDP2Strategy's teardown ends with a pause of RELEASE_WAIT_S, the GIL free
  (`let_collectives_go`), so that the process group's worker threads drop the tensors of the last collectives while
  the interpreter can still take them. The device mesh and FSDP's state keep the group alive past Lightning's
  destroy_process_group, so its workers outlive it; one that drops a finished collective's Python tensors during
  interpreter shutdown asks for the GIL then, and the process aborts (SIGABRT, "terminate called without an active
  exception"; torch 2.13 on Python 3.11, an open upstream bug, pytorch/pytorch#190489). A CI run saw it on a test
  rank leaving right after the evaluation gather (3 gloo ranks on 2 cores, rank 0 in the suite). A pause makes the
  release all but certain, not certain: nothing tells when the workers are done, and only dropping every reference to
  the group (the model's included) would join them. tests/gloo_leave.py measures it with and without the pause.
"""
from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

RELEASE_WAIT_S = 0.5  # the pause before a rank leaves, for the process group's workers (module docstring)
POLL_S = 1.0  # how often the thread looks at the clock; a timeout fires at most this late
SIGTERM_STATUS = 128 + signal.SIGTERM
_forked_children_forget_wakeup = False


class Watchdog:
    """Ends this process when watching and no beat came for `timeout` seconds, or on SIGTERM (module docstring).

    Args:
        rank: Global rank, named in the line.
        timeout: Seconds without a beat that end the process.
        on_end: Called before the process ends, on SIGTERM or a timeout (e.g. stop the processes it launched: a
            frozen child rank would outlive it).
    """

    def __init__(self, rank: int, timeout: float, on_end: Callable[[], None] = lambda: None):
        self.rank, self.timeout, self.on_end = rank, timeout, on_end
        self.phase, self.watching, self._last_beat = "setup", False, time.monotonic()
        self._ending = threading.Lock()  # taken for good by the first caller of `end`
        self._wakeup_read, self._wakeup_write = os.pipe()
        for fd in (self._wakeup_read, self._wakeup_write):
            os.set_blocking(fd, False)

    def start(self) -> None:
        """From the main thread: SIGTERM goes through the wakeup fd, and the watching thread starts."""
        if not callable(signal.getsignal(signal.SIGTERM)):  # Python writes to the wakeup fd only for its handlers
            signal.signal(signal.SIGTERM, _left_to_the_watchdog)
        signal.set_wakeup_fd(self._wakeup_write, warn_on_full_buffer=False)
        _make_forked_children_forget_the_wakeup_fd()
        threading.Thread(target=self._watch, name="swax-watchdog", daemon=True).start()

    def beat(self, phase: str) -> None:
        """Progress in `phase` (train, validate, ...): watching, with the clock restarted."""
        self.phase, self._last_beat, self.watching = phase, time.monotonic(), True

    def rest(self, phase: str) -> None:
        """Not watching from here (until the next beat); `phase` names what the process does meanwhile."""
        self.phase, self.watching = phase, False

    def end(self, status: int, message: str, first: Callable[[], None] = lambda: None) -> None:
        """Runs `first`, writes `error: rank R: message` to stderr and ends the process at once with `status`. Only
        the first caller does: another one (the main thread seeing a collective fail while the SIGTERM of this rank
        is passed on and awaited) waits for it."""
        self._ending.acquire()
        first()
        os.write(2, f"error: rank {self.rank}: {message}\n".encode())
        os._exit(status)

    def _watch(self) -> None:
        while True:
            ready, _, _ = select.select([self._wakeup_read], [], [], POLL_S)
            if ready and signal.SIGTERM in os.read(self._wakeup_read, 512):
                self.end(SIGTERM_STATUS, f"SIGTERM during {self.phase}: stopped", first=self.on_end)
            idle = time.monotonic() - self._last_beat
            if self.watching and idle >= self.timeout:
                self.end(1, f"no progress in {self.phase} for {idle:.0f} s: a collective is waiting for a rank that "
                            f"stopped or took another path; stopped (FSDP2Strategy.collective_timeout = "
                            f"{self.timeout:g} s)", first=self.on_end)


def collective_failure(error: BaseException) -> str | None:
    """The reason, if `error` (or an error it was raised from) is a collective that failed because of another rank
    (DistError, or gloo's RuntimeError, whose message starts with its source file); None for any other error."""
    while error is not None:
        message = str(error)
        if isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and message.startswith("[")
                                                   and "gloo" in message.split("]")[0]):
            return message.split("] ", 1)[-1].split(". ")[0]
        error = error.__cause__ or error.__context__
    return None


def _left_to_the_watchdog(signum, frame) -> None:
    """SIGTERM's Python handler: the watchdog's thread acts on it (through the wakeup fd), this does nothing."""


def _make_forked_children_forget_the_wakeup_fd() -> None:
    global _forked_children_forget_wakeup
    if not _forked_children_forget_wakeup:
        os.register_at_fork(after_in_child=_forget_wakeup_fd)
        _forked_children_forget_wakeup = True


def _forget_wakeup_fd() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from another thread than the main one: that child is not a Python main program
        pass


def let_collectives_go(seconds: float = RELEASE_WAIT_S) -> None:
    """Before a rank leaves: sleep (the GIL free) while the process group's worker threads let go of the finished
    collectives' tensors, which they can only do before interpreter shutdown (module docstring)."""
    time.sleep(seconds)
