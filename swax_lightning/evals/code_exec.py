"""Running generated code against its tests (MBPP pass@1) in a contained child process.

A candidate passes iff its program and its assert-tests run to the end: the child (a fresh `python -I`, isolated
mode, stripped environment) receives the source and a random sentinel on stdin, executes the source, and only then
writes the sentinel; the run passes iff the child exits with 0 and its last output line is the sentinel. A program
that calls exit(), sys.exit(0) or os._exit(0) before its asserts therefore fails (the harness records a result only
after the test program has run, for the same reason). The sentinel never appears in the program's text or in its
environment; a program written against this very harness could still dig it out of its interpreter's memory.

Containment, when the kernel lets an unprivileged process make namespaces (probed once with `unshare`):
- new user, mount, network and PID namespaces: no network at all (only a down loopback); the child sees only its
  own processes, so it can neither signal the evaluator (os.kill(os.getppid(), ...) finds no parent) nor read the
  evaluator's environment through /proc/<pid>/environ;
- every mount remounted read-only, with fresh private tmpfs on /tmp, /var/tmp and /dev/shm (the child's folder,
  gone when it ends): nothing is written anywhere else;
- all capabilities dropped before the program runs, so it cannot undo the mounts;
- when the namespace's first process ends, the kernel kills every process left in it, even ones that left the
  process group with setsid().
Always: its own session and process group, killed as a group at the timeout and after every run; limits on CPU
seconds, address space (1 GiB), file size (16 MiB), core dumps and processes (RLIMIT_NPROC: 64 more than the user
already runs).

Documented limits: without user namespaces (probed; e.g. some container runtimes) there is no network or filesystem
isolation and children that call setsid() escape the group kill: run untrusted models' code in a container then.
RLIMIT_NPROC does not bind an evaluator running as root (the kernel exempts root); the PID namespace still ends
every process at the end of the run.
"""
from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

ADDRESS_SPACE = 1 << 30
FILE_SIZE = 16 << 20
EXTRA_PROCESSES = 64
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

# Runs in the child: read {"sentinel", "source"} from stdin, close it, run the source, then print the sentinel.
RUNNER = """
import json, os, sys
job = json.loads(sys.stdin.read())
sys.stdin.close()
sentinel, write = job.pop("sentinel").encode(), os.write
exec(compile(job.pop("source"), "candidate.py", "exec"), {"__name__": "__main__"})
sys.stdout.flush()
write(1, b"\\n" + sentinel + b"\\n")
"""

# Runs first inside the namespaces (as root of the new user namespace): read-only mounts, private tmpfs folders,
# then the program without any capability, as a child: the shell stays the namespace's init, so the program gets
# ordinary signal semantics, and every process left in the namespace dies when the shell ends.
SANDBOX = """
awk '{print $2}' /proc/self/mounts | while read -r m; do mount -o remount,bind,ro "$m" 2>/dev/null; done
for d in /tmp /var/tmp /dev/shm; do
  case "$1" in "$d"/*) continue;; esac  # never hide the interpreter (a checkout or venv under /tmp)
  [ -d "$d" ] && mount -t tmpfs -o size=64m,mode=1777 tmpfs "$d"
done
cd /tmp || exit 111
setpriv --bounding-set=-all --inh-caps=-all --no-new-privs "$@"
"""
# The program needs the standard library only: the base interpreter (outside any venv), by its real path.
INTERPRETER = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
NAMESPACES = ["--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]


@functools.cache
def sandbox_prefix() -> tuple[str, ...]:
    """The command that puts a program in the namespaces, or () when this machine cannot make them."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not (unshare and setpriv):
        return ()
    prefix = (unshare, *NAMESPACES, "sh", "-c", SANDBOX, "sandbox")
    try:
        probe = subprocess.run([*prefix, "sh", "-c", "touch /probe 2>/dev/null && exit 1; exit 0"],
                               capture_output=True, timeout=30, env=ENV)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return prefix if probe.returncode == 0 else ()


def isolated() -> bool:
    """Whether generated code runs in the namespaces (no network, read-only filesystem, own PID space)."""
    return bool(sandbox_prefix())


def _user_processes() -> int:
    uid = os.getuid()
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _limits(cpu_seconds: int, processes: int) -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE, FILE_SIZE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def passes(program: str, tests: str, timeout: float = 10.0) -> bool:
    """True iff `program` followed by `tests` (assert statements) runs to its end, within the timeout."""
    sentinel = secrets.token_hex(16)
    job = json.dumps({"sentinel": sentinel, "source": f"{program}\n\n{tests}\n"})
    command = [*sandbox_prefix(), INTERPRETER, "-I", "-c", RUNNER]
    processes = _user_processes() + EXTRA_PROCESSES
    with tempfile.TemporaryDirectory() as folder:
        child = subprocess.Popen(command, cwd=folder, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=lambda: _limits(int(timeout) + 1, processes))
        try:
            out, _ = child.communicate(job.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        finally:
            _kill_group(child.pid)  # leftovers too: a run never leaves processes behind
            child.kill()
            child.wait()
    lines = out.decode("utf-8", errors="replace").rstrip("\n").split("\n")
    return child.returncode == 0 and lines[-1] == sentinel


def pass_at_1(references, predictions) -> float:
    """lm-evaluation-harness metric: share of problems whose first candidate passes its tests.
    references: tests per problem (a string of asserts, or a list of them); predictions: code, or a list of
    candidates, per problem."""
    if isinstance(references, str):
        references = [references]
    if isinstance(predictions, str) or (predictions and isinstance(predictions[0], str)):
        predictions = [[p] for p in ([predictions] if isinstance(predictions, str) else predictions)]
    results = [passes(candidates[0], tests) for tests, candidates in zip(references, predictions)]
    return sum(results) / len(results)
