"""The DVC project's description, light enough for any command to read (no torch): where
every file lives (`paths.py`), each stage's declaration (`specs.py`) and the list of stages
(`stage_list.py`), the folders params name (`folders.py`), which numbers go to which metrics
file (`metric_files.py`), `-S` overrides of params.yaml (`overrides.py`), each stage's code
dependencies (`imports.py`), dvc.yaml's titled plots (`titled_plots.py`), and the runs a
repository records (`experiments.py`) and whether one reproduced the committed outputs
(`reproduction.py`). What runs inside one stage process is in `rlhf/stages/support/`; what
generates dvc.yaml by importing every stage is above the stages, `rlhf/dvcfile.py`."""
