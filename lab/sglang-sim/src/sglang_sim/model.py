"""What the simulator reads from a model's config.json: the shapes that size memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    full_attention_layers: int
    linear_attention_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    context_length: int
    dtype: str
    tie_word_embeddings: bool
    # Gated DeltaNet (linear attention) layout; zero for models without it.
    linear_key_heads: int
    linear_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel: int
    mamba_ssm_dtype: str
    mtp_layers: int
    vision_params: int
    eos_token_id: int

    @property
    def is_hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    def param_count(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        full = h * (2 * q) + 2 * h * kv + q * h  # gated q, k, v, o
        key = self.linear_key_heads * self.linear_key_head_dim
        value = self.linear_value_heads * self.linear_value_head_dim
        linear = h * (2 * key + 2 * value) + h * 2 * self.linear_value_heads + value * h
        mlp = 3 * h * i
        layers = (self.full_attention_layers * full + self.linear_attention_layers * linear
                  + self.num_layers * mlp)
        mtp = self.mtp_layers * (full + mlp + 2 * h * h)
        return embed + layers + mtp + self.vision_params

    def weight_bytes(self, tp: int) -> int:
        return self.param_count() * BYTES.get(self.dtype, 2) // tp

    def kv_bytes_per_token(self, tp: int) -> int:
        heads = max(1, self.num_kv_heads // tp)
        return self.full_attention_layers * 2 * heads * self.head_dim * BYTES.get(self.dtype, 2)

    def conv_bytes_per_slot(self, tp: int) -> int:
        conv_dim = (2 * self.linear_key_heads * self.linear_key_head_dim
                    + self.linear_value_heads * self.linear_value_head_dim) // tp
        return self.linear_attention_layers * conv_dim * (self.linear_conv_kernel - 1) \
            * BYTES.get(self.dtype, 2)

    def ssm_bytes_per_slot(self, tp: int) -> int:
        heads = max(1, self.linear_value_heads // tp)
        return (self.linear_attention_layers * heads * self.linear_key_head_dim
                * self.linear_value_head_dim * BYTES.get(self.mamba_ssm_dtype, 4))


def _get(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    text = cfg.get("text_config") or {}
    return text.get(key, cfg.get(key, default))


def load(model_path: str) -> ModelShape:
    """Read ``<model_path>/config.json``; OSError or ValueError as transformers would raise."""
    path = Path(model_path) / "config.json"
    cfg: dict[str, Any] = json.loads(path.read_text())
    layers = int(_get(cfg, "num_hidden_layers"))
    layer_types = _get(cfg, "layer_types")
    if layer_types is None and _get(cfg, "full_attention_interval"):
        interval = int(_get(cfg, "full_attention_interval"))
        layer_types = ["full_attention" if (n + 1) % interval == 0 else "linear_attention"
                       for n in range(layers)]
    layer_types = layer_types or ["full_attention"] * layers
    full = sum(1 for t in layer_types if t == "full_attention")
    heads = int(_get(cfg, "num_attention_heads"))
    hidden = int(_get(cfg, "hidden_size"))
    vision = cfg.get("vision_config") or {}
    vision_params = 0
    if vision:
        vh = int(vision.get("hidden_size", 0))
        vision_params = int(vision.get("depth", 0)) * (4 * vh * vh + 2 * vh *
                                                        int(vision.get("intermediate_size", 0)))
    eos = _get(cfg, "eos_token_id", 0)
    return ModelShape(
        architecture=cfg["architectures"][0],
        model_type=cfg.get("model_type", ""),
        hidden_size=hidden,
        num_layers=layers,
        full_attention_layers=full,
        linear_attention_layers=layers - full,
        num_heads=heads,
        num_kv_heads=int(_get(cfg, "num_key_value_heads", heads)),
        head_dim=int(_get(cfg, "head_dim", hidden // heads)),
        intermediate_size=int(_get(cfg, "intermediate_size", 4 * hidden)),
        vocab_size=int(_get(cfg, "vocab_size")),
        context_length=int(_get(cfg, "max_position_embeddings", 4096)),
        dtype=str(_get(cfg, "dtype") or _get(cfg, "torch_dtype") or "bfloat16"),
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", False)),
        linear_key_heads=int(_get(cfg, "linear_num_key_heads", 0)),
        linear_value_heads=int(_get(cfg, "linear_num_value_heads", 0)),
        linear_key_head_dim=int(_get(cfg, "linear_key_head_dim", 0)),
        linear_value_head_dim=int(_get(cfg, "linear_value_head_dim", 0)),
        linear_conv_kernel=int(_get(cfg, "linear_conv_kernel_dim", 4)),
        mamba_ssm_dtype=str(_get(cfg, "mamba_ssm_dtype", "float32")),
        mtp_layers=int(_get(cfg, "mtp_num_hidden_layers", 0)),
        vision_params=vision_params,
        eos_token_id=int(eos[0] if isinstance(eos, list) else eos or 0),
    )
