"""rlhf: InstructGPT's recipe as a library and the pipeline built on it.

The library, by role: `models/`, `tokenizer/`, `data/`, `sampling/`, `algorithms/`, `train/`,
`eval/` and `synthetic/` (with `params/`, the schema of params.yaml). It knows nothing of
where files live. `project/` describes the DVC project (paths, stage declarations, metrics
files), `stages/` reads and writes the pipeline's files around library calls, `flows/` chains
the stages as Prefect flows, `dvcfile.py` generates dvc.yaml from them and `cli/` is the `rlhf`
command: dependencies point that way only.
"""
