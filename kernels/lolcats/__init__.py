"""LoLCATs' linearised attention (Zhang et al., arXiv 2410.10254): softmax over a terraced window of recent keys plus
Hedgehog linear attention over every earlier key. naive.py is the quadratic reference (full masks), chunk.py the
linear-time block form (O(T * window)) with the linear state in and out, and the decode read of one block."""
