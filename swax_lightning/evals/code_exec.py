"""Running generated code against its tests (MBPP pass@1), in a separate, limited process.

Each candidate program and its assert-tests run in a fresh `python -I` (isolated mode: no user site, no PYTHON*
variables, no cwd on sys.path) in an empty temporary folder, with a stripped environment, a wall-clock timeout and
resource limits (CPU seconds, 1 GiB address space, 16 MiB files, no core dumps). That keeps a bad program from hanging
or filling the host; it is not a security sandbox against hostile code (no network or filesystem namespace): run
untrusted models' code in a container.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def _limits(cpu_seconds: int) -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def passes(program: str, tests: str, timeout: float = 10.0) -> bool:
    """True iff `program` followed by `tests` (assert statements) exits cleanly within the timeout."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "candidate.py"
        path.write_text(f"{program}\n\n{tests}\n")
        try:
            result = subprocess.run([sys.executable, "-I", str(path)], cwd=folder, capture_output=True,
                                    timeout=timeout, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                    preexec_fn=lambda: _limits(int(timeout) + 1), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0


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
