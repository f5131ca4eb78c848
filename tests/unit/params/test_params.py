from pathlib import Path

import pytest
import yaml

from rlhf.eval.metric_keys import flattened
from rlhf.params import Params, ParamsError, describe, load_params, parse_params
from rlhf.params.schema import group_hash

from conftest import REPO


def values_by_key(path: Path) -> dict[str, object]:
    """A params file's values as `-S` names them (`group.key`), comments dropped."""
    return flattened("", yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    "name",
    ["params.yaml", *(str(p.relative_to(REPO)) for p in sorted(REPO.glob("examples/*.yaml")))],
)
def test_shipped_params_files_are_valid_and_cover_every_field(name):
    load_params(REPO / name)
    assert values_by_key(REPO / name).keys() == {key for key, _, _ in describe()}


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("rm-budget", {"data.n_prompts": (3000, 12000), "collect.k": (4, 8)}),
        ("flawed-demos", {"data.demo_noise": (0.3, 0.8)}),
    ],
)
def test_a_measured_example_is_the_default_with_its_own_changes_only(name, changes):
    """The reward-model budget and the flawed demonstrations are what docs/results.md measured
    against the default: a default that moves on (a new KL coefficient, PPO-ptx, more
    iterations) must move them too, or their figures describe some older default."""
    default = values_by_key(REPO / "params.yaml")
    example = values_by_key(REPO / "examples" / f"{name}.params.yaml")
    assert example.keys() == default.keys()
    changed = {key: (default[key], example[key]) for key in default if example[key] != default[key]}
    assert changed == changes


def test_missing_keys_take_documented_defaults():
    assert parse_params({}) == Params()
    assert all(doc for _, doc, _ in describe())


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ParamsError) as err:
        parse_params({"sft": {"lrr": 0.1}}, "params.yaml")
    message = str(err.value)
    assert "params.yaml" in message
    assert "unknown key 'sft.lrr'" in message
    assert "did you mean 'sft.lr'" in message


def test_unknown_group_suggests_the_close_one():
    with pytest.raises(ParamsError, match=r"did you mean 'model'\?"):
        parse_params({"modle": {}})


def test_wrong_type_names_key_value_and_expected_type():
    with pytest.raises(ParamsError, match=r"sft.epochs = 'four' has the wrong type: expected int"):
        parse_params({"sft": {"epochs": "four"}})
    with pytest.raises(ParamsError, match=r"model.bias = 1 has the wrong type: expected bool"):
        parse_params({"model": {"bias": 1}})
    with pytest.raises(ParamsError, match=r"sft.epochs = True has the wrong type"):
        parse_params({"sft": {"epochs": True}})


def test_int_is_accepted_for_float_fields():
    assert parse_params({"sft": {"lr": 1}}).sft.lr == 1.0


def test_exponent_numbers_pyyaml_reads_as_text_are_numbers(tmp_path):
    """YAML 1.1 wants `1.0e-3`; `lr: 1e-3` as users write it reached the schema as text."""
    path = tmp_path / "params.yaml"
    path.write_text("sft:\n  lr: 1e-3\n  epochs: 2E0\ndata:\n  n_train: 1e4\n")
    params = load_params(path)
    assert (params.sft.lr, params.sft.epochs, params.data.n_train) == (0.001, 2, 10_000)
    with pytest.raises(ParamsError, match=r"data.n_train = '1.5e0' has the wrong type"):
        parse_params({"data": {"n_train": "1.5e0"}})


def test_values_that_would_overflow_or_poison_training_are_schema_errors():
    with pytest.raises(ParamsError, match=r"seed = 18446744073709551616 is out of range: must be"):
        parse_params({"seed": 2**64})
    with pytest.raises(ParamsError, match=r"dpo.beta = inf is not a finite number"):
        parse_params({"dpo": {"beta": float("inf")}})
    with pytest.raises(ParamsError, match=r"ppo.kl_coef = nan is not a finite number"):
        parse_params({"ppo": {"kl_coef": float("nan")}})
    with pytest.raises(ParamsError, match=r"data.n_train = 4294967296 is out of range: must be <="):
        parse_params({"data": {"n_train": 2**32}})


def test_answer_lengths_must_leave_room_for_a_prompt(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("sft:\n  eval_max_new_tokens: 100000\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert str(err.value) == (
        f"{path}: sft.eval_max_new_tokens = 100000 leaves no room for a prompt in "
        "model.block_size = 96 tokens: it must be smaller than that"
    )


def test_out_of_range_value_names_the_bound():
    with pytest.raises(ParamsError, match=r"sft.lr = -0.1 is out of range: must be > 0"):
        parse_params({"sft": {"lr": -0.1}})
    with pytest.raises(ParamsError, match=r"data.demo_noise = 1.5 is out of range: must be <= 1"):
        parse_params({"data": {"demo_noise": 1.5}})


def test_choice_lists_valid_choices_and_suggests():
    with pytest.raises(ParamsError) as err:
        parse_params({"device": "cude"})
    assert "'auto', 'cpu', 'cuda'" in str(err.value)
    assert "did you mean 'cuda'" in str(err.value)


def test_cross_field_rules():
    with pytest.raises(ParamsError, match="must divide"):
        parse_params({"model": {"n_head": 3, "n_embd": 128}})
    with pytest.raises(ParamsError, match=r"data\.tasks"):
        parse_params({"data": {"tasks": ["greet", "juggle"]}})
    with pytest.raises(ParamsError, match=r"rl_algorithms = \['ppo', 'sac'\] must list"):
        parse_params({"rl_algorithms": ["ppo", "sac"]})
    with pytest.raises(ParamsError, match="distinct"):
        parse_params({"rl_algorithms": ["ppo", "ppo"]})
    with pytest.raises(ParamsError, match=r"rl.reward = 'gold' is not 'rm', 'hf:DIR', 'ens"):
        parse_params({"rl": {"reward": "gold"}})
    with pytest.raises(ParamsError, match=r"needs tokenizer.kind: pretrained"):
        parse_params({"model": {"init": "models/qwen3"}})
    with pytest.raises(ParamsError, match=r"needs tokenizer.kind: bpe, bytes or tiktoken"):
        parse_params({"tokenizer": {"kind": "pretrained"}})
    with pytest.raises(ParamsError, match=r"needs reward sources in rl\.ensemble"):
        parse_params({"rl": {"reward": "ensemble"}})


def test_what_a_late_stage_would_refuse_is_refused_by_the_params_check():
    """An unknown rule failed the RL or evaluate stage, and too many answers for a person to
    rank failed collect, each after SFT had trained: every stage now refuses them at start."""
    with pytest.raises(ParamsError, match=r"rl.reward: 'rule:golden' names no rule; the rules"):
        parse_params({"rl": {"reward": "rule:golden"}})
    with pytest.raises(ParamsError, match=r"evaluate.judges: 'rule:x' names no rule"):
        parse_params({"evaluate": {"judges": ["gold", "rule:x"]}})
    with pytest.raises(ParamsError, match=r"= 27 answers per item are more than the 26 letters"):
        parse_params({"collect": {"labeler": "human", "k": 20, "explore": 7, "mismatched": 0}})
    assert parse_params({"collect": {"k": 20, "explore": 4}}).collect.answers_per_item() == 27
    unused = {"labeler": "human", "source": "files", "k": 20, "explore": 7}  # imported, not ranked
    assert parse_params({"collect": unused})


def test_the_gold_judge_on_your_own_prompts_is_refused_before_any_stage_runs():
    """The gold labeler crashed collect, after SFT had trained for minutes."""
    with pytest.raises(ParamsError, match=r"collect.labeler: 'gold' needs the task suite's gold "
                       r"judge, .* set collect.labeler to rm:PATH, hf:DIR, check:EXTRACTOR "
                       r"or human"):  # fmt: skip
        parse_params({"data": {"source": "files"}})
    with pytest.raises(ParamsError, match=r"rl.reward: 'rule:gold' .* set rl.reward to rm"):
        parse_params({"data": {"source": "files"}, "collect": {"labeler": "human"},
                      "rl": {"reward": "rule:gold"}})  # fmt: skip
    with pytest.raises(ParamsError, match=r"'rule: gold' .* remove it from evaluate.judges"):
        parse_params({"data": {"source": "files"}, "collect": {"source": "files"},
                      "evaluate": {"judges": ["rm", "rule: gold"]}})  # fmt: skip
    assert parse_params({"data": {"source": "files"}, "collect": {"labeler": "human"}})


def test_the_keys_needing_the_gold_judge():
    assert Params().gold_judged() == {"collect.labeler": "gold"}
    assert parse_params({"collect": {"source": "files"}}).gold_judged() == {}
    both = parse_params({"rl": {"reward": "rule:gold"}, "evaluate": {"judges": ["rule:gold"]}})
    assert both.gold_judged() == {
        "collect.labeler": "gold",
        "rl.reward": "rule:gold",
        "evaluate.judges": "rule:gold",
    }


def test_each_rl_algorithm_has_its_own_group_with_only_the_settings_it_uses():
    with pytest.raises(ParamsError, match=r"unknown key 'grpo.critic'"):
        parse_params({"grpo": {"critic": "shared"}})
    with pytest.raises(ParamsError, match=r"unknown key 'rloo.update_epochs'"):
        parse_params({"rloo": {"update_epochs": 4}})
    with pytest.raises(ParamsError, match=r"rloo.group_size = 1 is out of range: must be >= 2"):
        parse_params({"rloo": {"group_size": 1}})
    params = parse_params({"ppo": {"kl_coef": 0.05}})
    assert params.algorithm("ppo").kl_coef == 0.05 and params.algorithm("grpo").kl_coef == 0.05
    assert params.algorithm("reinforce").kl_coef == 0.2


def test_group_must_be_a_mapping():
    with pytest.raises(ParamsError, match="sft must be a mapping"):
        parse_params({"sft": 3})


def test_group_hash_changes_only_with_its_groups():
    base = Params()
    changed = parse_params({"sft": {"lr": 0.5}})
    assert group_hash(base, "model") == group_hash(changed, "model")
    assert group_hash(base, "sft") != group_hash(changed, "sft")
