"""Training machinery every gradient-trained stage shares: the resumable loop, the optimizer
and its schedule, device and precision."""
