"""Test-wide setup. Triton kernels run on CPU tensors through the Triton interpreter, which must be switched on before
triton is first imported (docs/design.md section 5). The interpreter is a process-wide switch: the GPU tests need it
off (`TRITON_INTERPRET=0 pytest -m gpu`, as benchmarks/gpu_check.sh runs them) and skip themselves while it is on."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
