"""`python -m trainguard.worker train.py ARGS`: the shim (trainguard.worker.shim)."""

from trainguard.worker.shim import main

main()
