"""Every shell command in the code blocks of README.md and of the pages under docs/, run as a user types it.

- The commands are the fenced blocks tagged bash, sh, shell or console, README.md first, then the docs pages in
  alphabetical order, each in its order; a line ending in `\\` continues on the next, `#` comment lines are dropped.
  A command added to a page later is run without any change here.
- They run with bash, one after the other, in one scratch folder that links every file and folder of the repository
  (so `runs/` and `data/` land there) and whose `.venv` is the environment running the tests. They share
  that folder as a user's commands share the repository: the fit prepares the one data folder and writes the
  checkpoint that the test, generate and compare commands read.
- Two documented kinds of change, nothing else (REPLACED, SHORTENED): `bash setup.sh ...` is dropped, alone or before
  `&&` (the environment running the tests is the set-up one: nothing is installed from inside the tests), and a
  command that would run long gets arguments appended to the end of it (later arguments win), e.g. fit stops after
  2 steps.
- A block opts out only with the line `<!-- readme-test: skip <reason> -->` right before its opening fence; a
  marker without a reason fails the test.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
SKIP_MARKER = re.compile(r"<!--\s*readme-test:\s*skip\b(.*?)-->")
# Not linked into the scratch folder: version control, the environment (replaced) and what runs write.
NOT_LINKED = {".git", ".venv", "runs", "data", "__pycache__", ".pytest_cache", "lightning_logs"}

DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
# (pattern, replacement, why)
REPLACED = [(r"^bash setup\.sh[^&;]*(&&\s*|$)", "", "the environment running the tests is already set up")]
# (pattern a command contains, arguments appended): each run cut to a few seconds.
SHORTENED = [
    (r"main\.py fit\b", ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
                         "--trainer.limit_val_batches", "1", "--data.batch_size", "2",
                         "--trainer.enable_progress_bar", "false"]),
    (r"main\.py (test|validate)\b", ["--trainer.limit_test_batches", "1", "--trainer.limit_val_batches", "1",
                                     "--data.batch_size", "2", "--trainer.enable_progress_bar", "false",
                                     "--eval.niah.tasks", "[niah_single_1]", "--eval.niah.lengths", "[512]",
                                     "--eval.niah.samples", "1", "--eval.niah.depths", "1",
                                     "--eval.babilong.tasks", "[qa1]",
                                     "--eval.babilong.lengths", "[0]", "--eval.babilong.samples", "1",
                                     "--eval.perplexity.length", "256", "--eval.perplexity.samples", "1",
                                     "--eval.niah.max_new_tokens", "8"]),
    (r"main\.py predict\b", ["--model.generation.max_new_tokens", "8", "--trainer.enable_progress_bar", "false"]),
    (r"swax_lightning generate\b", ["--max_new_tokens", "8"]),
]


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    commands: list[str]
    skip_reason: str | None


def readme_blocks(text: str) -> list[Block]:
    """The shell code blocks of a README, each with its commands and its opt-out reason (None: it runs)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"\s*```\s*(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        if fence[1] in SHELL_LANGUAGES:
            marker = SKIP_MARKER.search(lines[i - 1]) if i else None
            blocks.append(Block(i + 1, _commands(lines[i + 1:end]), marker[1].strip() if marker else None))
        i = end + 1
    return blocks


def _commands(lines: list[str]) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in lines:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
        else:
            commands.append(current.strip())
            current = ""
    return commands


def as_run_here(command: str) -> str:
    """The command with the documented replacements and, where it would run long, its arguments appended."""
    for pattern, replacement, _ in REPLACED:
        command = re.sub(pattern, replacement, command)
    for pattern, extra in SHORTENED:
        if re.search(pattern, command):
            assert not re.search(r"&&|;|\|", command), f"cannot append arguments to a compound command: {command}"
            command += " " + shlex.join(extra)
    return command


def scratch_repository(folder: Path) -> Path:
    """A folder that looks like a set-up checkout: links to the repository's entries, and `.venv` the environment
    running the tests (a link to it when it is a virtual environment, so `.venv/bin/<tool>` works too; else a
    `.venv/bin/python` that runs this interpreter)."""
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (folder / entry.name).symlink_to(entry)
    if sys.prefix != sys.base_prefix:
        (folder / ".venv").symlink_to(sys.prefix)
    else:
        python = folder / ".venv/bin/python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        python.chmod(0o755)
    return folder


def test_readme_blocks_run_or_say_why_not():
    for document in DOCUMENTS:
        blocks = readme_blocks((ROOT / document).read_text())
        assert [b.line for b in blocks if b.skip_reason == ""] == [], f"{document}: a skip marker needs a reason"
    commands = [c for b in readme_blocks((ROOT / "README.md").read_text()) if b.skip_reason is None
                for c in b.commands]
    assert any("main.py fit" in c for c in commands) and any("main.py test" in c for c in commands)


def test_block_extraction():
    text = ("x\n```bash\n# a comment\npython a.py --x 1 \\\n    --y 2\n\npython b.py\n```\n"
            "<!-- readme-test: skip needs a cluster -->\n```bash\nsrun c\n```\n```python\nnot_shell()\n```\n")
    assert readme_blocks(text) == [Block(2, ["python a.py --x 1 --y 2", "python b.py"], None),
                                   Block(10, ["srun c"], "needs a cluster")]
    assert as_run_here("bash setup.sh eval && .venv/bin/python main.py fit -c x.yaml").startswith(
        ".venv/bin/python main.py fit -c x.yaml --trainer.max_steps 2 ")
    assert as_run_here("bash setup.sh hf    # optional group") == ""  # nothing is installed from the tests


@pytest.mark.slow
def test_readme_and_docs_commands_run_as_typed(tmp_path):
    workdir = scratch_repository(tmp_path)
    for document in DOCUMENTS:
        for block in (b for b in readme_blocks((ROOT / document).read_text()) if b.skip_reason is None):
            for command in filter(None, map(as_run_here, block.commands)):
                run = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True,
                                     timeout=300)
                assert run.returncode == 0, f"{document} line {block.line}: {command}\n{run.stderr[-3000:]}"
