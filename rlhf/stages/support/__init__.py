"""What the stages share: the skeleton of a model stage (`context.py`, `fitting.py`), the
declarations and paths (`specs.py`, `paths.py`), publishing outputs at once (`outputs.py`,
`metric_files.py`), how a run starts and ends (`entry.py`, `launch.py`), the folders params
name (`folders.py`), the scorers params name (`scoring.py`), and dvc.yaml's generator
(`dvcfile.py`, from each stage's imports, `imports.py`)."""
