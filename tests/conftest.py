"""Test-wide setup. Triton kernels run on CPU tensors through the Triton interpreter, which must be switched on before
triton is first imported (docs/design.md section 5). The interpreter is a process-wide switch: the GPU tests need it
off (`TRITON_INTERPRET=0 pytest -m gpu`, as benchmarks/gpu_check.sh runs them) and skip themselves while it is on."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The folders a user's commands write in the checkout. No test may write there (a test that ran `main.py fit` in
# the checkout once refused to start after the README's own first command had left runs/tiny/w64): each runs its
# commands in a temporary folder, and the session fails if any of these changed.
CHECKOUT = Path(__file__).resolve().parents[1]
USER_FOLDERS = ("runs", "data", "exports")


def _user_files() -> dict[str, tuple[int, int]]:
    out = {}
    for folder in USER_FOLDERS:
        for path in sorted((CHECKOUT / folder).rglob("*")) if (CHECKOUT / folder).is_dir() else ():
            stat = path.lstat()
            out[str(path.relative_to(CHECKOUT))] = (stat.st_size, stat.st_mtime_ns)
    return out


def pytest_sessionstart(session):
    session.config._user_files = _user_files()


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, "workerinput", None) is not None:
        return
    before, after = session.config._user_files, _user_files()
    changed = sorted(set(before) ^ set(after) | {p for p in set(before) & set(after) if before[p] != after[p]})
    if changed:
        session.config.get_terminal_writer().line(
            f"tests wrote in the checkout's {', '.join(USER_FOLDERS)}/ (each test must use a temporary folder): "
            f"{', '.join(changed[:10])}{' ...' if len(changed) > 10 else ''}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
