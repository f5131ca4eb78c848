"""evaluate: every policy on the held-out prompts, the paper's win-rate table, and the report.

Each policy (SFT, every RL algorithm in `rl_algorithms`, DPO) answers the held-out prompts
greedily and by sampling; every answer gets its gold score, reward-model score, KL to SFT,
length and whether it ended. All policies sample with the same seed, so their i-th answers
share random numbers and the paired win rates compare policies rather than luck. Each RL
policy's snapshots along training give its over-optimization curve: proxy and gold score
against KL to SFT (exact, over the vocabulary).

Beside SFT sampled as it is, each policy meets the baselines a skeptic would try first
(`rlhf.eval.baselines`): SFT at its best temperature (each policy at its own, both chosen on
the validation prompts), SFT's greedy answers (against the policy's), and best-of-n of SFT
picked by the reward model at the nearest KL.

Writes every number to metrics/details/eval.json (stable keys, `rlhf.eval.summary`), each
policy's headline numbers to metrics/eval/<policy>.json (short keys, a row each in `dvc metrics
show`), the curves as CSV for `dvc plots`, and reports/ (eval.md and its figures) in one
atomic step. `run()` returns the headline numbers as a flat dict for the Prefect flow to
publish.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhf.algorithms.scorers import PairJudge, Scorer, ScoringContext, build
from rlhf.atomic import write_csv
from rlhf.data.schemas import PROMPT_SCHEMA, SFT_SCHEMA, read_rows
from rlhf.eval import report
from rlhf.eval.answers import ScoredAnswers
from rlhf.eval.baselines import baseline_metrics, best_temperature, primary_judge
from rlhf.eval.best_of_n import best_of_n
from rlhf.eval.checked import checked_metrics
from rlhf.eval.gold import has_judge
from rlhf.eval.metric_keys import evaluated_policies
from rlhf.eval.policies import score_policy
from rlhf.eval.summary import curve_point, headline, side_by_side, summarize, win_rates
from rlhf.models import checkpoint
from rlhf.models.backbone import freeze
from rlhf.params import ParamsError
from rlhf.project import paths
from rlhf.project.specs import StageSpec
from rlhf.reward_sources import (
    CHECK_EXTRACTORS,
    GOLD,
    JUDGES,
    REWARD_MODEL,
    applicable,
    parse,
)
from rlhf.sampling.sampler import SamplingConfig
from rlhf.stages.support.common import console, progress
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.stages.support.outputs import published, write_metrics
from rlhf.stages.support.scoring import (
    prompt_references,
    require_sources_tracked,
    scoring_context,
)
from rlhf.synthetic.tasks import gold_score
from rlhf.train.curves import read_curve

if TYPE_CHECKING:
    from rlhf.models.backbone import Backbone
    from rlhf.params.groups import EvaluateParams

TRAINING_CURVES = {"SFT": "sft", "Reward model": "rm", "DPO": "dpo"}  # report title -> stage
SPEC = StageSpec(
    "evaluate",
    "rlhf.stages.evaluate",
    params=("seed", "device", "threads", "cpu_kernels", "memory", "evaluate", "rl_algorithms"),
    # every policy: the artifacts folder holds the tokenizer, SFT, the reward model, DPO and
    # one folder per RL algorithm, however many rl_algorithms names
    inputs=(
        paths.PROMPTS_HELDOUT,
        paths.SFT_VAL,  # its prompts choose each policy's best temperature
        paths.ARTIFACTS,
        *(paths.curves_folder(s) for s in TRAINING_CURVES.values()),
    ),
    outs=(paths.REPORTS,),
    metrics=(paths.EVAL_METRICS,),  # a folder: one file per policy
    # each policy's win rate over SFT by the gold judge (the reward model's off the task suite),
    # sampled at evaluate.temperature, each at its best temperature, greedy against greedy, and
    # against the best-of-n nearest its KL; gold score (sampled, greedy) and KL to SFT
    headline={
        "win": "win_rate.gold|rm.{policy}_vs_sft",
        "win_t": "win_rate_best_temperature.gold|rm.{policy}_vs_sft",
        "win_greedy": "win_rate_greedy.gold|rm.{policy}_vs_sft",
        "win_bon": "win_rate_vs_best_of_n.gold|rm.{policy}",
        "gold": "gold_sampled.{policy}",
        "gold_greedy": "gold_greedy.{policy}",
        "kl": "kl_to_sft.{policy}",
        # a checker judge's share of right answers (of last_number, gsm8k, boxed, the first
        # that evaluate.judges names)
        "acc": "accuracy." + "|".join(f"check:{e}" for e in CHECK_EXTRACTORS) + ".{policy}",
    },
    details=paths.details_file("eval"),
    plots=(paths.EVAL_CURVE,),
)


def sampling(cfg: EvaluateParams, temperature: float) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=temperature)


@dataclass
class Evaluation:
    """What evaluate_all measured: `answers` by kind ("sampled" at evaluate.temperature,
    "greedy", "best_temperature": each policy at its best), each RL policy's over-optimization
    curve, and the temperature sweep on the validation prompts."""

    answers: dict[str, dict[str, ScoredAnswers]]
    curves: dict[str, list[dict[str, Any]]]
    sweep: dict[str, dict[float, ScoredAnswers]]


def evaluate_all(
    stage: StageRun,
    heldout: Callable[..., ScoredAnswers],
    validation: Callable[..., ScoredAnswers],
    names: list[str],
    judge: str,
) -> Evaluation:
    """Every policy's sampled and greedy answers to the held-out prompts, its temperature
    sweep on the validation prompts and its held-out answers at the best of those by `judge`;
    then each RL policy's over-optimization curve: SFT, its snapshots along training
    (`curve_samples` answers per prompt), the policy itself."""
    cfg, algorithms = stage.params.evaluate, stage.params.rl_algorithms

    greedy = SamplingConfig(max_new_tokens=cfg.max_new_tokens, greedy=True)
    snapshots = {a: sorted(paths.snapshots_dir(a).glob("step_*.pt")) for a in algorithms}
    found = Evaluation({"sampled": {}, "greedy": {}, "best_temperature": {}}, {}, {})
    sampled, trained_steps = found.answers["sampled"], {}
    with progress() as bar:
        per_policy = 3 + len(cfg.temperatures)
        total = per_policy * len(names) + sum(len(s) for s in snapshots.values())
        task = bar.add_task("evaluate", total=total, extra="")
        for name in names:
            bar.update(task, extra=name)
            file = paths.model_file(name)
            model, payload = checkpoint.load_model(file, stage.tokenizer, stage.device)
            model = freeze(model, stage.frozen_bf16)
            trained_steps[name] = payload.get("step")
            sampled[name] = heldout(model, n=cfg.samples, config=sampling(cfg, cfg.temperature))
            found.answers["greedy"][name] = heldout(model, n=1, config=greedy)
            found.sweep[name], found.answers["best_temperature"][name] = at_best_temperature(
                model, cfg, judge, heldout, validation, sampled[name]
            )
            bar.advance(task, per_policy)
        for algorithm, files in snapshots.items():
            curve = [curve_point(0, sampled["sft"])]
            for file in files:
                bar.update(task, extra=f"{algorithm} {file.stem}")
                model, payload = checkpoint.load_model(file, stage.tokenizer, stage.device)
                model = freeze(model, stage.frozen_bf16)
                along = heldout(model, n=cfg.curve_samples, config=sampling(cfg, cfg.temperature))
                curve.append(curve_point(payload["step"], along))
                bar.advance(task)
            found.curves[algorithm] = [
                *curve,
                curve_point(trained_steps[algorithm], sampled[algorithm]),
            ]
    return found


def at_best_temperature(
    model: Backbone,
    cfg: EvaluateParams,
    judge: str,
    heldout: Callable[..., ScoredAnswers],
    validation: Callable[..., ScoredAnswers],
    sampled: ScoredAnswers,
) -> tuple[dict[float, ScoredAnswers], ScoredAnswers]:
    """The policy's answers to the validation prompts at each temperature of the sweep, and
    its held-out answers at the one `judge` scores best there (`sampled`, the answers at
    evaluate.temperature, where that is the best): chosen on validation prompts alone, so the
    held-out win rates at the best temperature are not fitted to the held-out prompts."""
    sweep = {
        t: validation(model, n=cfg.sweep_samples, config=sampling(cfg, t)) for t in cfg.temperatures
    }
    best = best_temperature(sweep, judge)
    if best == cfg.temperature:
        return sweep, sampled
    return sweep, heldout(model, n=cfg.samples, config=sampling(cfg, best))


def best_of_n_baselines(
    stage: StageRun, sft: Backbone, heldout: Callable[..., ScoredAnswers]
) -> dict[int, ScoredAnswers]:
    """Per n of evaluate.bon_n, `samples` best-of-n answers per held-out prompt, from one pool
    of SFT's answers sampled as it is (temperature 1)."""
    cfg = stage.params.evaluate
    if not cfg.bon_n:
        return {}
    pool = heldout(sft, n=cfg.bon_pool, config=sampling(cfg, 1.0))
    return {n: best_of_n(pool, n, cfg.samples, stage.params.seed) for n in cfg.bon_n}


def unique_prompts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each prompt's first row: the validation demonstrations repeat prompts."""
    first: dict[str, dict[str, Any]] = {}
    for row in rows:
        first.setdefault(row["prompt"], row)
    return list(first.values())


def validation_and_references(
    stage: StageRun, heldout: Sequence[dict[str, Any]], judges: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """The validation prompts (SFT's validation demonstrations', each once), and every
    evaluation prompt's reference answer; refused before anything loads where a checker among
    `judges` lacks one (`prompt_references`)."""
    demonstrations = read_rows(paths.SFT_VAL, SFT_SCHEMA)
    checks = [(k, v) for k, v in stage.params.checked() if k == JUDGES and v in judges]
    files = {paths.PROMPTS_HELDOUT: heldout, paths.SFT_VAL: demonstrations}
    return unique_prompts(demonstrations), prompt_references(files, checks)


def usable_judges(stage: StageRun, synthetic: bool) -> list[str]:
    """The judges of evaluate.judges that can judge these prompts (`gold` only on the task
    suite's); refused before anything loads: the gold rule off the task suite, and a reward
    model folder dvc.yaml does not track."""
    judges = stage.params.evaluate.judges
    for name in judges:
        if not synthetic and parse(name, JUDGES).refused_off_suite:
            raise ParamsError(
                f"evaluate.judges names {name!r}, the task suite's judge, but the held-out "
                f"prompts in {paths.PROMPTS_HELDOUT} are not from the task suite: remove it"
            )
    usable = applicable(judges, synthetic)
    require_sources_tracked(stage, [parse(name, JUDGES) for name in usable], JUDGES)
    return usable


def other_judges(
    judges: list[str], context: ScoringContext
) -> tuple[dict[str, Scorer], dict[str, PairJudge]]:
    """By name, the judges besides the gold judge and the trained reward model (which measure
    every answer anyway): those that score each answer (`hf:DIR` reward models and
    `rule:NAME` functions), and the pairwise ones, which compare two policies' answers."""
    single: dict[str, Scorer] = {}
    pairwise: dict[str, PairJudge] = {}
    for name in judges:
        judge = parse(name, JUDGES)
        if judge.kind.name in (GOLD, REWARD_MODEL):
            continue
        if judge.pairwise:
            pairwise[name] = build(judge, context)
        else:
            single[name] = build(judge, context)
    return single, pairwise


def scorers(
    stage: StageRun,
    sft: Backbone,
    heldout: Sequence[dict[str, Any]],
    validation: Sequence[dict[str, Any]],
    reward_model: Scorer,
    single: dict[str, Scorer],
) -> tuple[Callable[..., ScoredAnswers], Callable[..., ScoredAnswers]]:
    """`score_policy` on the held-out prompts, and on the validation prompts (the SFT
    validation demonstrations', each once), every answer measured the same way: KL to SFT,
    reward, the gold judge on the task suite's prompts (prepare splits one source into both
    sets) and the other single-answer judges."""
    judge = gold_score if has_judge(heldout) else None
    score = functools.partial(
        score_policy, tokenizer=stage.tokenizer, reference=sft, scorer=reward_model, judge=judge,
        seed=stage.params.seed, batch_size=stage.params.evaluate.batch_size, other_judges=single,
    )  # fmt: skip
    return tuple(
        functools.partial(
            score, prompts=[r["prompt"] for r in rows], tasks=[r["task"] for r in rows]
        )
        for rows in (heldout, validation)
    )


def run() -> dict[str, float]:
    stage = StageRun.start(SPEC)
    p, cfg = stage.params, stage.params.evaluate
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    prompts, tasks = [r["prompt"] for r in heldout], [r["task"] for r in heldout]
    synthetic = has_judge(heldout)
    judges = usable_judges(stage, synthetic)
    validation, references = validation_and_references(stage, heldout, judges)
    # the policy under evaluation, SFT as the KL reference, the reward model and any reward
    # model folders among the judges (counted at the policy's size), at once
    folders = sum(parse(judge, JUDGES).path is not None for judge in judges)
    workload = stage.workload(trained=0, frozen=3 + folders, sampled=cfg.batch_size)
    stage.preflight(paths.SFT_MODEL, workload)
    sft = stage.load_frozen(paths.SFT_MODEL)
    context = scoring_context(stage, references=references)
    single, pairwise = other_judges(judges, context)
    heldout_answers, validation_answers = scorers(
        stage, sft, heldout, validation, context.reward_model(), single
    )
    names = evaluated_policies(p.rl_algorithms)
    found = evaluate_all(stage, heldout_answers, validation_answers, names, primary_judge(judges))
    answers = found.answers
    bon = best_of_n_baselines(stage, sft, heldout_answers)
    judged = functools.partial(
        win_rates, judges=judges, pairwise=pairwise, resamples=cfg.bootstrap_resamples, seed=p.seed
    )
    rates, greedy_rates = judged(answers["sampled"]), judged(answers["greedy"])
    metrics = {
        "prompts": len(prompts),
        "samples_per_prompt": cfg.samples,
        "temperature": cfg.temperature,
        **summarize(answers, rates, greedy_rates),
        **baseline_metrics(answers, found.sweep, bon, primary_judge(judges), judged),
        **checked_metrics(answers, judges, cfg.bootstrap_resamples, p.seed),
    }
    losses = {
        title: (read_curve(folder, "train_loss"), read_curve(folder, "epoch/val_loss"))
        for title, folder in ((t, paths.curves_folder(s)) for t, s in TRAINING_CURVES.items())
    }
    with published(SPEC) as out:
        report.write(
            out[paths.REPORTS], metrics, rates=rates, curves=found.curves, losses=losses,
            examples=side_by_side(prompts, tasks, answers, cfg.examples_per_task),
        )  # fmt: skip
        rows = [{"policy": a, **point} for a, curve in found.curves.items() for point in curve]
        write_csv(out[paths.EVAL_CURVE], rows)
        write_metrics(out, SPEC, metrics, policies=names)
    numbers = headline(metrics)
    shown = [f"{k} {v}" for k, v in numbers.items() if k.startswith(("gold_sampled.", "win_rate."))]
    console.print(f"evaluate: {', '.join(shown)}; report in {paths.REPORT}")
    return numbers


if __name__ == "__main__":
    main(run)
