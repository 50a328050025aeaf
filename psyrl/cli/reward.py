"""`psyrl reward score|audit`: run accuracy signals on answers outside training, and check whether a
signal ranks right answers above wrong ones before training on it (issue 41 items 4-5)."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from psyrl.cli.errors import reported
from psyrl.core.config import load_config
from psyrl.core.presets import resolve_config

SIGNALS = ("f1", "semantic", "judge")  # psyrl.signals.build.build_signal's
CHUNK = 256  # pairs per progress-bar tick (rounded to whole semantic batches: the same floats)


@click.group("reward")
def reward_group():
    """Score answers with the accuracy signals of reward.accuracy, and audit a signal on labelled
    triples (docs/reward-signals.md)."""


def signal_options(command):
    """--accuracy (repeatable), --config, --set: the signals and the tables that configure them."""
    options = [
        click.option(
            "--accuracy",
            "names",
            type=click.Choice(SIGNALS),
            multiple=True,
            required=True,
            help="A signal to compute; repeatable. f1: the paper's token-set F1 (eq. 4-5); "
            "semantic: a local sentence encoder's cosine ([semantic] table; pip install "
            "'psyrl[semantic]'); judge: an LLM judge ([judge] table).",
        ),
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False),
            default=None,
            help="TOML config whose [semantic] and [judge] tables configure the signals: a file or "
            "a preset (`psyrl config list`); default: all defaults.",
        ),
        click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="TABLE.KEY=VALUE",
            help="Override one key, e.g. semantic.encoder=path/to/encoder; repeatable.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _scores(names, config_path, overrides, pairs, unscored: dict | None = None) -> dict:
    """{name: float64 [N]} for every requested signal, built from the config. With `unscored` (a
    dict to fill), a pair the judge does not score is put there ({"judge": bool [N]}) instead of
    stopping the command: probes are built to make a judge fail."""
    import torch
    import transformers
    from tqdm import tqdm

    from psyrl.signals.build import build_signal

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar on stderr
    cfg = load_config(None if config_path is None else resolve_config(config_path), overrides)
    # a score or an audit of the judge must be the judge's: an unanswered request stops the command
    # (naming the endpoint) instead of standing in the paper's F1 as training does
    on_failure = "stop" if unscored is None else "mask"
    cfg = dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, on_failure=on_failure))

    chunk = cfg.semantic.batch_size * max(1, CHUNK // cfg.semantic.batch_size)
    results = {}
    for name in dict.fromkeys(names):
        signal = build_signal(name, cfg)
        starts = range(0, len(pairs), chunk)
        parts, missed = [], []
        for start in tqdm(starts, desc=name, unit="chunk", leave=False, disable=len(starts) < 2):
            parts.append(signal(pairs[start : start + chunk]))
            missed.append(torch.as_tensor(getattr(signal, "fallback_mask", [])).bool())
        results[name] = torch.cat(parts).double()
        if unscored is not None and name == "judge":
            unscored[name] = torch.cat(missed)
    return results


@reward_group.command("score")
@click.argument("path", metavar="FILE.jsonl", type=click.Path(exists=True, dir_okay=False))
@signal_options
def score_command(path, names, config_path, overrides):
    """Score each row of FILE.jsonl with every --accuracy signal.

    FILE.jsonl holds one JSON object per line with string keys "gold" (the gold answer) and
    "prediction" (the answer text, as extracted from <answer>...</answer>; may be empty, which
    scores 0), optionally "stimulus" and "question" (the judge reads them); other keys are ignored.

    Writes one JSON object per row to standard output, one float in [0, 1] per signal, e.g.
    {"f1": 0.4, "semantic": 0.71}. Every row is validated first: a bad row stops the command with
    FILE:LINE and what was expected (exit status 1), and nothing is written.
    """
    from psyrl.signals.audit import load_pairs

    with reported("psyrl reward score"):
        pairs = load_pairs(path)
        scores = _scores(names, config_path, overrides, pairs)
        lines = [
            json.dumps({name: values[i].item() for name, values in scores.items()})
            for i in range(len(pairs))
        ]
        sys.stdout.write("".join(line + "\n" for line in lines))


@reward_group.command("audit")
@click.argument("path", metavar="FILE.jsonl", type=click.Path(exists=True, dir_okay=False))
@signal_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per signal instead.")
@click.option(
    "--resamples",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Bootstrap resamples.",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**63 - 1),
    default=0,
    show_default=True,
    help="The bootstrap's seed.",
)
@click.option(
    "--probes",
    "probes",
    is_flag=True,
    help="Also score the shipped probes (psyrl/assets/judge/probes.jsonl: score lines, fake "
    "headings, 'ignore the rubric', requests to copy the score line or to write none, openers, an "
    "empty answer, every emotion word) against every triple, and report how many beat the wrong "
    "answers or escape the judge (left unscored): what a policy could exploit.",
)
@click.option(
    "--probe-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help='Probes of your own instead ("id", "what", "prediction" per line); implies --probes.',
)
def audit_command(
    path, names, config_path, overrides, as_json, resamples, seed, probes, probe_file
):
    """How often each --accuracy signal scores the right answer above the wrong one.

    FILE.jsonl holds one JSON object per line with string keys "gold", "right" (a correct answer,
    e.g. a paraphrase of the gold) and "wrong" (an incorrect one, e.g. the opposite emotion in the
    gold's words), optionally "stimulus" and "question"; other keys are ignored. The
    repository's data/reward_triples/ holds such triples.

    For each signal: n; "right > wrong", the fraction of triples with score(right) > score(wrong)
    (a tie is not above); the mean margin score(right) - score(wrong); each with a 95 % bootstrap
    interval (percentile method, --resamples resamples of the triples, seeded). Every row is
    validated first: a bad row stops the command with FILE:LINE and what was expected (exit status
    2). Fewer than MIN_TRIPLES triples give a warning: their intervals say little (one triple's is
    that triple's value).

    --probes: for each signal and probe, its mean score and on how many triples it scores above
    the wrong answer and above the right one; a probe beats the wrong answers when its mean is
    above theirs (a policy writing it would gain). A probe the judge leaves unscored on any triple
    escapes the judge, a finding too: the answer steered the judge off its format (training scores
    such a reply 0 and counts it toward judge.max_fallback_rate).
    """
    from psyrl.signals.audit import audit, load_probes, load_triples, probe_pairs

    with reported("psyrl reward audit"):
        triples = load_triples(path)
        chosen = load_probes(probe_file) if probes or probe_file else []
        if len(triples) < MIN_TRIPLES:
            click.echo(
                f"psyrl reward audit: warning: {len(triples)} triple(s) in {path}; a bootstrap "
                f"interval needs many more (at least {MIN_TRIPLES}), and one triple's is its own "
                "value",
                err=True,
            )
        pairs = [pair for triple in triples for pair in triple.pairs()]  # right, wrong, ...
        scores = _scores(names, config_path, overrides, pairs)
        results = {
            name: audit(values[0::2], values[1::2], resamples, seed)
            for name, values in scores.items()
        }
        probed = {}
        if chosen:
            unscored: dict = {}
            probe_scores = _scores(
                names, config_path, overrides, probe_pairs(chosen, triples), unscored
            )
            probed = _probe_results(chosen, probe_scores, scores, unscored)
        if as_json:
            for name, a in results.items():
                extra = {"probes": [f.__dict__ for f in probed[name]]} if probed else {}
                click.echo(json.dumps({"signal": name, **a.__dict__, **extra}))
            return
        rows = [("signal", "n", "right > wrong [95 % CI]", "ties", "mean margin [95 % CI]")]
        for name, a in results.items():
            lo, hi = a.above_interval
            mlo, mhi = a.margin_interval
            rows.append(
                (
                    name,
                    str(a.n),
                    f"{a.above * a.n:.0f}/{a.n} = {a.above:.3f} [{lo:.3f}, {hi:.3f}]",
                    str(a.ties),
                    f"{a.margin:+.3f} [{mlo:+.3f}, {mhi:+.3f}]",
                )
            )
        _table(rows)
        if probed:
            _probe_table(chosen, probed, len(triples), scores)


MIN_TRIPLES = 20  # below it the audit warns: a bootstrap interval of a few values says little


def _table(rows) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _probe_results(probes, probe_scores, scores, unscored) -> dict:
    """{signal: [ProbeFigures per probe]}."""
    from psyrl.signals.audit import probe_figures

    return {
        name: probe_figures(
            probes, values, scores[name][0::2], scores[name][1::2], unscored.get(name)
        )
        for name, values in probe_scores.items()
    }


def _probe_table(probes, probed: dict, n: int, scores: dict) -> None:
    """Per probe and signal: mean score, triples above the wrong answer, above the right one."""
    click.echo("")
    click.echo(
        f"probes, each scored against the {n} triples: 'mean, >wrong k, >right m' (on k, m of the "
        f"{n} triples above that triple's wrong, right answer); * its mean beats the wrong answers'"
        "; 'escapes the judge': left unscored (a reply without a score line)"
    )
    rows = [
        ("probe", *probed),
        ("(wrong answers)", *(f"{scores[name][1::2].mean().item():.3f}" for name in probed)),
        ("(right answers)", *(f"{scores[name][0::2].mean().item():.3f}" for name in probed)),
    ]
    for i, probe in enumerate(probes):
        cells = []
        for figures in probed.values():
            f = figures[i]
            mark = " *" if f.beats else ""
            missing = f", unscored {f.unscored}: escapes the judge" if f.escapes else ""
            cells.append(
                f"{f.mean:.3f}, >wrong {round(f.above_wrong * n)}, "
                f">right {round(f.above_right * n)}{missing}{mark}"
            )
        rows.append((probe.id, *cells))
    beat = [f"{sum(f.beats for f in figures)}/{len(probes)}" for figures in probed.values()]
    rows.append(("beat the wrong answers", *beat))
    escape = [f"{sum(f.escapes for f in figures)}/{len(probes)}" for figures in probed.values()]
    rows.append(("escape the judge", *escape))
    _table(rows)
