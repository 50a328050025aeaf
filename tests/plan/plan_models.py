"""Architectures the tests/plan/ modules share: the shipped Qwen2.5-Instruct configs, and SMALL, a
Qwen2 whose parameter count is worked out by hand below, with the settings its plans are made
under."""

from transformers import AutoConfig, Qwen2Config

from psyrl.plan.architecture import shipped_architecture_dir


def architecture(size: str):
    return AutoConfig.from_pretrained(str(shipped_architecture_dir(f"Qwen2.5-{size}-Instruct")))


SMALL = Qwen2Config(
    vocab_size=65536,
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=4096,
    tie_word_embeddings=True,
)
# one layer: q 1024x1024 + 1024, k and v 256x1024 + 256 each, o 1024x1024, gate/up/down 3 x
# 4096x1024, norms 2x1024 = 1,049,600 + 2 x 262,400 + 1,048,576 + 12,582,912 + 2,048 = 15,207,936;
# x 8 layers = 121,663,488
# root: embedding 65536 x 1024 = 67,108,864 + final norm 1,024 = 67,109,888 (tied head)
# total P = 188,773,376; every dim 0 is even, so one of 2 ranks holds P / 2 = 94,386,688
SMALL_PARAMS = 188_773_376
SETTINGS = [
    "loss.kl_coef=0",
    'sampler.engine="vllm"',
    "sampler.tensor_parallel=1",
    "sampler.enforce_eager=true",
    "sampler.max_num_seqs=16",
    "rollout.max_prompt_tokens=1024",
    "rollout.max_new_tokens=1024",
    'model.dtype="bfloat16"',
]
