"""psyrl's T-GRPO step and TRL's GRPOTrainer step on the identical workload, side by side (issue 6).

    .venv/bin/python bench/step_vs_trl.py            # builds bench/.venv-trl on first use (TRL is
    bench-only)

The workload: a random-init Qwen2 (hidden 128, 2 layers, 4 heads, 2 KV heads, FFN 256, vocabulary
151,936, tied embeddings) seeded 0, float32, the real Qwen2.5 tokenizer; 8 SocialIQa prompts per
step, in file order; G = 5; 64 new tokens at temperature 1.0, top-p 0.99; KL beta 0.01 against a
reference model; lr 1e-6; one update per step; one process on 2 cores; 1 warm-up + 5 timed steps,
medians.

Both sides run in the same venv (bench/.venv-trl: torch 2.13.0, transformers 5.19, TRL 1.16, psyrl),
each in its own process so that each peak RSS is its own. Both get the same prompt token ids
(psyrl's `direct` prompt: `Stimuli: <context>\\nQuestion: <question>` and the A.1 instruction, one
user turn, the chat template) and the same reward (psyrl's `base` reward: 0.5 token-set F1 of the
extracted answer + 0.5 format), and the same clipped surrogate (TRL `loss_type="grpo"`, epsilon 0.2
/ 0.3: psyrl's sequence-mean-token-mean and defaults). psyrl's step is `train_tgrpo.py` itself, from
its `time/*` metrics; TRL's is timed by a callback from the start to the end of each optimisation
step, and its generation by timing `model.generate`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".venv-trl"
PACKAGES = ["torch==2.13.0", "transformers==5.19.0", "trl==1.16.0"]
PROMPTS, G, NEW_TOKENS, TOP_P, TEMPERATURE, BETA, LR = 8, 5, 64, 0.99, 1.0, 0.01, 1e-6
WARMUP, TIMED, THREADS = 1, 5, 2


def ensure_venv() -> Path:
    """bench/.venv-trl with TRL and psyrl; never touched by `make test`."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV} (TRL is a bench-only dependency)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(ROOT)], check=True)
    return python


def build_workload(work: Path) -> tuple[Path, Path]:
    """The seeded random model (saved with the Qwen2.5 tokenizer) and the SocialIQa rows as
    StimuliQA records."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from psyrl.runtime.model import shipped_tokenizer_dir

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    model_dir = work / "model"
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(model_dir)
    for f in shipped_tokenizer_dir("qwen2.5").iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    rows = [
        json.loads(line)
        for line in (ROOT / "data/benchmarks/socialiqa/dev.jsonl").open(encoding="utf-8")
    ]
    data = work / "socialiqa.jsonl"
    with data.open("w", encoding="utf-8") as f:
        for r in rows[: PROMPTS * (WARMUP + TIMED)]:
            f.write(
                json.dumps(
                    {
                        "id": r["id"],
                        "stimuli": r["context"],
                        "question": r["question"],
                        "answer": r["answer"],
                    }
                )
                + "\n"
            )
    return model_dir, data


def pin_cores() -> None:
    """Both sides on the same THREADS cores: psyrl sizes its thread pool from this affinity."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
    import torch

    torch.set_num_threads(THREADS)


def run_psyrl(model_dir: Path, data: Path, work: Path, packing: bool = True) -> dict:
    import train_tgrpo
    from psyrl.core.runlog import read_metrics

    overrides = {
        "run.name": "psyrl",
        "run.output_dir": str(work),
        "run.steps": WARMUP + TIMED,
        "model.path": str(model_dir),
        "model.dtype": "float32",
        "model.packing": packing,
        "data.train_file": str(data),
        "data.valid_file": "",
        "data.shuffle": False,
        "prompt.mode": "direct",
        "reward.variant": "base",
        "loss.kl_coef": BETA,
        # the paper's T-GRPO, not the tiny demo's settings
        "advantage.scope": "cache",
        "log.samples_every": 0,
        "rollout.prompts": PROMPTS,
        "rollout.samples": G,
        "rollout.temperature": TEMPERATURE,
        "rollout.top_p": TOP_P,
        "rollout.max_new_tokens": NEW_TOKENS,
        "sampler.batch": PROMPTS * G,
        "optim.lr": LR,
        "optim.schedule": "constant",
        "optim.warmup_ratio": 0.0,
        "optim.weight_decay": 0.01,
        "optim.global_batch": PROMPTS,
        "optim.micro_batch": PROMPTS * G,
        "optim.logprob_micro_batch": PROMPTS * G,
        "checkpoint.every": 1000,
        "log.progress": False,
    }
    args = ["--config", str(ROOT / "configs/tgrpo/tiny.toml")]
    for k, v in overrides.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    train_tgrpo.main(args)
    rows = [r for r in read_metrics(work / "psyrl" / "metrics.jsonl") if r["step"] > WARMUP]
    keys = ["time/step", "time/sample", "time/score", "time/logprobs", "time/update", "time/sync"]
    out = {k.split("/")[1]: statistics.median(r[k] for r in rows) for k in keys}
    tokens = [r["response/length"] * PROMPTS * G for r in rows]
    out["generated_tokens"] = statistics.median(tokens)
    out["padding_fraction"] = statistics.median(r["actor/padding_fraction"] for r in rows)
    return out


def run_trl(model_dir: Path, data: Path, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from psyrl.core.config import PromptConfig, RewardConfig
    from psyrl.core.prompts import render
    from psyrl.core.records import load_stimuliqa
    from psyrl.rl.rewards import answer_components

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    records = load_stimuliqa(data)
    prompt_cfg, reward_cfg = PromptConfig(mode="direct"), RewardConfig(variant="base")
    dataset = Dataset.from_list(
        [{"prompt": render(tokenizer, r, prompt_cfg), "answer": r.answer} for r in records]
    )

    # psyrl's `base` reward: w_f1 F1 + w_fmt format
    def base_reward(prompts, completions, answer, **_):
        c = answer_components(completions, answer, "direct", reward_cfg)
        return (reward_cfg.w_f1 * c["f1"] + reward_cfg.w_fmt * c["fmt"]).tolist()

    step_times, generate_times, tokens = [], [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.start)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        bf16=False,
        max_steps=WARMUP + TIMED,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        max_grad_norm=1.0,
        per_device_train_batch_size=PROMPTS * G,
        gradient_accumulation_steps=1,
        num_generations=G,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=NEW_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        beta=BETA,
        loss_type="grpo",
        epsilon=0.2,
        epsilon_high=0.3,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=base_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    generate = trainer.model.generate

    def timed_generate(*a, **kw):
        start = time.perf_counter()
        out = generate(*a, **kw)
        generate_times.append(time.perf_counter() - start)
        tokens.append(int((out[:, kw["input_ids"].shape[1] :] != tokenizer.pad_token_id).sum()))
        return out

    trainer.model.generate = timed_generate
    trainer.train()
    return {
        "step": statistics.median(step_times[WARMUP:]),
        "sample": statistics.median(generate_times[WARMUP:]),
        "generated_tokens": statistics.median(tokens[WARMUP:]),
    }


def side(name: str, work: Path) -> None:
    """One side in this process; prints a JSON line with its medians and its own peak RSS."""
    pin_cores()
    sys.path.insert(0, str(ROOT))
    model_dir, data = work / "model", work / "socialiqa.jsonl"
    if name == "trl":
        result = run_trl(model_dir, data, work)
    else:  # psyrl (packed, the default) or psyrl-padded (model.packing = false)
        result = run_psyrl(model_dir, data, work / name, packing=name == "psyrl")
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    # which checkout was measured
    result["psyrl_from"] = str(Path(sys.modules["psyrl"].__file__).parent.parent)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sides = ["psyrl", "psyrl-padded", "trl"]
    parser.add_argument("--side", choices=sides, help="run one side here (internal)")
    parser.add_argument("--work", type=Path, help="workload directory (internal)")
    parser.add_argument(
        "--only",
        choices=sides,
        action="append",
        help="measure these sides only (repeatable); psyrl-padded: model.packing = false",
    )
    a = parser.parse_args()
    if a.side:
        return side(a.side, a.work)
    python = ensure_venv()
    results = {}
    with tempfile.TemporaryDirectory(prefix="psyrl-vs-trl-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [
                str(python),
                "-c",
                f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                f"from bench.step_vs_trl import build_workload; from pathlib import Path; "
                f"build_workload(Path({tmp!r}))",
            ],
            check=True,
            cwd=ROOT,
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
        for name in a.only or sides:
            print(f"running {name} ({WARMUP} warm-up + {TIMED} timed steps)...", flush=True)
            proc = subprocess.run(
                [str(python), __file__, "--side", name, "--work", str(work)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.exit(
                    f"{name} failed (exit "
                    f"{proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
                )
            results[name] = json.loads(line[len("RESULT ") :])
            print(f"{name}: {results[name]}", flush=True)
    print("\n| | step (median) | generation | generated tokens per step | peak RSS |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        print(
            f"| {name} | {r['step']:.2f} s | {r['sample']:.2f} s | {r['generated_tokens']:.0f} | "
            f"{r['peak_rss_gib']:.2f} GiB |"
        )
    for name in ("psyrl", "psyrl-padded"):
        if name in results and "trl" in results:
            ratio = results[name]["step"] / results["trl"]["step"]
            print(f"\n{name} / TRL step time: {ratio:.3f}")
        if name in results:
            p = results[name]
            print(
                f"{name} step parts: "
                + ", ".join(
                    f"{k} {p[k]:.2f} s" for k in ("sample", "score", "logprobs", "update", "sync")
                )
                + f"; padding fraction of the update micro-batches {p['padding_fraction']:.3f}"
            )


if __name__ == "__main__":
    main()
