"""A vLLM engine started for one temperature, in its own process (vLLM's parallel state is per
process): samples at that temperature and at each top-p, and prints, per top-p, each sampled token's
vLLM log-prob minus the trainer's log softmax(logits / T), as JSON. Used by tests/test_vllm_cli.py.

    python tests/runtime/vllm_probe.py TEMPERATURE TOP_P [TOP_P ...]
"""

import json
import sys

import torch
from test_sampler import trainer_logprobs
from test_vllm_sampler import CFG

from psyrl.core import prompts
from psyrl.core.config import PromptConfig
from psyrl.core.records import load_stimuliqa
from psyrl.runtime.distributed import ONE_PROCESS, gather_full_state_dict
from psyrl.runtime.model import load_model, load_tokenizer, model_config
from psyrl.runtime.vllm_sampler import VLLMSampler, engine_model_dir


def main(temperature: float, top_ps: list[float]) -> None:
    tokenizer = load_tokenizer(CFG)
    model = load_model(CFG, tokenizer, seed=0).eval()
    with engine_model_dir(model_config(CFG, tokenizer)) as model_dir:
        sampler = VLLMSampler(
            model_dir,
            tokenizer,
            ONE_PROCESS,
            dtype="float32",
            max_model_len=1024,
            batch=16,
            temperature=temperature,
            enforce_eager=True,
        )
    sampler.load_weights(gather_full_state_dict(model))
    ids = [
        prompts.prompt_ids(tokenizer, r, PromptConfig())
        for r in load_stimuliqa("data/demo/test.jsonl")[:3]
    ]
    probes = {}
    for top_p in top_ps:  # one engine for every top-p: its start is most of the probe's time
        differences = []
        for prompt, group in zip(ids, sampler.generate(ids, 2, temperature, top_p, 24, seed=5)):
            for s in group:
                with torch.no_grad():
                    differences += (
                        torch.tensor(s.logprobs) - trainer_logprobs(model, prompt, s, temperature)
                    ).tolist()
        probes[str(top_p)] = differences
    sampler.close()
    print("PROBE " + json.dumps({"mode": sampler.logprobs_mode, "differences": probes}))


if __name__ == "__main__":
    main(float(sys.argv[1]), [float(a) for a in sys.argv[2:]])
