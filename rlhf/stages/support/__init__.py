"""What runs inside one stage process: the skeleton of a model stage (`context.py`,
`fitting.py`, `trained.py`), publishing its outputs at once (`outputs.py`), the scorers params
name (`scoring.py`), the console (`common.py`), and how a run starts and ends (`entry.py`,
`launch.py`). The project's description the stages are declared with is `rlhf/project/`."""
