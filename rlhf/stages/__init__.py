"""Pipeline stages: each reads params and inputs, calls the library, writes outputs atomically.

`specs.py` declares every stage once (params groups, inputs, outputs); dvc.yaml is generated
from it (`rlhf dvc-yaml`) with each stage's code dependencies computed from its imports.
"""
