"""evaluate: every policy on the held-out prompts, the paper's win-rate table, and the report.

Each policy (SFT, every RL algorithm in `rl_algorithms`, DPO) answers the held-out prompts
greedily and by sampling; every answer gets its gold score, reward-model score, KL to SFT,
length and whether it ended. All policies sample with the same seed, so their i-th answers
share random numbers and the paired win rates compare policies rather than luck. Each RL
policy's snapshots along training give its over-optimization curve: proxy and gold score
against KL to SFT.

Writes metrics/eval.json (stable keys for `dvc metrics diff`), the curves as CSV for `dvc
plots`, and reports/ (eval.md and its figures) in one atomic step. `run()` returns the
headline numbers as a flat dict for the Prefect flow to publish.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rlhf.algorithms.scorers import PairJudge, Scorer, ScoringContext, build
from rlhf.atomic import write_csv
from rlhf.data.schemas import PROMPT_SCHEMA, read_rows
from rlhf.eval import report
from rlhf.eval.gold import has_judge
from rlhf.eval.policies import ScoredAnswers, score_policy
from rlhf.eval.summary import curve_point, headline, side_by_side, summarize, win_rates
from rlhf.models import checkpoint
from rlhf.models.backbone import freeze
from rlhf.params import ParamsError
from rlhf.reward_sources import GOLD, JUDGES, REWARD_MODEL, applicable, parse
from rlhf.sampling.sampler import SamplingConfig
from rlhf.stages.support import paths
from rlhf.stages.support.common import console, progress
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.stages.support.outputs import published, write_metrics
from rlhf.stages.support.scoring import require_sources_tracked, scoring_context
from rlhf.stages.support.specs import Plot, StageSpec
from rlhf.synthetic.tasks import gold_score
from rlhf.train.curves import read_curve

TRAINING_CURVES = {"SFT": "sft", "Reward model": "rm", "DPO": "dpo"}  # report title -> stage
SPEC = StageSpec(
    "evaluate",
    "rlhf.stages.evaluate",
    params=("seed", "device", "threads", "memory", "evaluate", "rl_algorithms"),
    # every policy: the artifacts folder holds the tokenizer, SFT, the reward model, DPO and
    # one folder per RL algorithm, however many rl_algorithms names
    inputs=(
        paths.PROMPTS_HELDOUT,
        paths.ARTIFACTS,
        *(paths.curves_folder(s) for s in TRAINING_CURVES.values()),
    ),
    outs=(paths.REPORTS,),
    metrics=(paths.EVAL_METRICS,),
    # each policy's win rate over SFT by the gold judge (the reward model's off the task suite),
    # gold score and KL to SFT: three columns of `dvc exp show` for one changed RL param
    headline=("win_rate.gold|rm.*_vs_sft", "gold_sampled", "kl_to_sft"),
    details=paths.details_file("eval"),
    plots=(Plot(paths.EVAL_CURVE, "kl_to_sft", "gold_score"),),
)


def evaluate_all(
    stage: StageRun, evaluate: Callable[..., ScoredAnswers], names: list[str]
) -> tuple[dict[str, dict[str, ScoredAnswers]], dict[str, list[dict[str, Any]]]]:
    """Every policy's sampled and greedy answers, and each RL policy's over-optimization
    curve: SFT, then its snapshots along training (`curve_samples` answers per prompt), then
    the policy itself."""
    cfg, algorithms = stage.params.evaluate, stage.params.rl_algorithms
    sampling = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    greedy = SamplingConfig(max_new_tokens=cfg.max_new_tokens, greedy=True)
    snapshots = {a: sorted(paths.snapshots_dir(a).glob("step_*.pt")) for a in algorithms}
    answers: dict[str, dict[str, ScoredAnswers]] = {"sampled": {}, "greedy": {}}
    sampled, curves, trained_steps = answers["sampled"], {}, {}
    with progress() as bar:
        total = 2 * len(names) + sum(len(s) for s in snapshots.values())
        task = bar.add_task("evaluate", total=total, extra="")
        for name in names:
            bar.update(task, extra=name)
            file = paths.model_file(name)
            model, payload = checkpoint.load_model(file, stage.tokenizer, stage.device)
            model = freeze(model, stage.frozen_bf16)
            trained_steps[name] = payload.get("step")
            sampled[name] = evaluate(model, n=cfg.samples, config=sampling)
            answers["greedy"][name] = evaluate(model, n=1, config=greedy)
            bar.advance(task, 2)
        for algorithm, files in snapshots.items():
            curve = [curve_point(0, sampled["sft"])]
            for file in files:
                bar.update(task, extra=f"{algorithm} {file.stem}")
                model, payload = checkpoint.load_model(file, stage.tokenizer, stage.device)
                model = freeze(model, stage.frozen_bf16)
                along = evaluate(model, n=cfg.curve_samples, config=sampling)
                curve.append(curve_point(payload["step"], along))
                bar.advance(task)
            curves[algorithm] = [*curve, curve_point(trained_steps[algorithm], sampled[algorithm])]
    return answers, curves


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


def run() -> dict[str, float]:
    stage = StageRun.start(SPEC)
    p, cfg = stage.params, stage.params.evaluate
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    prompts, tasks = [r["prompt"] for r in heldout], [r["task"] for r in heldout]
    synthetic = has_judge(heldout)
    judges = usable_judges(stage, synthetic)
    # the policy under evaluation, SFT as the KL reference, the reward model and any reward
    # model folders among the judges (counted at the policy's size), at once
    folders = sum(parse(judge, JUDGES).path is not None for judge in judges)
    workload = stage.workload(trained=0, frozen=3 + folders, sampled=cfg.batch_size)
    stage.preflight(paths.SFT_MODEL, workload)
    sft = stage.load_frozen(paths.SFT_MODEL)
    context = scoring_context(stage)
    single, pairwise = other_judges(judges, context)
    evaluate = functools.partial(
        score_policy, tokenizer=stage.tokenizer, prompts=prompts, tasks=tasks, reference=sft,
        scorer=context.reward_model(), judge=gold_score if synthetic else None, seed=p.seed,
        batch_size=cfg.batch_size, other_judges=single,
    )  # fmt: skip
    answers, curves = evaluate_all(stage, evaluate, ["sft", *p.rl_algorithms, "dpo"])
    judged = functools.partial(
        win_rates,
        judges=judges,
        pairwise=pairwise,
        resamples=cfg.bootstrap_resamples,
        seed=p.seed,
    )
    rates, greedy_rates = judged(answers["sampled"]), judged(answers["greedy"])
    metrics = {
        "prompts": len(prompts),
        "samples_per_prompt": cfg.samples,
        "temperature": cfg.temperature,
        **summarize(answers, rates, greedy_rates),
    }
    losses = {
        title: (read_curve(folder, "train_loss"), read_curve(folder, "epoch/val_loss"))
        for title, folder in ((t, paths.curves_folder(s)) for t, s in TRAINING_CURVES.items())
    }
    with published(SPEC) as out:
        report.write(
            out[paths.REPORTS], metrics, rates=rates, curves=curves, losses=losses,
            examples=side_by_side(prompts, tasks, answers, cfg.examples_per_task),
        )  # fmt: skip
        rows = [{"policy": a, **point} for a, curve in curves.items() for point in curve]
        write_csv(out[paths.EVAL_CURVE], rows)
        write_metrics(out, SPEC, metrics)
    numbers = headline(metrics)
    shown = [f"{k} {v}" for k, v in numbers.items() if k.startswith(("gold_sampled.", "win_rate."))]
    console.print(f"evaluate: {', '.join(shown)}; report in {paths.REPORT}")
    return numbers


if __name__ == "__main__":
    main(run)
