"""The file formats `rlhf import` reads, by name, with what their rows hold: the CLI's choices
and help come from here without importing the importers (and pyarrow) at startup; each name
is one entry of `importers.IMPORTERS`, which a test checks."""

from __future__ import annotations

FORMATS: dict[str, str] = {
    "sft": "prompt, response (reference optional)",
    "gsm8k": "question, answer ending in '#### N' (N becomes the reference)",
    "qa": "prompt (or question), answer (the reference too)",
    "pairwise": "prompt, chosen, rejected",
    "hh": "Anthropic HH-RLHF transcripts (chosen, rejected)",
    "ranked": "prompt, responses [{text, rank}]",
    "ultrafeedback": "prompt (or instruction), completions [{response, overall_score}]",
    "label-studio": "the JSON export of a List + Ranker project",
}
