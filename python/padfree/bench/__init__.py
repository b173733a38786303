"""`padfree bench`'s measurements (the command itself is padfree.commands.bench).

timing: CUDA-event medians, the GEMM floor, kernel profiles, the host's speed; measure: one process's
rows; processes: one child process per system, merged; report: the printed table and its targets.
"""
