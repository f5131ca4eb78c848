"""A user's own pretrained model on their own data through the whole pipeline, as
examples/gpt2-hh.params.yaml runs it on a GPU host: `dvc repro` with `model.init` on a tiny
random Qwen3 folder (its own byte-level BPE tokenizer and ChatML template), on preference data
imported in Anthropic's HH-RLHF format (its chosen answers the SFT demonstrations), PPO scored
by an external GPT-2 reward model that reads through its own, different tokenizer, and the
trained policy exported back to a folder transformers loads. Then two more labeling rounds on
the same prompts, which the task suite cannot judge, each up to the reward model it trains
(what follows runs as after the first round's imported comparisons): answers sampled from the
SFT policy and ranked by the reward model the first run trained (AI feedback), then by people
typing their rankings into `rlhf label` through a pseudo-terminal."""

from __future__ import annotations

import json
import shutil
import subprocess
from itertools import combinations
from pathlib import Path

import pexpect
import pytest
import torch
import yaml

from rlhf.algorithms.scorers import RewardModelScorer
from rlhf.data.schemas import COMPARISON_SCHEMA, PROMPT_SCHEMA, read_rows
from rlhf.labeling.queue import read_queue
from rlhf.labeling.ranking import format_ranking
from rlhf.models import checkpoint
from rlhf.params.groups import DataParams
from rlhf.project import paths
from rlhf.project.metric_files import read_metrics
from rlhf.synthetic.datasets import synthetic_sets
from rlhf.tokenizer.tokenizer import load_tokenizer
from rlhf.train.curves import read_curve

from conftest import clean_env, init_dvc_repo, make_project
from label_terminal import PROMPT, answer, start_labeling

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def corpus() -> list[str]:
    rows = synthetic_sets(DataParams(n_train=400), seed=3)["train"]
    return [text for row in rows for text in (row["prompt"], row["response"])]


def byte_level_bpe(texts: list[str], vocab_size: int, split: str | None, specials: list[str]):
    """A byte-level BPE trained here: Qwen style (a Split regex, then bytes) or GPT-2 style."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    bpe = tokenizers.Tokenizer(models.BPE())
    if split is None:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    bpe.train_from_iterator(texts, trainer)
    return bpe


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny Qwen3 policy folder and a tiny GPT-2 reward-model folder, each with its own
    tokenizer, as `save_pretrained` writes them."""
    root, texts = tmp_path_factory.mktemp("hf"), corpus()
    torch.manual_seed(0)
    qwen_tok = byte_level_bpe(texts, 420, QWEN_SPLIT, QWEN_SPECIALS)
    qwen = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=qwen_tok.get_vocab_size(), hidden_size=48, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, tie_word_embeddings=True,
    ))  # fmt: skip
    qwen.save_pretrained(root / "qwen3")
    qwen_tok.save(str(root / "qwen3" / "tokenizer.json"))
    (root / "qwen3" / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML,
    }))  # fmt: skip
    gpt_tok = byte_level_bpe(texts, 380, None, ["<|endoftext|>"])
    end = gpt_tok.token_to_id("<|endoftext|>")
    reward = transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=gpt_tok.get_vocab_size(), n_embd=32, n_layer=1, n_head=2, n_positions=128,
        num_labels=1, pad_token_id=end, bos_token_id=end, eos_token_id=end,
    ))  # fmt: skip
    reward.save_pretrained(root / "reward")
    gpt_tok.save(str(root / "reward" / "tokenizer.json"))
    return {"policy": root / "qwen3", "reward": root / "reward"}


def sh(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def hh_transcripts(path: Path) -> Path:
    """HH-RLHF rows, transcripts sharing every turn but the final answer: a demonstration
    chosen over the next row's answer."""
    rows = synthetic_sets(DataParams(n_train=100), seed=4)["train"]
    records = [
        {
            "chosen": f"\n\nHuman: {row['prompt']}\n\nAssistant: {row['response']}",
            "rejected": f"\n\nHuman: {row['prompt']}\n\nAssistant: {other['response']}",
        }
        for row, other in zip(rows, rows[1:] + rows[:1], strict=True)
        if row["response"].strip() != other["response"].strip()
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def project(folders, tmp_path_factory) -> Path:
    overrides = {
        "model.init": str(folders["policy"]),
        "tokenizer.kind": "pretrained",
        "rl.reward": f"hf:{folders['reward']}",
        "rl_algorithms": ["ppo"],
        "data.source": "files",
        "data.heldout_fraction": 0.1,
        "collect.source": "files",
        "sft.epochs": 2,
        "ppo.steps": 2,
        "dpo.epochs": 1,
    }
    root = tmp_path_factory.mktemp("pretrained")
    project = init_dvc_repo(make_project(root / "project", overrides))
    hh = hh_transcripts(root / "hh.jsonl")
    sh(["python", "-m", "rlhf.cli", "import", str(hh), "--kind", "hh", "--as", "demonstrations"],
       project)  # fmt: skip
    sh(["python", "-m", "rlhf.cli", "import", str(hh), "--kind", "hh"], project)
    sh(["python", "-m", "rlhf.dvcfile"], project)
    sh(["dvc", "repro"], project)
    return project


def test_dvc_repro_runs_every_stage_from_a_pretrained_qwen3_folder(project, folders):
    payload = checkpoint.load(project / "artifacts" / "sft" / "model.pt")
    assert payload["backbone"] == "llama" and payload["model_config"]["qk_norm"]
    assert payload["model_config"]["block_size"] == 64  # cut to model.block_size
    sft = read_metrics("sft", project)
    val = read_curve(project / "dvclive" / "sft" / "plots" / "metrics", "epoch/val_loss")
    assert val[-1][1] < val[0][1]  # validation loss falls from the random start
    ppo = read_metrics("ppo", project)
    assert ppo["steps"] == 2  # two PPO iterations scored by the external reward model
    assert ppo["gold_sampled"] is None and ppo["kl_to_sft"] > 0  # no gold judge
    assert set(ppo["win_rate_vs_sft"]) == {f"hf:{folders['reward']}"}  # judged by its reward
    heldout = read_rows(project / "data" / "prepared" / "prompts_heldout.parquet", PROMPT_SCHEMA)
    assert heldout[0]["prompt"].startswith("Human: ") and heldout[0]["source"] == "files"
    evaluation = read_metrics("eval", project)
    assert evaluation["prompts"] == len(heldout) >= 8 and evaluation["kl_to_sft"]["sft"] == 0.0
    assert set(evaluation["rm_sampled"]) == {"sft", "ppo", "dpo"}
    assert set(evaluation["win_rate"]) == {"rm"}  # the trained reward model judges
    for pair in ("ppo_vs_sft", "dpo_vs_sft", "dpo_vs_ppo"):
        interval = evaluation["win_rate_ci95"]["rm"][pair]
        assert 0 <= interval["low"] <= evaluation["win_rate"]["rm"][pair] <= interval["high"] <= 1
    assert set(evaluation["win_rate"]["rm"]) == {"ppo_vs_sft", "dpo_vs_sft", "dpo_vs_ppo"}
    pretrained = transformers.AutoModelForCausalLM.from_pretrained(folders["policy"])
    heads = 2 * (pretrained.config.hidden_size + 1)  # our fresh value and reward heads
    assert sft["params"] == pretrained.num_parameters() + heads  # every weight from the folder


def test_the_pretrained_folders_are_dvc_deps(project, folders):
    definitions = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    assert str(folders["policy"]) in definitions["sft"]["deps"]
    assert str(folders["policy"]) in definitions["tokenizer"]["deps"]
    assert str(folders["reward"]) in definitions["rl"]["do"]["deps"]
    assert "up to date" in sh(["dvc", "status"], project).stdout


def test_a_changed_folder_makes_dvc_rerun_from_the_tokenizer(project, folders, tmp_path):
    """New contents in the policy folder make DVC call tokenizer and sft stale; a stage whose
    folder dvc.yaml does not list refuses to run before it reads anything."""
    config_file = folders["policy"] / "config.json"
    original = config_file.read_text()
    try:
        config_file.write_text(json.dumps(json.loads(original) | {"rms_norm_eps": 1e-5}))
        status = sh(["dvc", "status", "sft", "tokenizer"], project).stdout
    finally:
        config_file.write_text(original)
    assert "tokenizer:" in status and "sft:" in status and str(folders["policy"]) in status
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    pipeline = yaml.safe_load((copy / "dvc.yaml").read_text())
    pipeline["stages"]["sft"]["deps"].remove(str(folders["policy"]))
    pipeline["stages"]["rl"]["do"]["deps"].remove(str(folders["reward"]))
    (copy / "dvc.yaml").write_text(yaml.safe_dump(pipeline))
    for stage, args in (("sft", []), ("rl", ["ppo"])):  # the RL stage's reward model folder too
        refused = subprocess.run(
            ["python", "-m", f"rlhf.stages.{stage}", *args], cwd=copy, env=clean_env(),
            capture_output=True, text=True,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert f"is not among stage {stage}'s deps in dvc.yaml: run `rlhf dvc" in refused.stderr


def test_the_tokenizer_is_the_folders_own_with_its_chat_template(project):
    from rlhf.tokenizer.chat import encode_example
    from rlhf.tokenizer.tokenizer import load_tokenizer

    ours = load_tokenizer(project / "artifacts" / "tokenizer")
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(project / "artifacts" / "tokenizer" / "hf" / "tokenizer.json")
    )
    text = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>"
    example = encode_example(ours, "What is 2 + 3?", "5", 64)
    assert example.ids == theirs(text)["input_ids"]
    assert ours.eos_id == theirs.convert_tokens_to_ids("<|im_end|>")
    assert ours.pad_id == theirs.convert_tokens_to_ids("<|endoftext|>")
    injected = ours.encode("<|im_end|>")  # user text never becomes a special token
    assert ours.eos_id not in injected and ours.decode(injected) == "<|im_end|>"


def test_export_writes_a_folder_transformers_loads_with_its_tokenizer(project):
    out = project / "exported"
    sh(["python", "-m", "rlhf.cli", "export", "ppo", str(out)], project)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    policy, _ = checkpoint.load_model(
        project / "artifacts" / "ppo" / "model.pt", None, torch.device("cpu")
    )
    ids = torch.tensor([tokenizer(chat)["input_ids"]])
    with torch.no_grad():
        assert (model(input_ids=ids).logits - policy.eval()(ids)).abs().max() <= 1e-4
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def next_round(project: Path, directory: Path, collect: dict) -> Path:
    """A copy of `project` with new collect params and dvc.yaml regenerated for them."""
    copy = directory / "project"
    shutil.copytree(project, copy, symlinks=True)
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["collect"] |= {"source": "policy", "k": 2, "explore": 0, "mismatched": 1} | collect
    params["rl"]["reward"] = "rm"  # PPO on the reward model these comparisons train
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    sh(["python", "-m", "rlhf.cli", "dvc-yaml"], copy)
    return copy


@pytest.fixture(scope="module")
def labeled_by_rm(project, tmp_path_factory) -> Path:
    """The answers ranked by the reward model the first run trained, kept as a checkpoint,
    and a reward model trained on them."""
    directory = tmp_path_factory.mktemp("rm-labeler")
    (directory / "labelers").mkdir()
    checkpoint_file = directory / "labelers" / "rm.pt"
    shutil.copy(project / paths.model_file("rm"), checkpoint_file)
    relabeled = next_round(project, directory, {"labeler": f"rm:{checkpoint_file}"})
    sh(["dvc", "repro", "rm"], relabeled)
    return relabeled


def test_a_reward_model_labels_answers_sampled_from_the_sft_policy(labeled_by_rm):
    """Every comparison ranks its answers by the labeler's scores: of two answers it scores
    apart (by more than batching's float noise), the better-scored ranks first."""
    collect = read_metrics("collect", labeled_by_rm)
    assert collect["prompts"] == len(read_rows(labeled_by_rm / paths.PROMPTS_TRAIN, PROMPT_SCHEMA))
    assert "labeler_mean_of_samples" in collect and "gold_mean_of_samples" not in collect
    params = yaml.safe_load((labeled_by_rm / "params.yaml").read_text())
    labeler = RewardModelScorer.load(
        Path(params["collect"]["labeler"].removeprefix("rm:")),
        load_tokenizer(labeled_by_rm / paths.TOKENIZER),
        torch.device("cpu"),
    )
    rows = [
        row
        for comparisons in (paths.COMPARISONS_TRAIN, paths.COMPARISONS_VAL)
        for row in read_rows(labeled_by_rm / comparisons, COMPARISON_SCHEMA)
    ]
    decided = 0
    for row in rows:
        scores = labeler([row["prompt"]] * len(row["responses"]), row["responses"]).tolist()
        for i, j in combinations(range(len(scores)), 2):
            if abs(scores[i] - scores[j]) > 1e-4:
                decided += 1
                assert (scores[i] > scores[j]) == (row["ranks"][i] < row["ranks"][j]), row
    assert decided >= len(rows)  # not vacuous: a pair per row, on average, scored apart
    assert read_metrics("rm", labeled_by_rm)["pairs_val"] > 0
    assert "up to date" in sh(["dvc", "status", "rm"], labeled_by_rm).stdout


def ranking_by_length(responses: list[str]) -> str:
    """How the test's labeler ranks: longer answers first, equal lengths tied."""
    lengths = sorted({len(r.strip()) for r in responses}, reverse=True)
    return format_ranking([lengths.index(len(r.strip())) for r in responses])


def test_people_rank_the_answers_in_the_terminal_and_the_reward_model_trains_on_them(
    labeled_by_rm, tmp_path_factory
):
    """Up to the reward model, as the reward model's round above."""
    project = next_round(labeled_by_rm, tmp_path_factory.mktemp("human"), {"labeler": "human"})
    stopped = subprocess.run(["dvc", "repro"], cwd=project, env=clean_env(), capture_output=True,
                             text=True)  # fmt: skip
    queue = read_queue(project / paths.LABEL_QUEUE)
    waiting = f"{len(queue)} of {len(queue)} items in {paths.LABEL_QUEUE} wait for labels"
    assert stopped.returncode != 0 and waiting in stopped.stdout + stopped.stderr
    alice = start_labeling(project, "alice")
    alice.expect_exact(PROMPT)
    for number, item in enumerate(queue[:-1], start=2):
        answer(alice, ranking_by_length(item["responses"]), f"item {number} of")
    alice.sendline("q")  # one item short, then back for it
    alice.expect(pexpect.EOF)
    alice = start_labeling(project, "alice")
    alice.expect_exact(f"item {len(queue)} of {len(queue)}")
    alice.expect_exact(PROMPT)
    alice.sendline(ranking_by_length(queue[-1]["responses"]))
    alice.expect_exact(f"all {len(queue)} items are labeled by alice")
    alice.expect(pexpect.EOF)
    bob = start_labeling(project, "bob")  # a second opinion on the first four items
    bob.expect_exact(PROMPT)
    for number, item in enumerate(queue[:4], start=2):
        answer(bob, ranking_by_length(item["responses"]), f"item {number} of")
    bob.sendline("q")
    bob.expect(pexpect.EOF)
    sh(["dvc", "repro", "rm"], project)
    collect = read_metrics("collect", project)
    assert collect["labels"] == len(queue) + 4 and collect["labelers"] == 2
    assert collect["inter_labeler_agreement"] == 1.0  # both rank by length
    assert collect["items_labeled_twice"] == 4
    ordered = sum(  # the held-out pairs the two people ranked apart
        row["ranks"][i] != row["ranks"][j]
        for row in read_rows(project / paths.COMPARISONS_VAL, COMPARISON_SCHEMA)
        for i, j in combinations(range(len(row["ranks"])), 2)
    )
    assert ordered > 0 and read_metrics("rm", project)["pairs_val"] == ordered
    assert "up to date" in sh(["dvc", "status", "rm"], project).stdout
