"""ModelConfig: every architectural choice of a SWAX model in one dataclass, validated on construction.

The paper (docs/design.md section 1) fixes the depth, width, layer ratio and windows; everything it leaves open
defaults to the xLSTM-7B block (section 3): SwiGLU FFN of width round_up(8/3 d, 64), mLSTM q/k at half width, gate
soft-cap 15, no biases except the gate pre-activations. The paper configs give attention heads of dim 128.

Decisions:
- The depth is the `pattern` string tiled over `n_layers` ("SX" x 12 = 24 layers for the 1.4B), so baselines and
  hybrids are one letter string away: S = sliding-window attention, X = mLSTM, A = full causal attention.
- `window` is the number of keys a query sees, the current token included (docs/design.md section 2); it is also the
  evaluation window. The training-time window is changed per step with `SWAXModel.set_window`, not here.
- Errors name the field and the allowed range, so a wrong YAML value is found at once.
- Fields that only pretrained imports use (swax_lightning/pretrained/hf_import.py: qkv_bias, qk_norm, rope_scale,
  max_positions, sliding_rope_theta, post_norms, ffn_activation, embed_scale) default to what every model trained
  here has (none, plain RoPE, no position limit, SwiGLU, unscaled embeddings), so they change no existing model or
  checkpoint.
- Plain Python (dataclasses, no Lightning or jsonargparse): an exported model imports it without either.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from swax_lightning.core.errors import ConfigError, require
from swax_lightning.kernels import backends
from swax_lightning.model.layers import LAYERS, kernels_used

# rope_scale types and the keys each takes besides `type`.
ROPE_SCALE_KEYS = {"linear": ("factor",), "dynamic": ("factor",),
                   "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
LOLCATS_FEATURE_INITS = ("identity", "kaiming")
FFN_ACTIVATIONS = ("silu", "gelu_tanh")


def round_up(x: float, multiple: int) -> int:
    return int(-(-x // multiple) * multiple)


@dataclass
class ModelConfig:
    """Architecture of a SWAX language model.

    Args:
        vocab_size: Number of token ids (at least the tokenizer's vocabulary; round up to a multiple of 64 on GPU).
        d_model: Residual stream width.
        n_layers: Number of blocks; a multiple of len(pattern).
        pattern: Layer kinds tiled over the depth: S = sliding-window attention, X = mLSTM, A = full attention,
            D = Gated DeltaNet, L = LoLCATs (linear attention + a softmax window). "SX" is SWAX (SWA first, then
            mLSTM, 1:1).
        n_heads: Attention query heads. d_model need not equal n_heads * head_dim, but n_heads must divide d_model
            when head_dim is left empty.
        n_kv_heads: Attention key/value heads (GQA); empty = n_heads. Must divide n_heads.
        head_dim: Attention head dimension; empty = d_model // n_heads.
        window: Sliding-window size W in keys, the current token included (W >= sequence length = full attention).
        n_sink: Sink tokens: the first n_sink positions stay visible to every query of an S layer (0 = none).
        rope_theta: RoPE base; positions are absolute.
        sliding_rope_theta: RoPE base of the sliding-window (S) layers when it differs from the full-attention
            layers' (Gemma 3: 10,000 for its local layers, 1,000,000 for its global ones); those layers then use
            plain RoPE (no rope_scale). Empty = rope_theta for every layer.
        rope_scale: RoPE frequency scaling of a pretrained model (transformers' rope_type, named rope_scale because
            transformers' configs reserve rope_scaling), empty = none. {type: linear, factor}: every frequency
            divided by factor. {type: llama3, factor, low_freq_factor, high_freq_factor,
            original_max_position_embeddings}: Llama 3.1's rule (long wavelengths divided by factor, short ones
            kept, a smooth blend between). {type: dynamic, factor}: dynamic NTK; a forward call whose largest position
            p reaches max_positions uses the base theta * (factor * (p + 1) / max_positions - (factor - 1)) **
            (head_dim / (head_dim - 2)) (transformers' rule), so needs max_positions.
        max_positions: Positions the model was trained on (a pretrained model's max_position_embeddings); empty = no
            limit. A window larger than this (here or as an inference override) is refused.
        qkv_bias: Biases on the attention's q, k and v projections (Qwen2); the output projection never has one.
        qk_norm: RMSNorm of each query and key head (one weight of head_dim shared by the heads) before RoPE (Qwen3).
        ffn_dim: Gated feed-forward hidden width; empty = round_up(8/3 * d_model, 64).
        ffn_activation: The feed-forward's gate activation: silu (SwiGLU, every model trained here) or gelu_tanh
            (GeGLU with the tanh approximation of GELU: Gemma).
        post_norms: An RMSNorm on the mixer's output and one on the feed-forward's output, before each residual add
            (Gemma 2 and 3: four norms per block).
        embed_scale: The token embeddings are multiplied by this before the first block (Gemma: sqrt(d_model)).
        mlstm_heads: mLSTM heads (xLSTM-7B: 8).
        mlstm_qk_factor: q/k width of the mLSTM as a fraction of d_model (xLSTM-7B: 0.5).
        mlstm_v_factor: v width of the mLSTM as a fraction of d_model (xLSTM-7B: 1.0).
        mlstm_norm: The mLSTM's per-head output norm: layernorm (xLSTM-7B: mean subtracted, fp32, weight, no bias)
            or rmsnorm (no mean subtracted; kept for comparison with earlier runs).
        mlstm_recompute_states: The Triton mLSTM recomputes the state entering every chunk in its backward instead
            of saving it: B*H*(T/chunk_size)*DQK*DV fp32 less per mLSTM layer, one more pass of its states kernel.
        gate_soft_cap: mLSTM gate pre-activations are capped as cap * tanh(x / cap); 0 disables.
        deltanet_heads: Gated DeltaNet heads.
        deltanet_qk_factor: q/k width of Gated DeltaNet as a fraction of d_model.
        deltanet_v_factor: v width of Gated DeltaNet as a fraction of d_model.
        deltanet_conv: Kernel size of Gated DeltaNet's short causal convolutions on q, k and v (depthwise, SiLU);
            0 = none. Its authors use 4 and call them crucial; the SD baseline configs use 4.
        attention_conv: The same short convolutions on the attention layers' (S and A) q, k and v; 0 = none (the
            paper's SWA). With them one attention layer can look a value up by the key before it (attention.py).
        chunk_size: Chunk length of the chunkwise mLSTM and Gated DeltaNet forms.
        lolcats_window: Block length of the LoLCATs (L) layer's terraced softmax window: a query in block t // W sees
            its own block up to itself and the previous block with softmax (W + 1 .. 2 W keys), every earlier key
            through its linear attention (LoLCATs: 64); and the sliding window (W recent keys plus window_sinks sinks)
            of the window + linear layers G and M (window_linear.py).
        window_sinks: Sink tokens of the G and M layers' window (4: a silent linear part leaves exactly the
            training-free SWA(W, 4 sinks); without sinks a 64-key window alone is 4x further from SmolLM2's layers).
        lolcats_feature_dim: Hedgehog feature dimension F of the L layer's q and k maps, per head (2 F features:
            softmax of x W and of -x W; LoLCATs: 64).
        lolcats_feature_init: Initialisation of the L layer's feature-map matrices [head_dim, F]: identity (every
            command in LoLCATs' README passes --lk_zero_init, which with no skip connection sets each head's matrix
            to the identity: the published runs) or kaiming (kaiming_uniform_, their config files' default).
        norm_eps: Epsilon of every norm.
        logit_soft_cap: Output logits are capped as cap * tanh(x / cap); 0 disables (xLSTM-7B: 30).
        tie_embeddings: Share the input embedding and the LM head weights.
        init_std: Std of the normal init of linear and embedding weights; residual output projections are further
            scaled by 1 / sqrt(2 * n_layers) (GPT-2).
        igate_bias_init: Initial bias of the mLSTM input gate (xLSTM-7B: -10).
        fgate_bias_init: (low, high): the mLSTM forget-gate biases are spread linearly over the heads (xLSTM: 3..6).
        kernels: Compute backend per operation, e.g. {attention: flash, mlstm: triton}; omitted operations are
            `auto`. attention: auto|torch|triton|flash|flex|sdpa, mlstm: auto|torch|triton|tfla, deltanet:
            auto|torch|fla (kernels/backends.py says what auto picks). The environment variable
            SWAX_KERNELS=auto|torch|triton overrides every operation. A run-time choice: it changes no weight.
    """

    vocab_size: int = 257
    d_model: int = 256
    n_layers: int = 4
    pattern: str = "SX"
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    window: int = 2048
    n_sink: int = 0
    rope_theta: float = 10000.0
    rope_scale: dict | None = None
    sliding_rope_theta: float | None = None
    max_positions: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    ffn_dim: int | None = None
    ffn_activation: str = "silu"
    post_norms: bool = False
    embed_scale: float = 1.0
    mlstm_heads: int = 4
    mlstm_qk_factor: float = 0.5
    mlstm_v_factor: float = 1.0
    mlstm_norm: str = "layernorm"
    mlstm_recompute_states: bool = False
    gate_soft_cap: float = 15.0
    deltanet_heads: int = 4
    deltanet_qk_factor: float = 0.5
    deltanet_v_factor: float = 1.0
    deltanet_conv: int = 0
    attention_conv: int = 0
    chunk_size: int = 64
    lolcats_window: int = 64
    window_sinks: int = 4
    lolcats_feature_dim: int = 64
    lolcats_feature_init: str = "identity"
    norm_eps: float = 1e-6
    logit_soft_cap: float = 30.0
    tie_embeddings: bool = False
    init_std: float = 0.02
    igate_bias_init: float = -10.0
    fgate_bias_init: tuple[float, float] = field(default=(3.0, 6.0))
    kernels: dict = field(default_factory=lambda: dict(backends.DEFAULTS))

    def __post_init__(self) -> None:
        self.fgate_bias_init = tuple(self.fgate_bias_init)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "window", "mlstm_heads", "deltanet_heads",
                     "chunk_size", "lolcats_window", "lolcats_feature_dim"):
            require(getattr(self, name) >= 1, f"ModelConfig.{name}", "must be >= 1", getattr(self, name))
        require(self.n_sink >= 0, "ModelConfig.n_sink", "must be >= 0", self.n_sink)
        require(self.window_sinks >= 0, "ModelConfig.window_sinks", "must be >= 0", self.window_sinks)
        for name in ("deltanet_conv", "attention_conv"):
            require(getattr(self, name) >= 0, f"ModelConfig.{name}", "must be >= 0 (0 = no short convolutions)",
                    getattr(self, name))
        letters = {letter: kind.name for letter, kind in LAYERS.items()}
        require(len(self.pattern) >= 1 and set(self.pattern) <= set(LAYERS), "ModelConfig.pattern",
                f"letters must be from {letters}", self.pattern)
        require(self.n_layers % len(self.pattern) == 0, "ModelConfig.n_layers",
                f"must be a multiple of len(pattern)={len(self.pattern)}", self.n_layers)
        if self.head_dim is None:
            require(self.d_model % self.n_heads == 0, "ModelConfig.d_model",
                    f"must be divisible by n_heads={self.n_heads} (or set head_dim)", self.d_model)
        else:
            require(self.head_dim >= 1 and self.head_dim % 2 == 0, "ModelConfig.head_dim",
                    "must be even and >= 2 (RoPE)", self.head_dim)
        require(self.attn_head_dim % 2 == 0, "ModelConfig.d_model", "d_model / n_heads must be even (RoPE)",
                self.d_model)
        require(self.n_kv_heads is None or (self.n_kv_heads >= 1 and self.n_heads % self.n_kv_heads == 0),
                "ModelConfig.n_kv_heads", f"must be >= 1 and divide n_heads={self.n_heads}", self.n_kv_heads)
        for name, heads in (("mlstm_qk_factor", "mlstm_heads"), ("mlstm_v_factor", "mlstm_heads"),
                            ("deltanet_qk_factor", "deltanet_heads"), ("deltanet_v_factor", "deltanet_heads")):
            width, n = getattr(self, name) * self.d_model, getattr(self, heads)
            require(width >= n and width == int(width) and int(width) % n == 0, f"ModelConfig.{name}",
                    f"{name} * d_model must be a whole multiple of {heads}={n}", getattr(self, name))
        for name in ("gate_soft_cap", "logit_soft_cap", "rope_theta", "init_std"):
            require(getattr(self, name) >= 0, f"ModelConfig.{name}", "must be >= 0", getattr(self, name))
        require(self.norm_eps > 0, "ModelConfig.norm_eps", "must be > 0", self.norm_eps)
        require(self.sliding_rope_theta is None or self.sliding_rope_theta > 0, "ModelConfig.sliding_rope_theta",
                "must be > 0 or empty", self.sliding_rope_theta)
        require(self.embed_scale > 0, "ModelConfig.embed_scale", "must be > 0", self.embed_scale)
        require(self.ffn_activation in FFN_ACTIVATIONS, "ModelConfig.ffn_activation",
                f"must be one of {FFN_ACTIVATIONS}", self.ffn_activation)
        require(self.ffn_dim is None or self.ffn_dim >= 1, "ModelConfig.ffn_dim", "must be >= 1 or empty", self.ffn_dim)
        require(self.mlstm_norm in ("layernorm", "rmsnorm"), "ModelConfig.mlstm_norm", "must be layernorm or rmsnorm",
                self.mlstm_norm)
        require(self.lolcats_feature_init in LOLCATS_FEATURE_INITS, "ModelConfig.lolcats_feature_init",
                f"must be one of {LOLCATS_FEATURE_INITS}", self.lolcats_feature_init)
        require(len(self.fgate_bias_init) == 2, "ModelConfig.fgate_bias_init", "must be a pair (low, high)",
                self.fgate_bias_init)
        require(self.max_positions is None or self.max_positions >= 1, "ModelConfig.max_positions",
                "must be >= 1 or empty",
                self.max_positions)
        require(self.max_positions is None or self.window <= self.max_positions, "ModelConfig.window",
                f"must be <= max_positions={self.max_positions} (the positions the model was trained on)",
                self.window)
        self._check_rope_scale()
        self._check_kernels()

    def _check_rope_scale(self) -> None:
        if self.rope_scale is None:
            return
        scale = self.rope_scale
        require(isinstance(scale, dict) and scale.get("type") in ROPE_SCALE_KEYS, "ModelConfig.rope_scale",
                f"must be empty or a mapping with type one of {sorted(ROPE_SCALE_KEYS)}", scale)
        keys = ROPE_SCALE_KEYS[scale["type"]]
        require(set(scale) == {"type", *keys}, "ModelConfig.rope_scale",
                f"of type {scale['type']} takes exactly the keys type, {', '.join(keys)}", scale)
        require(all(isinstance(scale[k], (int, float)) and scale[k] > 0 for k in keys), "ModelConfig.rope_scale",
                "values must be numbers > 0", scale)
        if scale["type"] == "llama3":
            require(scale["high_freq_factor"] > scale["low_freq_factor"], "ModelConfig.rope_scale",
                    "high_freq_factor must be > low_freq_factor", scale)
        if scale["type"] == "dynamic":
            require(self.max_positions is not None, "ModelConfig.max_positions",
                    "must be set for rope_scale type dynamic",
                    self.max_positions)

    def _check_kernels(self) -> None:
        """Every backend constraint (installed, head dims, sinks, chunk size), checked only for the layer kinds the
        pattern uses, so a CPU-only config never trips over a GPU backend it does not use."""
        require(isinstance(self.kernels, dict), "ModelConfig.kernels", "must be a mapping operation -> backend",
                self.kernels)
        self.kernels = {**backends.DEFAULTS, **self.kernels}
        used = kernels_used(self.pattern)
        sliding = any(LAYERS[letter].options.get("sliding") for letter in self.pattern)
        problems = backends.check_choices(
            self.kernels, uses_attention="attention" in used, uses_mlstm="mlstm" in used,
            attn_head_dim=self.attn_head_dim, n_sink=self.n_sink if sliding else 0,
            mlstm_qk_head_dim=int(self.mlstm_qk_factor * self.d_model) // self.mlstm_heads,
            mlstm_v_head_dim=int(self.mlstm_v_factor * self.d_model) // self.mlstm_heads, chunk_size=self.chunk_size,
            uses_deltanet="deltanet" in used)
        if problems:
            name, message = problems[0]
            raise ConfigError(f"ModelConfig.{name}: {message}")

    def check_run(self, device_type: str, precision: str, training: bool) -> None:
        """Refuses a backend the run cannot use on its trainer's device ("cpu", "cuda") and precision (Lightning's,
        e.g. "32-true", "bf16-mixed"): one ConfigError naming the field (backends.check_run)."""
        used = kernels_used(self.pattern)
        problems = backends.check_run(
            self.kernels, uses_attention="attention" in used, uses_mlstm="mlstm" in used,
            uses_deltanet="deltanet" in used,
            attn_head_dim=self.attn_head_dim, on_cuda=device_type == "cuda",
            fp32=str(precision).startswith(("32", "64")), training=training)
        if problems:
            name, message = problems[0]
            raise ConfigError(f"ModelConfig.{name}: {message}")

    @property
    def layer_kinds(self) -> str:
        """The pattern tiled over the depth, one letter per block."""
        return self.pattern * (self.n_layers // len(self.pattern))

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_width(self) -> int:
        return self.ffn_dim or round_up(8 / 3 * self.d_model, 64)
