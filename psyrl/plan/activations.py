"""What one micro-batch adds to a GPU beside the weights: the bytes a Qwen2 decoder layer saves for
backward (or holds in a gradient-free forward) per token, and the moments of a forward/backward
through psyrl's Policy and its chunked log-probs at which the peak can fall."""

from __future__ import annotations

from psyrl.plan.architecture import Shapes
from psyrl.runtime.model import LOGPROB_CHUNK


def layer_saved_per_token(sh: Shapes, b: int) -> int:
    """Bytes one Qwen2 decoder layer saves for backward per token, compute dtype of b bytes
    (modeling_qwen2.py with sdpa; a padded batch, so sdpa gets a mask and the GQA k/v are repeated
    to all heads). Measured on a CPU in float32 to the byte per layer
    (tests/plan/test_activations.py lists the saved tensors)."""
    H, q, kv, ffn = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate
    # each RMSNorm: float32 input (pow, mul), normalised value, output; rsqrt
    norms = 2 * ((4 + 2 * b) * H + 4)
    # the rotary muls save only cos and sin (q and k need no saving: cos/sin carry no gradient);
    # sdpa saves q_embed, k and v (repeat_kv's copies to all heads when it has a mask), its output
    # (o_proj's input too) and logsumexp
    attention = 2 * b * q + 2 * b * (q if kv < q else kv) + 4 * sh.heads
    # gate_proj out (SiLU), SiLU out and up_proj out (their product), the product (down_proj)
    mlp = 4 * b * ffn
    return norms + attention + mlp


def layer_forward_per_token(sh: Shapes, b: int) -> int:
    """Bytes per token alive inside one decoder layer's gradient-free forward, at its largest
    (modeling_qwen2.py; nothing is saved, temporaries die as their last use returns)."""
    H, q, kv, ffn = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate
    # layer input (the decoder loop holds it), residual, norm output; SiLU, up, product
    mlp = 3 * b * H + 3 * b * ffn
    # input, norm output; q_embed + a rotary temporary, k and v and their repeats, the output
    attention = 2 * b * H + 5 * b * q + 2 * b * kv
    norm = (b + 8 + b) * H  # input, its float32 copy and normalised value, the output
    return max(mlp, attention, norm)


def compute_moments(
    sh: Shapes,
    rows: float,
    seq_len: int,
    targets: int,
    b: int,
    grad_bytes: int,
    checkpointing: bool,
    backward: bool,
    autocast: bool = False,
    packed: bool = False,
) -> dict[str, dict[str, float]]:
    """Bytes of one micro-batch through psyrl.runtime.model.Policy (the decoder, then
    token_logprobs' HeadLogprobs), at each moment that can be its peak: {moment: {"activations":
    ..., "log-probs": ...}}. rows x seq_len tokens (a padded batch), `targets` scored positions,
    compute dtype of b bytes, parameter gradients of grad_bytes. Excludes the weights and the
    decoder layers' own gradients (the caller's "gathered" and "grad sync" parts). `autocast`: one
    process in bf16 autocast over float32 weights, where HeadLogprobs' backward casts the head
    weight to bf16 (one more [V, H] copy). `packed`: one padding-free row (model.packing), whose
    attention takes no mask."""
    H, V, L = sh.hidden, sh.vocab, sh.layers
    tokens = rows * seq_len
    chunk = min(LOGPROB_CHUNK, targets)
    # transformers' sdpa mask [rows, 1, T, T] (bool), built once per forward; none when packed
    bool_mask = 0 if packed else rows * seq_len**2
    # torch's sdpa converts it to an additive mask in the compute dtype per call
    float_mask = 0 if packed else b * rows * seq_len**2
    rows_saved = targets * b * H  # hidden[:, :-1][positions]: the [N, H] rows HeadLogprobs saves
    hidden = tokens * b * H  # the final norm's output, alive while token_logprobs runs its forward
    # HeadLogprobs.forward, per chunk: [rows, V] float32 logits + logsumexp's exp temporary
    chunk_forward = 8 * V * chunk
    if not backward:  # no_grad: nothing is saved; one layer's working set, then the head
        layer = tokens * layer_forward_per_token(sh, b) + float_mask
        return {
            "layer forward": {"activations": bool_mask + layer, "log-probs": 0.0},
            "head forward": {
                "activations": bool_mask,
                "log-probs": hidden + rows_saved + chunk_forward,
            },
        }
    # sdpa saves its additive mask too
    layer_saved = tokens * layer_saved_per_token(sh, b) + float_mask
    # non-reentrant checkpoint keeps each layer's input; backward recomputes one layer at a time
    if checkpointing:
        stack = L * tokens * b * H
        recomputed = layer_saved
    else:
        stack = L * layer_saved
        recomputed = 0.0
    final = tokens * (4 + b) * H  # the final RMSNorm: its float32 input and normalised value
    # the LM head's (tied: the embedding's) gradient, summed until the backward ends
    head_grad = grad_bytes * V * H
    # recomputed float32 logits->grad, its b copy
    chunk_backward = 4 * V * chunk + (b * V * chunk if b < 4 else 0)
    # HeadLogprobs.backward: the float32 sum of the chunks' weight gradients, one chunk's product in
    # the compute dtype (at the end: the sum cast to the weight's dtype), weight.to(bf16) under
    # autocast
    head_sum = 4 * V * H + max(b, grad_bytes if grad_bytes != 4 else 0) * V * H
    casts = 2 * V * H if autocast else 0
    # estimate: incoming grads + two MLP-wide grads
    layer_backward = tokens * (2 * b * H + 2 * b * sh.intermediate)
    return {
        "head forward": {
            "activations": bool_mask + stack + final,
            "log-probs": hidden + rows_saved + chunk_forward,
        },
        "head backward": {
            "activations": bool_mask + stack + final,
            "log-probs": rows_saved + chunk_backward + head_sum + casts,
        },
        "layer backward": {
            "activations": bool_mask + stack + recomputed + layer_backward,
            "log-probs": head_grad,
        },
        # the embedding's dense gradient joins the head's; the input's gradient is [tokens, H]
        "root backward": {"activations": tokens * b * H, "log-probs": 2 * head_grad},
    }
