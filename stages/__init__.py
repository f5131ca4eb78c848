"""Pipeline stages: each reads params and inputs, calls `rlhf`, writes outputs atomically."""
