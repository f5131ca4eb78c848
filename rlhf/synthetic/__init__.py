"""The synthetic task suite: prompts and demonstrations, the gold judge that plays the human
labeler, and simulated labelers that rank answers with human-like disagreement."""
