"""The installed package works from any folder: the top-level kernels/ folder is imported as swax_lightning.kernels,
so a user's own `kernels/` package (or PyPI's `kernels`) cannot shadow it."""
import subprocess
import sys


def test_a_foreign_kernels_package_in_the_working_folder_does_not_shadow_ours(tmp_path):
    foreign = tmp_path / "kernels"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("raise ImportError('the user kernels package was imported')\n")
    code = ("import swax_lightning.model.model, swax_lightning.kernels as k, kernels; "
            "print(k.__file__); print(kernels.__file__)")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert "the user kernels package was imported" in run.stderr  # `import kernels` is the user's ...
    run = subprocess.run([sys.executable, "-c", code.replace(", kernels;", ";").rsplit(";", 1)[0]], cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr  # ... and ours does not need that name
    assert str(tmp_path) not in run.stdout
    help_ = subprocess.run([sys.executable, "-m", "swax_lightning", "generate", "--help"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert help_.returncode == 0, help_.stderr
