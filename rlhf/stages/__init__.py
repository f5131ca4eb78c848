"""Pipeline stages: each reads params and inputs, calls the library, writes outputs atomically.

One module per stage, each declaring itself once in its SPEC (params groups, inputs, outputs;
`rlhf/project/specs.py`); dvc.yaml is generated from those (`rlhf dvc-yaml`, `rlhf/dvcfile.py`)
with each stage's code dependencies computed from its imports. What runs inside every stage
process lives in `support/`.
"""
