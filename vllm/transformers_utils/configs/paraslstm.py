# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from transformers.configuration_utils import PreTrainedConfig

_SERVABLE_MIXES = ("diag", "head")


class ParaSLSTMConfig(PreTrainedConfig):
    r"""Configuration of a ParaSLSTM causal LM, as written by `pararnn-torch`.

    ParaSLSTM is an attention-free stack of pre-norm blocks, each an sLSTM
    recurrence (exponential gating, per-sequence state `(c, n, m, h)` of width
    `hidden_size`) followed by a SwiGLU MLP.

    The model has no positional encoding and no context limit, so the config
    deliberately exposes no max-length key: pass `max_model_len` to choose one.
    Training-solver fields (`newton_iters`, `scan_backend`, `picard_iters`)
    and the library's Mamba-shaped placeholders (`state_size`, `conv_kernel`,
    ...) are kept as given and do not affect inference.

    Args:
        vocab_size: Vocabulary size.
        hidden_size: Model width, also the recurrent width.
        num_hidden_layers: Number of blocks.
        mlp_ratio: SwiGLU expansion; sets `intermediate_size` when omitted.
        intermediate_size: SwiGLU hidden width, `int(mlp_ratio * hidden_size)`.
        max_recurrent_norm: Elementwise clamp of the recurrent weights to
            `[-max_recurrent_norm, max_recurrent_norm]`; `None` disables it.
        mix: `"diag"` (one recurrent weight per channel and gate) or `"head"`
            (a dense recurrent block per head).
        n_heads: Number of heads for `mix="head"`; must divide `hidden_size`.
        rms_norm_eps: Epsilon of every RMSNorm.
        tie_word_embeddings: Whether the LM head shares the embedding matrix.

    """

    model_type = "paraslstm"

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 512,
        num_hidden_layers: int = 6,
        mlp_ratio: float = 4.0,
        intermediate_size: int | None = None,
        max_recurrent_norm: float | None = 0.5,
        mix: str = "diag",
        n_heads: int | None = None,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = True,
        newton_iters: int = 3,
        scan_backend: str = "auto",
        picard_iters: int | None = None,
        **kwargs,
    ):
        for name, value in (
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_hidden_layers),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if mix == "dense":
            raise ValueError(
                "mix='dense' is pararnn-torch's test-only Jacobian oracle and "
                "cannot be served; use mix='diag' or mix='head'"
            )
        if mix not in _SERVABLE_MIXES:
            raise ValueError(f"mix must be one of {_SERVABLE_MIXES}, got {mix!r}")
        if mix == "head":
            if n_heads is None:
                raise ValueError("n_heads is required for mix='head', got None")
            if (
                isinstance(n_heads, bool)
                or not isinstance(n_heads, int)
                or n_heads < 1
                or hidden_size % n_heads != 0
            ):
                raise ValueError(
                    f"n_heads must be a positive integer dividing "
                    f"hidden_size={hidden_size}, got n_heads={n_heads!r}"
                )
        elif n_heads is not None:
            raise ValueError(f"n_heads is only used with mix='head', got {n_heads!r}")
        if not mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio!r}")
        expected_intermediate = int(mlp_ratio * hidden_size)
        if intermediate_size is None:
            intermediate_size = expected_intermediate
        if intermediate_size != expected_intermediate or expected_intermediate < 1:
            raise ValueError(
                f"intermediate_size={intermediate_size!r} is inconsistent with "
                f"mlp_ratio={mlp_ratio!r} and hidden_size={hidden_size} "
                f"(expected int(mlp_ratio * hidden_size)={expected_intermediate})"
            )
        if max_recurrent_norm is not None and not max_recurrent_norm > 0:
            raise ValueError(
                f"max_recurrent_norm must be > 0 or null, got {max_recurrent_norm!r}"
            )
        if not rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {rms_norm_eps!r}")

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.mlp_ratio = mlp_ratio
        self.intermediate_size = intermediate_size
        self.max_recurrent_norm = max_recurrent_norm
        self.mix = mix
        self.n_heads = n_heads
        self.rms_norm_eps = rms_norm_eps
        self.newton_iters = newton_iters
        self.scan_backend = scan_backend
        self.picard_iters = picard_iters
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def verify_tensor_parallel_size(self, tensor_parallel_size: int) -> None:
        """Raise a ValueError when the model cannot be sharded over
        `tensor_parallel_size` ranks.

        Tensor parallelism shards the recurrent channels (whole heads for
        `mix="head"`) and the MLP's hidden units, so each must divide evenly.
        """
        tp = tensor_parallel_size
        if self.mix == "head" and self.n_heads % tp != 0:
            raise ValueError(
                f"ParaSLSTM mix='head' shards whole heads: n_heads={self.n_heads} "
                f"is not divisible by tensor_parallel_size={tp}"
            )
        for name in ("hidden_size", "intermediate_size"):
            if getattr(self, name) % tp != 0:
                raise ValueError(
                    f"ParaSLSTM shards {name} over tensor-parallel ranks: "
                    f"{name}={getattr(self, name)} is not divisible by "
                    f"tensor_parallel_size={tp}"
                )
