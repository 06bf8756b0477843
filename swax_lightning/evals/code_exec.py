"""Running generated code against its tests (MBPP pass@1) in a contained child process.

A candidate passes iff its program and its assert-tests run to the end. The child (a fresh `python -I`, isolated
mode, stripped environment) reads the source from stdin, moves its own ends of the evaluator's pipes to two private
descriptors, points stdin, stdout and stderr at /dev/null and executes the source. Only when that returns does it
ask for the run's token; the evaluator writes the token into the pipe only then, and the child must echo it back and
exit with 0. So no token exists anywhere in the child (its memory, its modules, its frames, its files, /proc/self,
its environment, its command line) while the program runs: a program that reads `sys.modules['__main__']`, walks its
caller's frames, scans gc objects or /proc/self/mem finds nothing, and one that calls exit(), sys.exit(0) or
os._exit(0) before its asserts never asks. Documented limit: a program written against this very harness can still
imitate the end-of-run exchange on those descriptors (or override equality) instead of passing its tests; running
the tests in the program's own process cannot rule that out, and the harness's code_eval shares the limit.

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
already runs). An evaluator running as root runs the program as the user nobody (the kernel exempts root from
RLIMIT_NPROC, and root's files would be the program's to read); where nobody cannot run the interpreter it refuses,
with one line, rather than run generated code as root.

Documented limits: without user namespaces (probed; e.g. some container runtimes) there is no network or filesystem
isolation and children that call setsid() escape the group kill: run untrusted models' code in a container then.
"""
from __future__ import annotations

import functools
import os
import pwd
import resource  # imported here: the child, already nobody, may not read the standard library
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ADDRESS_SPACE = 1 << 30
FILE_SIZE = 16 << 20
EXTRA_PROCESSES = 64
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

# Runs in the child: read the source (its length, a newline, the bytes), keep private copies of the evaluator's
# pipes, point stdin/stdout/stderr at /dev/null, run the source; only then ask for the token and echo it.
RUNNER = """
import os
size = b""
while not size.endswith(b"\\n"):
    size += os.read(0, 1)
source, size = b"", int(size)
while len(source) < size:
    source += os.read(0, size - len(source))
answer, ask = os.dup(0), os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
exec(compile(source, "candidate.py", "exec"), {"__name__": "__main__"})
os.write(ask, b"ran\\n")
os.write(ask, os.read(answer, 64))
"""
TOKEN_BYTES = 16

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
def run_as() -> tuple[str, dict]:
    """(interpreter, Popen's user, group and extra_groups) for generated code: the evaluator's own when it is not
    root; as root, the user nobody with the first of the base interpreter and the system's python3 that nobody can
    run (an interpreter under /root is out of its reach), or a refusal in one line."""
    if os.geteuid() != 0:
        return INTERPRETER, {}
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        raise RuntimeError("code_exec: the evaluator runs as root and this machine has no user 'nobody' to run "
                           "generated code as; run the evaluator as an ordinary user") from None
    ids = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    for interpreter in dict.fromkeys([INTERPRETER, shutil.which("python3", path=ENV["PATH"])]):
        try:
            if interpreter and subprocess.run([interpreter, "-I", "-c", "import json"], capture_output=True,
                                              timeout=30, env=ENV, cwd="/", **ids).returncode == 0:
                return interpreter, ids
        except (OSError, subprocess.TimeoutExpired):
            pass
    raise RuntimeError(f"code_exec: the evaluator runs as root and the user nobody can run neither {INTERPRETER} "
                       f"nor a python3 on {ENV['PATH']}; run the evaluator as an ordinary user")


@functools.cache
def sandbox_prefix() -> tuple[str, ...]:
    """The command that puts a program in the namespaces, or () when this machine cannot make them."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not (unshare and setpriv):
        return ()
    prefix = (unshare, *NAMESPACES, "sh", "-c", SANDBOX, "sandbox")
    try:
        probe = subprocess.run([*prefix, "sh", "-c", "touch /probe 2>/dev/null && exit 1; exit 0"],
                               capture_output=True, timeout=30, env=ENV, cwd="/", **run_as()[1])
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return prefix if probe.returncode == 0 else ()


def isolated() -> bool:
    """Whether generated code runs in the namespaces (no network, read-only filesystem, own PID space)."""
    return bool(sandbox_prefix())


def _user_processes(uid: int) -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _limits(cpu_seconds: int, processes: int) -> None:  # runs in the child before exec, after any change of user
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


def _read_line(fd: int, deadline: float) -> bytes | None:
    """One line from fd (without its newline), or None at end of file, past the deadline or past 256 bytes."""
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or len(line) > 256 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        line += chunk
    return line[:-1]


def _exchange(child: subprocess.Popen, source: bytes, deadline: float) -> bool:
    """Send the source; answer the child's request with a fresh token only when it comes; true iff the token comes
    back and the child exits with 0, all before the deadline."""
    token = secrets.token_hex(TOKEN_BYTES).encode()
    try:
        child.stdin.write(b"%d\n" % len(source) + source)
        child.stdin.flush()
        if _read_line(child.stdout.fileno(), deadline) != b"ran":
            return False
        child.stdin.write(token + b"\n")
        child.stdin.close()
        echoed = _read_line(child.stdout.fileno(), deadline)
        return echoed == token and child.wait(timeout=max(0.0, deadline - time.monotonic())) == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def passes(program: str, tests: str, timeout: float = 10.0) -> bool:
    """True iff `program` followed by `tests` (assert statements) runs to its end, within the timeout."""
    deadline = time.monotonic() + timeout
    interpreter, user = run_as()
    command = [*sandbox_prefix(), interpreter, "-I", "-c", RUNNER]
    processes = _user_processes(user.get("user", os.getuid())) + EXTRA_PROCESSES
    with tempfile.TemporaryDirectory() as folder:
        if user:
            os.chown(folder, user["user"], user["group"])
        child = subprocess.Popen(command, cwd=folder, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True, **user,
                                 preexec_fn=lambda: _limits(int(timeout) + 1, processes))
        try:
            return _exchange(child, f"{program}\n\n{tests}\n".encode(), deadline)
        finally:
            _kill_group(child.pid)  # leftovers too: a run never leaves processes behind
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if not pipe.closed:
                    pipe.close()


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
