"""The registry of reward sources and judges: what each params key accepts, how a value is
read, and that every kind builds what scores for it."""

import pytest
import torch

from rlhf import reward_sources
from rlhf.algorithms.answer_check import EXTRACTORS
from rlhf.algorithms.rules import PAIR_RULES, RULES, shorter
from rlhf.algorithms.scorers import (
    BUILDERS,
    CheckScorer,
    EnsembleScorer,
    PairRuleJudge,
    PreferenceJudge,
    RuleScorer,
)
from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.summary import win_rates
from rlhf.eval.win_rates import compare_outcomes
from rlhf.params import ParamsError, parse_params
from rlhf.project.folders import tracked_folders
from rlhf.reward_sources import ENSEMBLE, JUDGES, KINDS, LABELER, REWARD, parse


def test_every_kind_but_the_gold_judge_and_people_has_a_builder():
    """A new kind without a builder would pass params and fail the stage that scores."""
    assert set(BUILDERS) == set(KINDS) - {"gold", "human"}
    assert tuple(RULES) == reward_sources.RULES
    assert tuple(PAIR_RULES) == reward_sources.PAIR_RULES
    assert tuple(EXTRACTORS) == reward_sources.CHECK_EXTRACTORS


def test_the_checker_scores_each_answer_against_its_prompts_reference():
    references = {"Compute 6 + 7.": "13", "Half of 3?": "1.5", "Greet Bob.": None}
    checker = CheckScorer(references, "last_number", format_reward=0.1)
    scores = checker(
        ["Compute 6 + 7.", "Compute 6 + 7.", "Compute 6 + 7.", "Half of 3?"],
        ["6 + 7 = 13.", "6 + 7 = 12.", "thirteen", "It is 1.50"],
    )
    assert scores.tolist() == pytest.approx([1.0, 0.1, 0.0, 1.0])  # right, format kept, none
    with pytest.raises(ValueError, match=r"no reference answer to check against for 'Greet Bob\.'"):
        checker(["Greet Bob."], ["Hello, Bob!"])


def test_an_ensemble_sums_a_checker_with_another_score_by_its_weights():
    """`rl.ensemble_reduce: weighted_sum`: a right final answer counts beside what the other
    member scores; `min` and `mean` reduce the same scores as they did."""
    prompts = ["Compute 6 + 7."] * 3
    answers = ["6 + 7 = 13.", "6 + 7 = 12.", "thirteen"]
    members = [
        RuleScorer(lambda p, a: -0.5 * len(a.split())),
        CheckScorer({prompts[0]: "13"}, "last_number"),
    ]
    # word counts 5, 5, 1 -> the rule's -2.5, -2.5, -0.5; the checker's 1, 0, 0
    summed = EnsembleScorer(members, "weighted_sum", weights=(0.5, 2.0))(prompts, answers)
    assert summed.tolist() == pytest.approx([-1.25 + 2.0, -1.25, -0.25])
    assert EnsembleScorer(members, "min")(prompts, answers).tolist() == [-2.5, -2.5, -0.5]
    assert EnsembleScorer(members, "mean")(prompts, answers).tolist() == [-0.75, -1.25, -0.25]
    with pytest.raises(ValueError, match="1 weights for 2 scorers"):
        EnsembleScorer(members, "weighted_sum", weights=(1.0,))(prompts, answers)


def test_ensemble_params_are_refused_where_they_cannot_mean_what_they_say():
    with pytest.raises(ParamsError, match=r"needs reward sources in rl\.ensemble \(rm:PATH"):
        parse_params({"rl": {"reward": "ensemble"}})
    summed = {"reward": "ensemble", "ensemble": ["rm:old.pt", "rule:contains_number"]}
    with pytest.raises(ParamsError, match=r"must hold 3 weights .* the reward model's, then one "
                       r"for each of the 2 rl.ensemble entries"):  # fmt: skip
        parse_params({"rl": summed | {"ensemble_reduce": "weighted_sum"}})
    with pytest.raises(ParamsError, match=r"rl.ensemble_weights = \[1.0, 2.0\] is read only by "
                       r"rl.ensemble_reduce: weighted_sum, not 'min'"):  # fmt: skip
        parse_params({"rl": summed | {"ensemble_weights": [1.0, 2.0]}})
    with pytest.raises(ParamsError, match=r"rl.ensemble: 'old.pt' is not 'rm:PATH'"):
        parse_params({"rl": {"reward": "ensemble", "ensemble": ["old.pt"]}})
    weighted = {"ensemble_reduce": "weighted_sum", "ensemble_weights": [1.0, 0.5, 2.0]}
    params = parse_params({"rl": summed | weighted})
    assert [(m.kind.name, m.argument) for m in params.ensemble()] == [
        ("checkpoint", "old.pt"),
        ("rule", "contains_number"),
    ]
    assert [str(f) for f in tracked_folders(params)["rl"]] == ["old.pt"]  # a DVC dep
    # a checker among them needs references, as the reward itself would
    checked = {"reward": "ensemble", "ensemble": ["check:last_number"]}
    with pytest.raises(ParamsError, match=r"rl.ensemble names 'check:last_number', whose "):
        parse_params({"rl": checked})
    add_only = parse_params({"rl": checked, "data": {"tasks": ["add"]}})
    assert add_only.checked() == [(ENSEMBLE, "check:last_number")]
    own_data = {"source": "files"}  # where no gold judge can score the prompts
    gold_member = {"reward": "ensemble", "ensemble": ["rule:gold"]}
    with pytest.raises(ParamsError, match=r"rl.ensemble: 'rule:gold' needs the task suite's gold "
                       r"judge.*remove it from rl.ensemble"):  # fmt: skip
        parse_params(
            {"rl": gold_member, "data": own_data, "collect": {"labeler": "human"},
             "evaluate": {"judges": ["rm"]}}
        )  # fmt: skip
    # entries are read only for `reward: ensemble`
    assert parse_params({"rl": {"ensemble": ["old.pt"]}}).ensemble() == []


def test_a_checker_on_tasks_whose_answers_it_cannot_read_is_refused_by_params():
    """Greetings have no reference, and no extractor reads a capital's: a checker there would
    score every answer 0."""
    with pytest.raises(ParamsError, match=r"rl.reward names 'check:last_number', whose extractor "
                       r"finds no right answer of the tasks greet, capital, repeat, refuse, "
                       r"uppercase in data.tasks: .* set data.tasks to \['add'\]"):  # fmt: skip
        parse_params({"rl": {"reward": "check:last_number"}})
    with pytest.raises(ParamsError, match=r"evaluate.judges names 'check:gsm8k'.*no task of the"):
        parse_params({"evaluate": {"judges": ["gold", "check:gsm8k"]}, "data": {"tasks": ["add"]}})
    fine = parse_params({"rl": {"reward": "check:last_number"}, "data": {"tasks": ["add"]}})
    assert fine.checked() == [(REWARD, "check:last_number")]
    own_data = {"source": "files"}  # whose prompts the stages check (`prompt_references`)
    judged = {"data": own_data, "collect": {"labeler": "human"}, "evaluate": {"judges": ["rm"]}}
    judged["evaluate"]["judges"].append("check:boxed")
    assert parse_params(judged).checked() == [(JUDGES, "check:boxed")]


def test_an_overlong_buffer_as_long_as_the_answers_is_refused():
    with pytest.raises(ParamsError, match=r"rl\.overlong_buffer = 32 must be smaller than "
                       r"rl\.max_new_tokens = 32"):  # fmt: skip
        parse_params({"rl": {"overlong_buffer": 32, "max_new_tokens": 32}})


@pytest.mark.parametrize(
    ("value", "key", "kind", "argument"),
    [
        ("rm", REWARD, "rm", None),
        ("hf: models/rm", REWARD, "hf", "models/rm"),
        ("hf:C:/weights", JUDGES, "hf", "C:/weights"),  # colons after the first are the path's
        ("rule: gold", REWARD, "rule", "gold"),
        ("ensemble", REWARD, "ensemble", None),
        ("rm:runs/old.pt", LABELER, "checkpoint", "runs/old.pt"),
        ("human", LABELER, "human", None),
        ("pairwise:rm", JUDGES, "pairwise_rm", None),
        ("pairwise: rule: shorter", JUDGES, "pairwise_rule", "shorter"),
        ("check: gsm8k", REWARD, "check", "gsm8k"),
        ("check:boxed", JUDGES, "check", "boxed"),
        ("rm:runs/old.pt", ENSEMBLE, "checkpoint", "runs/old.pt"),
        ("check:last_number", ENSEMBLE, "check", "last_number"),
        ("hf:models/rm", ENSEMBLE, "hf", "models/rm"),
    ],
)
def test_values_are_read_as_their_kind(value, key, kind, argument):
    source = parse(value, key)
    assert (source.kind.name, source.argument) == (kind, argument)


@pytest.mark.parametrize(
    ("value", "key", "message"),
    [
        ("gold", REWARD, "rl.reward = 'gold' is not 'rm', 'hf:DIR', 'ensemble', 'rule:NAME' or "
         "'check:EXTRACTOR'"),
        ("pairwise:rm", REWARD, "is not 'rm', 'hf:DIR', 'ensemble', 'rule:NAME' or "
         "'check:EXTRACTOR'"),
        (" rm", JUDGES, "is not 'gold', 'rm', 'hf:DIR', 'rule:NAME', 'check:EXTRACTOR', "
         "'pairwise:rm' or 'pairwise:"),
        ("check:regex", REWARD, "names no extractor; the extractors are 'check:last_number', "
         "'check:gsm8k', 'check:boxed'"),
        ("hf:", LABELER, "collect.labeler = 'hf:' is not 'gold', 'human', 'rm:PATH', 'hf:DIR' or "
         "'check:EXTRACTOR'"),
        ("gold:x", JUDGES, "evaluate.judges: 'gold:x' is not 'gold'"),
        ("pairwise:rule:longer", JUDGES, "names no pairwise rule; the pairwise rules are "
         "'pairwise:rule:shorter'"),
        ("rule:shorter", JUDGES, "names no rule; the rules are 'rule:contains_number'"),
        # an ensemble entry is a source too: a bare checkpoint path says what it should be
        ("runs/old.pt", ENSEMBLE, "rl.ensemble: 'runs/old.pt' is not 'rm:PATH', 'hf:DIR', "
         "'rule:NAME' or 'check:EXTRACTOR'"),
        ("ensemble", ENSEMBLE, "is not 'rm:PATH'"),
    ],
)  # fmt: skip
def test_what_a_key_does_not_accept_is_refused_with_what_it_does(value, key, message):
    with pytest.raises(ParamsError, match=message):
        parse(value, key)


def test_what_sources_read():
    assert parse("hf:models/rm", REWARD).path.as_posix() == "models/rm"
    assert parse("rule:gold", REWARD).refused_off_suite
    assert parse("gold", JUDGES).needs_suite and not parse("gold", JUDGES).refused_off_suite
    assert not parse("pairwise:rm", JUDGES).needs_suite and parse("pairwise:rm", JUDGES).pairwise
    assert reward_sources.applicable(["gold", "rm", "pairwise:rule:shorter"], False) == [
        "rm",
        "pairwise:rule:shorter",
    ]
    params = parse_params({"evaluate": {"judges": ["gold", "pairwise:rm"]}})
    assert [j.kind.name for j in params.judges()] == ["gold", "pairwise_rm"]
    with pytest.raises(ParamsError, match=r"evaluate.judges = \[\]: name at least one of 'gold'"):
        parse_params({"evaluate": {"judges": []}})


def test_a_score_used_pairwise_decides_as_the_scores_do():
    def lengths(prompts, answers):
        return torch.tensor([float(len(a)) for a in answers])

    judge = PreferenceJudge(lengths)
    verdicts = judge(["p"] * 3, ["aaa", "a", "aa"], ["a", "aaa", "bb"])
    assert verdicts.tolist() == [1.0, 0.0, 0.5]
    shorter_judge = PairRuleJudge(shorter)
    assert shorter_judge(["p"] * 3, ["aaa", "a ", "aa"], ["a", "aaa", "bb"]).tolist() == [
        0.0,
        1.0,
        0.5,
    ]


def answers(responses: list[str], scores: list[float]) -> ScoredAnswers:
    n = len(responses)
    return ScoredAnswers(
        prompt_index=list(range(n)), prompts=[f"q{i}" for i in range(n)], tasks=["greet"] * n,
        responses=responses, gold=None, reward=scores, kl=[0.0] * n, kl_sampled=[0.0] * n,
        length=[1] * n,
        ended=[True] * n,
    )  # fmt: skip


def test_pairwise_judges_give_win_rates_as_the_single_answer_ones_do():
    """`pairwise:rm` (the reward model shown both answers) reproduces the `rm` win rates
    exactly; `pairwise:rule:shorter` counts the pairs where the later policy is shorter."""
    policies = {
        "sft": answers(["a", "bb", "ccc", "dd"], [0.1, 0.5, -1.0, 0.3]),
        "ppo": answers(["aa", "b", "ccc", "d"], [0.2, 0.4, -1.0, 0.9]),
    }
    reward = {r: s for a in policies.values() for r, s in zip(a.responses, a.reward, strict=True)}

    def reward_model(prompts, responses):
        return torch.tensor([reward[r] for r in responses])

    pairwise = {
        "pairwise:rm": PreferenceJudge(reward_model),
        "pairwise:rule:shorter": PairRuleJudge(shorter),
    }
    rates = win_rates(policies, ["rm", *pairwise], resamples=50, seed=3, pairwise=pairwise)
    assert rates["pairwise:rm"] == rates["rm"]
    assert rates["rm"]["ppo_vs_sft"].rate == (1 + 0 + 0.5 + 1) / 4
    shorter_rate = rates["pairwise:rule:shorter"]["ppo_vs_sft"]
    assert (shorter_rate.rate, shorter_rate.tie_rate) == ((0 + 1 + 0.5 + 1) / 4, 0.25)


def test_verdicts_other_than_win_tie_or_loss_are_refused():
    with pytest.raises(ValueError, match=r"outcomes must be 0, 0.5 or 1, got \[0.7\]"):
        compare_outcomes([1.0, 0.7], [0, 1], resamples=10, seed=0)
