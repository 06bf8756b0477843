"""Running generated code against its tests (MBPP pass@1): the tests stay in the trusted process, the code runs in a
contained child that never sees them.

The verdict is computed here, never in the child. The tests (MBPP's `assert f(x) == y` lines) are parsed in this
process: every call of the program's functions in an assert (a call of a name that is no builtin, with literal
arguments) becomes a slot, the rest of the assert a condition over the slots (`set(_v0) == set([1, 2])`,
`math.isclose(_v1, 3.0, rel_tol=0.001)`). The child (a fresh `python -I`, stripped environment) receives only the
program and the calls (function name and arguments), runs the program, makes the calls, and writes their results back
in a plain JSON form (tuples, sets, dicts and the like tagged; anything else is a failure); the conditions are then
evaluated here, on plain values, with this process's own builtins. So the code under test never sees an expected
value, and nothing it does in its own process (an `__eq__` that is always true, patched builtins, bytecode patched
through ctypes, a trace function that jumps over the asserts, a message written from atexit, a thread or an
except hook) can make a wrong result pass: whatever it writes is read as data, and the only values that satisfy the
conditions are the right ones. A program passes iff it runs to its end, every call returns, and every condition
holds, before the timeout. A test that is no assert of this form (a call with non-literal arguments, any other
statement but an import) is refused with one line naming it (UnsupportedTest), never run in the child.

Containment, when the kernel lets an unprivileged process make namespaces (probed once with `unshare`):
- new user, mount, network, IPC and PID namespaces: no network at all (only a down loopback, no abstract sockets of
  the host); System V shared memory, semaphores and message queues of its own, gone with it; the child sees only its
  own processes, so it can neither signal the evaluator nor read its environment through /proc/<pid>/environ;
- a minimal root: a fresh tmpfs holding read-only binds of /usr and the interpreter's prefix (and the machine's
  /bin, /lib links), /dev/null, /dev/zero, /dev/urandom, its own /proc and a writable /tmp (its working folder), then
  chroot: no file of the host outside those (no unix socket of the host to connect to, no data or test file to read)
  and nothing written anywhere that outlives the run;
- all capabilities dropped before the program runs, so it cannot undo the mounts or leave the root;
- when the namespace's first process ends, the kernel kills every process left in it, even ones that left the
  process group with setsid().
Always: its own session and process group, killed as a group at the timeout and after every run; limits on CPU
seconds, address space (1 GiB), file size (16 MiB), core dumps and processes (RLIMIT_NPROC: 64 more than the user
already runs). An evaluator running as root runs the program as the user nobody (the kernel exempts root from
RLIMIT_NPROC, and root's files would be the program's to read); where nobody cannot run the interpreter it refuses,
with one line, rather than run generated code as root.

Documented limits: without user namespaces (probed; e.g. some container runtimes) there is no network or filesystem
isolation and children that call setsid() escape the group kill: run untrusted models' code in a container then. A
program that raises after its functions are defined could still send their (right) results from an exit hook: it
passes with right functions, where MBPP's own harness would fail it for the raise.
"""
from __future__ import annotations

import ast
import builtins
import functools
import json
import math
import os
import pwd
import resource  # imported here: the child, already nobody, may not read the standard library
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from swax_lightning.evals import plain_values
from swax_lightning.evals.plain_values import from_plain, to_plain

ADDRESS_SPACE = 1 << 30
FILE_SIZE = 16 << 20
EXTRA_PROCESSES = 64
RESULT_BYTES = 4 << 20  # the most the child may write back
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


class UnsupportedTest(ValueError):
    """A test this executor cannot run without handing it to the code under test."""


# ---- the tests, parsed and judged in this process --------------------------------------------------------------------
@dataclass
class Checks:
    """The tests of one problem: the calls the child makes (function name, positional and keyword arguments as plain
    values) and the asserts' conditions over their results (slots _v0, _v1, ...), compiled here."""

    calls: list[tuple[str, list, dict]]
    conditions: list  # code objects of `eval` mode
    imports: list[str]  # the tests' own import lines, run here before the conditions

    def hold(self, results: list) -> bool:
        namespace = {"__builtins__": builtins, "math": math}
        for line in self.imports:
            exec(line, namespace)  # the dataset's own imports (trusted)
        values = {f"_v{i}": value for i, value in enumerate(results)}
        try:
            return all(bool(eval(condition, namespace, values)) for condition in self.conditions)
        except Exception:  # noqa: BLE001  a failing condition (a wrong type, a wrong shape) is a failing test
            return False


class _Slots(ast.NodeTransformer):
    """Replaces each call of a non-builtin name with literal arguments by a slot, recording the call."""

    def __init__(self, calls: list):
        self.calls = calls

    def visit_Call(self, node: ast.Call):
        if not isinstance(node.func, ast.Name) or hasattr(builtins, node.func.id):
            return self.generic_visit(node)  # set(...), sorted(...), math.isclose(...): judged here
        try:
            if any(k.arg is None for k in node.keywords):
                raise ValueError("**")
            args = to_plain(tuple(ast.literal_eval(a) for a in node.args))
            kwargs = to_plain({k.arg: ast.literal_eval(k.value) for k in node.keywords})
        except (ValueError, TypeError, SyntaxError):
            raise UnsupportedTest(f"{ast.unparse(node)}: arguments must be literals") from None
        self.calls.append((node.func.id, args, kwargs))
        return ast.copy_location(ast.Name(f"_v{len(self.calls) - 1}", ast.Load()), node)


def parse_tests(tests: str) -> Checks:
    """The asserts of `tests` as calls and conditions; UnsupportedTest names a statement that is neither an assert
    nor an import."""
    try:
        tree = ast.parse(tests)
    except SyntaxError as err:
        raise UnsupportedTest(f"the tests do not parse: {err}") from None
    calls, conditions, imports = [], [], []
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(statement))
        elif isinstance(statement, ast.Assert):
            condition = ast.fix_missing_locations(ast.Expression(_Slots(calls).visit(statement.test)))
            conditions.append(compile(condition, "<tests>", "eval"))
        else:
            raise UnsupportedTest(f"{ast.unparse(statement)[:80]}: only asserts and imports are tests")
    return Checks(calls, conditions, imports)


# Runs in the child, after plain_values.py's source: read the request (its length, a newline, JSON {source, calls}),
# keep a private copy of the evaluator's pipe, point stdin/stdout/stderr at /dev/null, run the program, make the calls;
# only then write the results (each {"value": plain} or {"error": type}) as one JSON line.
RUNNER = """
import json, os
size = b""
while not size.endswith(b"\\n"):
    size += os.read(0, 1)
request, size = b"", int(size)
while len(request) < size:
    request += os.read(0, size - len(request))
request = json.loads(request)
out = os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def call(namespace, name, args, kwargs):
    try:
        return {"value": to_plain(namespace[name](*from_plain(args), **from_plain(kwargs)))}
    except BaseException as err:
        return {"error": type(err).__name__}

namespace = {"__name__": "__main__"}
exec(compile(request["source"], "candidate.py", "exec"), namespace)
results = [call(namespace, *c) for c in request["calls"]]
os.write(out, json.dumps(results).encode() + b"\\n")
"""
CHILD = Path(plain_values.__file__).read_text() + RUNNER  # one definition of the plain form on both sides

# Runs first inside the namespaces (as root of the new user namespace), in the evaluator's fresh folder: a tmpfs
# over it becomes the new root, read-only once made, with read-only binds of /usr and the interpreter's prefix ($1),
# the machine's /bin, /lib... (as links where they are links), three devices, its own /proc and a tmpfs on /tmp,
# the only place to write; then the program,
# chrooted there and without any capability, as a child: the shell stays the namespace's init, so the program gets
# ordinary signal semantics, and every process left in the namespace dies when the shell ends.
SANDBOX = """
PATH=/usr/sbin:/usr/bin:/sbin:/bin
prefix=$1; shift
root=$PWD
mount -t tmpfs -o size=64m,mode=755 tmpfs "$root" && cd "$root" || exit 111
bind() { mkdir -p "$root$1" && mount --bind "$1" "$root$1" && mount -o remount,bind,ro "$root$1"; }
for d in /usr "$prefix"; do bind "$d" || exit 111; done
for l in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$l" ]; then ln -sfn "$(readlink "/$l")" "$root/$l"; elif [ -d "/$l" ]; then bind "/$l" || exit 111; fi
done
mkdir -p "$root/dev" "$root/proc" "$root/tmp" || exit 111
for f in null zero urandom; do : > "$root/dev/$f" && mount --bind "/dev/$f" "$root/dev/$f" || exit 111; done
mount -t proc proc "$root/proc" && mount -t tmpfs -o size=64m,mode=1777 tmpfs "$root/tmp" || exit 111
mount -o remount,bind,ro "$root" || exit 111
chroot "$root" env -C /tmp setpriv --bounding-set=-all --inh-caps=-all --no-new-privs "$@"
"""
# The program needs the standard library only: the base interpreter (outside any venv), by its real path.
INTERPRETER = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
NAMESPACES = ["--user", "--map-root-user", "--mount", "--net", "--ipc", "--pid", "--fork", "--kill-child",
              "--mount-proc"]
PROBE = ("import os\n"
         "assert not os.path.exists('/root') and not os.path.exists('/etc') and os.getcwd() == '/tmp'\n"
         "try:\n    open('/probe', 'w')\nexcept OSError:\n    pass\nelse:\n    raise SystemExit(1)\n")


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
                return os.path.realpath(interpreter), ids
        except (OSError, subprocess.TimeoutExpired):
            pass
    raise RuntimeError(f"code_exec: the evaluator runs as root and the user nobody can run neither {INTERPRETER} "
                       f"nor a python3 on {ENV['PATH']}; run the evaluator as an ordinary user")


def _prefix(interpreter: str) -> str:
    """The folder above the interpreter's bin/: its standard library lies beneath it."""
    return os.path.dirname(os.path.dirname(interpreter))


@functools.cache
def sandbox_prefix() -> tuple[str, ...]:
    """The command that puts a program in the namespaces and its minimal root, or () when this machine cannot."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not (unshare and setpriv and shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin")):
        return ()
    interpreter, user = run_as()
    prefix = (unshare, *NAMESPACES, "sh", "-c", SANDBOX, "sandbox", _prefix(interpreter))
    try:
        with tempfile.TemporaryDirectory() as folder:
            if user:
                os.chown(folder, user["user"], user["group"])
            probe = subprocess.run([*prefix, interpreter, "-I", "-c", PROBE], capture_output=True, timeout=30,
                                   env=ENV, cwd=folder, **user)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return prefix if probe.returncode == 0 else ()


def isolated() -> bool:
    """Whether generated code runs in the namespaces (no network, a minimal read-only root, own PID and IPC space)."""
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
    """The first line the child writes (without its newline), or None at end of file, past the deadline or past
    RESULT_BYTES."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > RESULT_BYTES or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


def _results(child: subprocess.Popen, request: bytes, calls: int, deadline: float) -> list | None:
    """Send the request; the calls' results as plain values, or None unless the child wrote exactly one well-formed
    line of `calls` results, every one a value, and exited with 0, all before the deadline."""
    try:
        child.stdin.write(b"%d\n" % len(request) + request)
        child.stdin.close()
        written = _read_line(child.stdout.fileno(), deadline)
        if written is None or child.wait(timeout=max(0.0, deadline - time.monotonic())) != 0:
            return None
        results = json.loads(written)
        if not (isinstance(results, list) and len(results) == calls and all(
                isinstance(r, dict) and set(r) == {"value"} for r in results)):
            return None
        return [from_plain(r["value"]) for r in results]
    except (OSError, subprocess.TimeoutExpired, ValueError, RecursionError, MemoryError, TypeError):
        return None


def passes(program: str, tests: str, timeout: float = 10.0) -> bool:
    """True iff `program` runs to its end and every assert of `tests` holds on the results of its functions, within
    the timeout. UnsupportedTest: a test this executor cannot judge here (see the module's docstring)."""
    checks = parse_tests(tests)
    deadline = time.monotonic() + timeout
    interpreter, user = run_as()
    command = [*sandbox_prefix(), interpreter, "-I", "-c", CHILD]
    processes = _user_processes(user.get("user", os.getuid())) + EXTRA_PROCESSES
    request = json.dumps({"source": program, "calls": checks.calls}).encode()
    with tempfile.TemporaryDirectory() as folder:
        if user:
            os.chown(folder, user["user"], user["group"])
        child = subprocess.Popen(command, cwd=folder, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True, **user,
                                 preexec_fn=lambda: _limits(int(timeout) + 1, processes))
        try:
            results = _results(child, request, len(checks.calls), deadline)
        finally:
            _kill_group(child.pid)  # leftovers too: a run never leaves processes behind
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if not pipe.closed:
                    pipe.close()
    return results is not None and checks.hold(results)


def pass_at_1(references, predictions) -> float:
    """lm-evaluation-harness metric: share of problems whose first candidate passes its tests.
    references: tests per problem (a string of asserts, or a list of them); predictions: code, or a list of
    candidates, per problem."""
    if isinstance(references, str):
        references = [references]
    if isinstance(predictions, str) or (predictions and isinstance(predictions[0], str)):
        predictions = [[p] for p in ([predictions] if isinstance(predictions, str) else predictions)]
    results = [_judged(candidates[0], tests) for tests, candidates in zip(references, predictions)]
    return sum(results) / len(results)


def _judged(program: str, tests: str) -> bool:
    """passes(), with a test this executor cannot judge counted as failed and said on stderr (the harness's metric
    must not stop a whole run for one problem)."""
    try:
        return passes(program, tests)
    except UnsupportedTest as err:
        print(f"code_exec: a test not judged, counted as failed: {err}", file=sys.stderr)
        return False
