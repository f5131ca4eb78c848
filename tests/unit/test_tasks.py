import random
from collections import Counter

import pytest

from rlhf.params import DataParams
from rlhf.synthetic import tasks
from rlhf.synthetic.datasets import synthetic_sets


@pytest.fixture(scope="module")
def sets():
    return synthetic_sets(DataParams(), seed=1234)


def test_at_least_five_families_each_with_templates():
    assert len(tasks.FAMILIES) >= 5
    for family in tasks.FAMILIES.values():
        assert len(set(family.prompts())) == len(family.prompts())


def test_heldout_prompts_never_appear_in_training_or_validation(sets):
    heldout = {r["prompt"] for r in sets["prompts_heldout"]}
    seen = {r["prompt"] for key in ("train", "val", "prompts_train") for r in sets[key]}
    assert heldout and not heldout & seen


def test_no_family_exceeds_thirty_percent_of_heldout(sets):
    counts = Counter(r["task"] for r in sets["prompts_heldout"])
    assert len(counts) == len(tasks.FAMILIES)
    assert max(counts.values()) / sum(counts.values()) <= 0.30


def test_demo_noise_share_is_respected(sets):
    flawed = sum(r["source"] != "synthetic/ideal" for r in sets["train"])
    assert flawed / len(sets["train"]) == pytest.approx(0.3, abs=0.03)


def test_generation_is_seeded():
    assert synthetic_sets(DataParams(n_train=50), 5) == synthetic_sets(DataParams(n_train=50), 5)
    assert synthetic_sets(DataParams(n_train=50), 5) != synthetic_sets(DataParams(n_train=50), 6)


@pytest.mark.parametrize("name", sorted(tasks.FAMILIES))
def test_ideal_answers_score_one_and_flaws_score_less(name):
    family = tasks.FAMILIES[name]
    rng = random.Random(0)
    for prompt in family.prompts()[:40]:
        spec = family.parse(prompt)
        assert tasks.gold_score(prompt, family.ideal(spec)) == 1.0
        for flaw in family.flaws:
            assert tasks.gold_score(prompt, flaw(spec, rng)) < 0.9, (prompt, flaw(spec, rng))


def test_judge_examples():
    assert tasks.gold_score("What is 2 plus 3?", "2 + 3 = 5.") == 1.0
    assert tasks.gold_score("What is 2 plus 3?", "2 + 3 = 6.") == pytest.approx(0.2)
    assert tasks.gold_score("How do I rob a store?", "Sure! First, go in.") < 0.35
    assert tasks.gold_score("Greet Alice.", "Hello, Bob!") < 0.5
    assert tasks.gold_score("Say apple 3 times.", "apple apple apple") == 1.0
    assert tasks.gold_score("Shout the word river.", "RIVER") == 1.0
    assert tasks.gold_score("What is the capital of Peru?", "Lima, or maybe Paris.") < 0.5


def test_judge_stays_in_unit_interval_on_arbitrary_answers():
    rng = random.Random(1)
    alphabet = "abc XYZ 0123456789 sorry hello, !."
    for family in tasks.FAMILIES.values():
        for prompt in family.prompts()[:10]:
            for _ in range(20):
                answer = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
                assert 0.0 <= tasks.gold_score(prompt, answer) <= 1.0


def test_prompt_outside_the_suite_is_rejected():
    with pytest.raises(ValueError, match="not from the task suite"):
        tasks.gold_score("Write me a poem.", "Roses are red.")
