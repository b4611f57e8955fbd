# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from transformers.configuration_utils import PreTrainedConfig


class ParaSLSTMConfig(PreTrainedConfig):
    """Config of a ParaSLSTM causal LM, as written by `pararnn-torch`.

    The model has no positions and no length limit, so there is no max-length
    key. Other fields the library writes (training-solver settings, Mamba-shaped
    placeholders) are kept as given and do not affect inference.
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
        if mix not in ("diag", "head"):
            raise ValueError(f"mix must be one of ('diag', 'head'), got {mix!r}")
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
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
