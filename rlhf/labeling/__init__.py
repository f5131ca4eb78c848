"""People ranking sampled answers: the labeling queue, the rankings they type, and how far
labelers agree (InstructGPT's comparison data, gathered in the terminal)."""
