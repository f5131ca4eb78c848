"""rlhf: InstructGPT's recipe as a library and the pipeline built on it.

The library, by role: `models/`, `data/`, `sampling/`, `algorithms/`, `train/`, `eval/` and
`synthetic/` (with `params.py`, the schema of params.yaml). It knows nothing of where files
live. `stages/` reads and writes the pipeline's files around library calls, `flows/` chains
the stages as Prefect flows and `cli/` is the `rlhf` command: dependencies point that way
only.
"""
