"""Test-wide setup. Triton kernels run on CPU tensors through the Triton interpreter, which must be switched on before
triton is first imported (docs/design.md section 5)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
