"""Tiny random MoE checkpoints of the five kinds upstream vLLM serves differently, built
with transformers' own model classes and saved as safetensors, plus a word-level
tokenizer, so a real vLLM engine can load them offline.

Kinds: ``mixtral`` (every layer MoE), ``qwen3_moe``, ``qwen3_moe_dense`` (dense MLP
layers between MoE layers), ``qwen2_moe`` (a shared expert beside the routed ones),
``deepseek_v3`` (dense first layers, grouped top-k routing).
"""

from __future__ import annotations

import json
import os

KINDS = ("mixtral", "qwen3_moe", "qwen3_moe_dense", "qwen2_moe", "deepseek_v3")
VOCAB = 512
WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def _config(kind: str, dtype: str):
    import transformers as tf

    common = dict(
        vocab_size=VOCAB,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        torch_dtype=dtype,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if kind == "mixtral":
        return tf.MixtralConfig(
            num_hidden_layers=3, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, **common
        )
    if kind in ("qwen3_moe", "qwen3_moe_dense"):
        extra = {"mlp_only_layers": [1]} if kind == "qwen3_moe_dense" else {}
        return tf.Qwen3MoeConfig(
            num_hidden_layers=3,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=16,
            num_experts_per_tok=4,
            head_dim=64,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            **extra,
            **common,
        )
    if kind == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            num_hidden_layers=2,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=8,
            num_experts_per_tok=2,
            **common,
        )
    if kind == "deepseek_v3":
        common.pop("num_key_value_heads")
        return tf.DeepseekV3Config(
            num_hidden_layers=3,
            first_k_dense_replace=1,
            intermediate_size=128,
            moe_intermediate_size=32,
            n_routed_experts=16,
            n_shared_experts=1,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_rope_head_dim=64,
            qk_nope_head_dim=64,
            v_head_dim=64,
            num_key_value_heads=2,
            **common,
        )
    raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")


def write_tokenizer(out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(out)


def build(kind: str, out: str, *, dtype: str = "bfloat16", seed: int = 0) -> str:
    """Write a random checkpoint of ``kind`` into ``out`` (created); returns ``out``."""
    import torch
    import transformers as tf

    cfg = _config(kind, dtype)
    torch.manual_seed(seed)
    cls = {
        "mixtral": tf.MixtralForCausalLM,
        "qwen3_moe": tf.Qwen3MoeForCausalLM,
        "qwen3_moe_dense": tf.Qwen3MoeForCausalLM,
        "qwen2_moe": tf.Qwen2MoeForCausalLM,
        "deepseek_v3": tf.DeepseekV3ForCausalLM,
    }[kind]
    model = cls(cfg)
    with torch.no_grad():  # larger than init's 0.02 so routing and logits vary
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model = model.to(getattr(torch, dtype))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, f)
    return out


def prompts(n: int = 4, length: int = 12, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length + i)) for i in range(n)]
