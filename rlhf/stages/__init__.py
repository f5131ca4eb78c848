"""Pipeline stages: each reads params and inputs, calls the library, writes outputs atomically.

One module per stage, each declaring itself once in its SPEC (params groups, inputs, outputs;
`support/specs.py`); dvc.yaml is generated from those (`rlhf dvc-yaml`) with each stage's
code dependencies computed from its imports. What the stages share lives in `support/`.
"""
