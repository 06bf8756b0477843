"""The MBPP executor: the tests parsed into calls and conditions judged in this process; right and wrong programs;
programs that stop before their tests; programs that hunt for anything to send back (the runner's module, the
caller's frames, gc, /proc/self, every descriptor) and then stop; the wrong programs that passed the executor that
ran the asserts inside the program's process (an `__eq__` always true, patched builtins, bytecode patched through
ctypes, a trace function jumping over the asserts, a success message sent from atexit, a thread or an except hook);
each hostile program (kill the evaluator, read its environment or a file of the host, write outside its folder,
open sockets, connect to a unix socket of the host, leave System V shared memory or children behind, fork without
bound), with canaries that must stay untouched; as root, generated code runs as nobody; MBPP's few-shot examples are
the harness's task ids 2, 3, 4 and pass their own tests."""
import json
import os
import socket
import time
from pathlib import Path

import pytest

from swax_lightning.evals import code_exec
from swax_lightning.evals.code_exec import isolated, pass_at_1, passes

TESTS = "assert add(2, 3) == 5\nassert add(0, 0) == 0"
ADD = "def add(a, b):\n    return a + b"
needs_namespaces = pytest.mark.skipif(not isolated(), reason="no user namespaces here: the documented limit")


def test_right_and_wrong_programs():
    assert passes(ADD, TESTS)
    assert not passes("def add(a, b):\n    return a * b", TESTS)
    assert not passes("def add(a, b) return", TESTS)                        # syntax error
    assert not passes("x = bytearray(4 << 30)", "", timeout=5)               # over the memory limit
    assert not passes("import os\nassert 'HOME' in os.environ", "")          # stripped environment
    assert passes(ADD + "\nprint('noise')\nimport sys\nprint('more', file=sys.stderr)", TESTS)  # output is fine
    assert pass_at_1([TESTS, TESTS], [[ADD], ["def add(a, b): return 0"]]) == 0.5


@pytest.mark.parametrize("stop", ["exit()", "import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit",
                                  "quit()", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
def test_stopping_before_the_tests_is_a_failure(stop):
    assert not passes(f"def add(a, b):\n    return 0\n{stop}", TESTS)


# Each thief collects every string that could be the run's token, writes each one, framed by newlines, to stdout (the
# earlier executor's check: the last output line) and to every other descriptor, and stops before its tests.
REPORT = """
import os, re, sys
found = set(re.findall(r"[0-9a-f]{32}", " ".join(map(str, loot))))
for token in found:
    for fd in range(1, 32):
        try:
            os.write(fd, ("\\n" + token + "\\n").encode())
        except OSError:
            pass
sys.stdout.flush()
os._exit(0)
"""
THIEVES = {
    "the runner's module": "import sys\nm = sys.modules['__main__']\nloot = [getattr(m, k) for k in dir(m)]\n",
    "the caller's frames": ("import sys\nloot, f = [], sys._getframe()\nwhile f:\n"
                            "    loot += list(f.f_locals.values()) + list(f.f_globals.values())\n    f = f.f_back\n"),
    "gc objects": ("import gc\nloot = [o for o in gc.get_objects() if isinstance(o, (str, bytes, dict, list, tuple))]\n"
                   "loot += [o.decode(errors='replace') for o in loot if isinstance(o, bytes)]\n"),
    "/proc/self": ("import os, re\nloot = []\nfor name in ('environ', 'cmdline', 'fd/0'):\n    try:\n"
                   "        loot.append(open(f'/proc/self/{name}', 'rb').read().decode(errors='replace'))\n"
                   "    except OSError:\n        pass\n"
                   "mem = open('/proc/self/mem', 'rb')\n"
                   "for line in open('/proc/self/maps'):\n    span, perms = line.split()[:2]\n"
                   "    start, end = (int(x, 16) for x in span.split('-'))\n"
                   "    if perms[0] == 'r' and end - start < 1 << 26:\n        try:\n"
                   "            mem.seek(start)\n            loot.append(mem.read(end - start).decode('latin-1'))\n"
                   "        except (OSError, ValueError, OverflowError):\n            pass\n"),
    "every readable descriptor": ("import os, select\nloot = []\nfor fd in range(0, 32):\n    try:\n"
                                  "        if select.select([fd], [], [], 0.2)[0]:\n"
                                  "            loot.append(os.read(fd, 4096).decode(errors='replace'))\n"
                                  "    except (OSError, ValueError):\n        pass\n"),
}


@pytest.mark.parametrize("where", sorted(THIEVES))
def test_a_program_that_hunts_for_something_to_send_back_fails(where):
    """An executor once kept its sentinel in the runner's module, where each of these found it and passed without
    running a test; now the child holds nothing that could pass: the verdict is computed here."""
    assert not passes("def add(a, b):\n    return 0\n" + THIEVES[where] + REPORT, TESTS)


def test_a_program_that_imitates_the_earlier_runner_fails():
    """The earlier executor's documented limit: it passed this program, which imitates its end-of-run exchange."""
    imitator = ("import os, select\nfor fd in range(3, 16):\n    try:\n        os.write(fd, b'ran\\n')\n"
                "    except OSError:\n        pass\nfor fd in range(3, 16):\n    try:\n"
                "        if select.select([fd], [], [], 1)[0]:\n            token = os.read(fd, 64)\n"
                "            for out in range(3, 16):\n                try:\n"
                "                    os.write(out, token)\n                except OSError:\n"
                "                    pass\n            os._exit(0)\n    except OSError:\n        pass\n")
    assert not passes("def add(a, b):\n    return 0\n" + imitator, TESTS)


@pytest.mark.skipif(os.geteuid() != 0, reason="the evaluator is not root here")
def test_as_root_generated_code_runs_as_nobody():
    """Inside a user namespace the program is root of that namespace: the uid it maps to outside is what counts."""
    outside = ("import os\nuid = os.getuid()\nif uid == 0:\n"
               "    uid = int(open('/proc/self/uid_map').read().split()[1])\nassert uid == %d, uid\n")
    assert passes(outside % __import__("pwd").getpwnam("nobody").pw_uid, "")


@pytest.fixture
def fresh_run_as():
    """run_as() is cached per process: decided afresh under the test's patches, and again after them."""
    code_exec.run_as.cache_clear()
    yield
    code_exec.run_as.cache_clear()


def test_root_without_a_user_to_drop_to_is_refused(monkeypatch, fresh_run_as):
    monkeypatch.setattr(code_exec.os, "geteuid", lambda: 0)
    monkeypatch.setattr(code_exec.pwd, "getpwnam", lambda name: (_ for _ in ()).throw(KeyError(name)))
    with pytest.raises(RuntimeError, match="runs as root and this machine has no user 'nobody'"):
        passes(ADD, TESTS)


@pytest.mark.skipif(os.geteuid() != 0, reason="the evaluator is not root here")
def test_root_with_no_interpreter_nobody_can_run_is_refused(monkeypatch, fresh_run_as):
    monkeypatch.setattr(code_exec, "INTERPRETER", "/nonexistent/python3")
    monkeypatch.setitem(code_exec.ENV, "PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="nobody can run neither /nonexistent/python3"):
        passes(ADD, TESTS)


def test_an_endless_program_is_stopped_at_the_timeout():
    start = time.monotonic()
    assert not passes("while True:\n    pass", TESTS, timeout=2)
    assert time.monotonic() - start < 6


@needs_namespaces
def test_it_cannot_kill_the_evaluator():
    # its parent is the sandbox's own init, which ignores the signal: the program runs on and its tests pass
    assert passes("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + ADD, TESTS)
    killer = ("import os, signal\nfor pid in set(range(1, 4000)) - {os.getpid()}:\n"
              "    try: os.kill(pid, signal.SIGKILL)\n    except OSError: pass\n")
    assert passes(killer + ADD, TESTS)  # it sees no process but its own: it harms nothing and runs to its end
    assert passes(ADD, TESTS)  # and this process is still here to say so


@needs_namespaces
def test_it_cannot_read_the_evaluators_environment(monkeypatch):
    monkeypatch.setenv("SWAX_EVALUATOR_SECRET", "hunter2")
    reader = ("import os\nfound = []\nfor pid in [os.getppid(), 1, *os.listdir('/proc')]:\n    try:\n"
              "        found.append(b'hunter2' in open(f'/proc/{pid}/environ', 'rb').read())\n"
              "    except (OSError, ValueError):\n        pass\nassert not any(found)\n")
    assert passes(reader, "")


@needs_namespaces
def test_it_cannot_write_outside_its_folder(tmp_path):
    targets = [tmp_path / "escaped.txt", Path(__file__).parent / "escaped.txt", Path("/var/tmp/swax_escaped.txt"),
               Path("/dev/shm/swax_escaped.txt")]
    writer = "".join(f"try:\n    open({str(t)!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for t in targets)
    assert passes(writer + "open('scratch.txt', 'w').write('own folder is fine')\n", "")
    assert not any(t.exists() for t in targets)


@needs_namespaces
def test_it_has_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    client = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).send(b'x')\n"
              f"    raise SystemExit(3)\nexcept OSError:\n    pass\n")
    assert passes(client, "")
    with pytest.raises(BlockingIOError):
        server.accept()  # nobody connected
    server.close()


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            pass
    return found


@needs_namespaces
def test_no_child_survives_the_timeout():
    marker = f"swax-leftover-{os.getpid()}"
    forker = ("import os, time\nfor _ in range(10):\n    if os.fork() == 0:\n        os.setsid()\n"
              f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 60 # {marker}'])\nwhile True:\n    time.sleep(1)\n")
    assert not passes(forker, "", timeout=2)
    time.sleep(0.5)
    assert _processes_with(marker) == []


def test_process_count_is_limited():
    checker = ("import resource\nsoft, hard = resource.getrlimit(resource.RLIMIT_NPROC)\n"
               "assert 0 < soft < 100000 and soft == hard\n")
    assert passes(checker, "")


def test_a_fork_bomb_is_stopped():
    """Also when the evaluator is root: the program then runs as nobody, whom RLIMIT_NPROC binds."""
    bomb = "import os\nkids = 0\nfor _ in range(500):\n    if os.fork() == 0:\n        os._exit(0)\n    kids += 1\n"
    assert not passes(bomb, "", timeout=10)


def test_mbpp_fewshot_examples_are_the_harness_task_ids():
    from swax_lightning.evals.lm_eval_tasks.utils import fewshot_samples

    rows = fewshot_samples()
    assert [r["task_id"] for r in rows] == [2, 3, 4]
    assert all(passes(r["code"], "\n".join(r["test_list"])) for r in rows)  # the reference solutions pass
    assert json.loads(json.dumps(rows)) == rows


# ---- the tests stay here -------------------------------------------------------------------------------------------
def test_the_tests_become_calls_and_conditions_judged_here():
    checks = code_exec.parse_tests("import math\nassert set(f([1, 2], k=3)) == set([1])\n"
                                   "assert math.isclose(g(-1.5), 2.0, rel_tol=0.01)\nassert not h((1, 'a'))")
    assert checks.calls == [("f", {"tuple": [[1, 2]]}, {"dict": [["k", 3]]}), ("g", {"tuple": [-1.5]}, {"dict": []}),
                            ("h", {"tuple": [{"tuple": [1, "a"]}]}, {"dict": []})]
    assert checks.hold([[1], 2.01, 0]) and not checks.hold([[1, 2], 2.01, 0]) and not checks.hold([[1], 2.5, 0])
    assert not checks.hold([None, 2.0, 0])  # a condition that raises (set(None)) fails


@pytest.mark.parametrize("tests,match", [("assert f(x) == 1", "arguments must be literals"),
                                         ("assert f(g(1)) == 1", "arguments must be literals"),
                                         ("x = 1\nassert f(x) == 1", "only asserts and imports"),
                                         ("assert f(1) ==", "do not parse")])
def test_a_test_that_cannot_be_judged_here_is_one_line(tests, match):
    with pytest.raises(code_exec.UnsupportedTest, match=match):
        passes("def f(x): return x", tests)
    assert pass_at_1([tests], [["def f(x): return x"]]) == 0.0  # the harness's metric counts it failed


def test_values_cross_in_their_plain_form_only():
    program = "def f():\n    return (1, {2: b'x'}, {3}, frozenset([4]), 1 + 2j, float('inf'), [None, True, 'y'])\n"
    assert passes(program, "assert f() == (1, {2: b'x'}, {3}, frozenset([4]), 1 + 2j, float('inf'), [None, True, 'y'])")
    assert not passes(program.replace("(1,", "[1,").replace("'y'])", "'y']]"),  # a list is no tuple
                      "assert f() == (1, {2: b'x'}, {3}, frozenset([4]), 1 + 2j, float('inf'), [None, True, 'y'])")
    assert not passes("def f():\n    return object()", "assert f() is not None")  # no plain form: a failure


# Wrong programs that try to make their tests pass anyway (issue 37 item 2 lists the kinds that passed the executor
# which ran the asserts inside the program's process: the first three passed it on these tests).
ALWAYS_EQUAL = "class Yes:\n    def __eq__(self, other):\n        return True\n"
SET_TESTS = "assert set([add(1, 2)]) == set([3])\nassert sorted([add(2, 2), 0]) == [0, 4]"
WRONG = {
    "an __eq__ that is always true": (ALWAYS_EQUAL + "def add(a, b):\n    return Yes()\n", TESTS),
    "an int whose __eq__ is always true": ("class Yes(int):\n    def __eq__(self, other):\n        return True\n"
                                           "    __hash__ = int.__hash__\ndef add(a, b):\n    return Yes(7)\n", TESTS),
    "builtins patched": ("import builtins\nbuiltins.set = lambda *a: 1\nbuiltins.sorted = lambda *a: [0, 4]\n"
                         "def add(a, b):\n    return a * b\n", SET_TESTS),
    "code objects overwritten through ctypes": (
        "import ctypes, sys\ndef add(a, b):\n    return 0\nf = sys._getframe()\nwhile f:\n"
        "    code = f.f_code.co_code\n    try:\n"
        "        ctypes.memset(id(code) + bytes.__basicsize__ - 1, 9, len(code))\n"
        "    except Exception:\n        pass\n    f = f.f_back\n", TESTS),
    "a trace function moving the caller's line": (
        "import sys\ndef add(a, b):\n    return 0\ndef jump(frame, event, arg):\n    if event == 'line':\n"
        "        try:\n            frame.f_lineno = frame.f_code.co_firstlineno\n"
        "        except (ValueError, AttributeError):\n            pass\n    return jump\nsys.settrace(jump)\n"
        "caller = sys._getframe().f_back\nif caller:\n    caller.f_trace = jump\n", TESTS),
    "a success message from atexit": (
        "import atexit, os\ndef add(a, b):\n    return 0\ndef fake():\n    for fd in range(1, 16):\n"
        "        try:\n            os.write(fd, b'ran\\n[{\"value\": true}, {\"value\": true}]\\n')\n"
        "        except OSError:\n            pass\natexit.register(fake)\nraise SystemExit\n", TESTS),
    "a success message from a thread": (
        "import os, threading, time\ndef add(a, b):\n    return 0\ndef fake():\n    time.sleep(0.2)\n"
        "    for fd in range(1, 16):\n        try:\n            os.write(fd, b'[{\"value\": 1}, {\"value\": 1}]\\n')\n"
        "        except OSError:\n            pass\nthreading.Thread(target=fake).start()\n", TESTS),
    "a success message from an except hook after a failed assert": (
        "import os, sys\ndef add(a, b):\n    return 0\ndef hook(*args):\n    for fd in range(1, 16):\n"
        "        try:\n            os.write(fd, b'[{\"value\": 1}, {\"value\": 1}]\\n')\n"
        "        except OSError:\n            pass\n    os._exit(0)\nsys.excepthook = hook\n"
        "assert add(2, 3) == 5\n", TESTS),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_program_never_passes(name):
    program, tests = WRONG[name]
    assert not passes(program, tests)
    assert passes(ADD, tests)  # the same tests pass a right program


# ---- escapes, with canaries ------------------------------------------------------------------------------------------
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmget.restype = ctypes.c_int\n"


def _segments() -> set[str]:
    """The System V shared-memory segments this machine's IPC namespace holds (their ids)."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {line.split()[1] for line in lines}


@needs_namespaces
def test_shared_memory_neither_outlives_the_run_nor_reaches_a_canary_segment():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5A000000 + os.getpid() % 0xFFFF
    canary = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    assert canary >= 0
    try:
        before = _segments()
        grabber = LIBC + (f"seg = libc.shmget(0, 64 << 20, 0o1000 | 0o600)\nassert seg >= 0\n"  # IPC_PRIVATE, 64 MiB
                          f"libc.shmat.restype = ctypes.c_void_p\n"
                          f"ctypes.memset(libc.shmat(seg, None, 0), 1, 64 << 20)\n"
                          f"theirs = libc.shmget({key}, 0, 0)\nassert theirs < 0\n")  # the canary's key: not there
        assert passes(grabber + ADD, TESTS)
        assert _segments() == before  # its 64 MiB segment went with its IPC namespace
        assert libc.shmget(key, 0, 0) == canary  # the canary is still there
    finally:
        libc.shmctl(canary, 0, None)  # IPC_RMID


@needs_namespaces
def test_no_unix_socket_of_the_host_is_reachable():
    """A socket file outside /tmp (the earlier sandbox hid only /tmp, /var/tmp and /dev/shm: this one was reachable
    through its read-only mounts) and an abstract one."""
    path = Path(__file__).parent / f".canary-{os.getpid()}.sock"
    named, abstract = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    named.bind(str(path))
    path.chmod(0o777)  # anyone may connect (as to a desktop session's or a container runtime's socket)
    abstract.bind(f"\0swax-canary-{os.getpid()}")
    for canary in (named, abstract):
        canary.listen()
        canary.setblocking(False)
    client = ("import socket\nfor address in ({!r}, {!r}):\n    s = socket.socket(socket.AF_UNIX)\n    try:\n"
              "        s.connect(address)\n        raise SystemExit(3)\n    except OSError:\n        pass\n")
    assert passes(client.format(str(path), f"\0swax-canary-{os.getpid()}") + ADD, TESTS)
    try:
        for canary in (named, abstract):
            with pytest.raises(BlockingIOError):
                canary.accept()  # nobody connected
    finally:
        named.close(), abstract.close(), path.unlink()


@needs_namespaces
def test_no_file_of_the_host_is_readable(tmp_path):
    """The minimal root holds /usr, the interpreter and three devices: not the data a program could look answers up
    in (this test file, the lm-eval task files), nor the evaluator's folders."""
    answers = tmp_path / "answers.json"
    answers.write_text("[5, 0]")
    reader = "".join(f"import os\nassert not os.path.exists({str(p)!r})\n"
                     for p in (answers, Path(__file__), Path.home(), Path("/etc/passwd")))
    assert passes(reader + ADD, TESTS)
