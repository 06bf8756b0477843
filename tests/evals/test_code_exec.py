"""The MBPP executor: right and wrong programs, programs that stop before their tests, programs that hunt for the
run's token (the runner's module, the caller's frames, gc, /proc/self, every descriptor) and then stop, and each
hostile program (kill the evaluator, read its environment, write outside the folder, open sockets, leave children
behind, fork without bound); as root, generated code runs as nobody; MBPP's few-shot examples are the harness's task
ids 2, 3, 4 and pass their own tests."""
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
def test_a_program_that_steals_the_token_fails(where):
    """The earlier executor kept its sentinel in the runner's module, where each of these found it and passed
    without running a test; now no token exists in the child until its tests have run."""
    assert not passes("def add(a, b):\n    return 0\n" + THIEVES[where] + REPORT, TESTS)


@pytest.mark.xfail(strict=True, reason="documented limit: a program written against this harness can imitate the "
                                       "runner's end-of-run exchange instead of passing its tests")
def test_a_program_that_imitates_the_runner_fails():
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
