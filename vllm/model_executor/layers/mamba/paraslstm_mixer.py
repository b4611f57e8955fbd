# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from dataclasses import replace

import torch
from torch.nn.parameter import Parameter

from vllm.compilation.breakable_cudagraph import eager_break_during_capture
from vllm.config import CacheConfig, VllmConfig, get_current_vllm_config
from vllm.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
)
from vllm.forward_context import ForwardContext, get_forward_context
from vllm.model_executor.custom_op import PluggableLayer
from vllm.model_executor.layers.linear import MergedColumnParallelLinear
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.model_executor.layers.mamba.ops.paraslstm import (
    paraslstm_scan,
    paraslstm_update,
    paraslstm_verify,
)
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils.torch_utils import (
    LayerNameType,
    _encode_layer_name,
    _resolve_layer_name,
    direct_register_custom_op,
)
from vllm.v1.attention.backends.paraslstm_attn import ParaSLSTMAttentionMetadata
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import KVCacheSpec, MambaSpec


@PluggableLayer.register("paraslstm_mixer")
class ParaSLSTMMixer(MambaBase, PluggableLayer):
    """sLSTM recurrence of a ParaSLSTM block, with a `(4, d)` state page
    `(c, n, m, h)` per sequence. Tensor parallelism shards the channels
    (whole heads for `mix="head"`) and gathers the output.
    """

    def __init__(
        self,
        hidden_size: int,
        mix: str,
        num_heads: int | None,
        max_recurrent_norm: float | None,
        cache_config: CacheConfig | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.mix = mix
        self.max_recurrent_norm = max_recurrent_norm
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.local_size = divide(hidden_size, self.tp_size)

        self.in_proj = MergedColumnParallelLinear(
            input_size=hidden_size,
            output_sizes=[hidden_size] * 4,
            bias=True,
            quant_config=quant_config,
            prefix=f"{prefix}.in_proj",
        )
        # The recurrent weights are small: float32 whatever the model dtype.
        if mix == "head":
            assert num_heads is not None
            head_dim = hidden_size // num_heads
            shape = (4, divide(num_heads, self.tp_size), head_dim, head_dim)
            self.R_head = Parameter(
                torch.empty(shape, dtype=torch.float32), requires_grad=False
            )
            set_weight_attrs(self.R_head, {"weight_loader": self._load_recurrent})
        else:
            self.R = Parameter(
                torch.empty(4, self.local_size, dtype=torch.float32),
                requires_grad=False,
            )
            set_weight_attrs(self.R, {"weight_loader": self._load_recurrent})

        compilation_config = get_current_vllm_config().compilation_config
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self
        self.kv_cache = (torch.tensor([]),)

        self.cache_config = cache_config
        self.prefix = prefix

    @property
    def recurrent_weight(self) -> torch.Tensor:
        return self.R_head if self.mix == "head" else self.R

    def _load_recurrent(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        # Dim 1 (channels of R, heads of R_head) is sharded by rank.
        shard = param.shape[1]
        full = (param.shape[0], shard * self.tp_size, *param.shape[2:])
        # copy_ would broadcast some wrong shapes silently.
        if tuple(loaded_weight.shape) != full:
            raise ValueError(f"expected shape {full}")
        weight = loaded_weight.narrow(1, self.tp_rank * shard, shard)
        if self.max_recurrent_norm is not None:
            weight = weight.clamp(-self.max_recurrent_norm, self.max_recurrent_norm)
        param.data.copy_(weight)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gates, _ = self.in_proj(hidden_states)
        output = torch.empty(
            hidden_states.shape[0],
            self.local_size,
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        torch.ops.vllm.paraslstm_mixer(gates, output, _encode_layer_name(self.prefix))
        if self.tp_size > 1:
            output = tensor_model_parallel_all_gather(output)
        return output

    def forward_impl(self, gates: torch.Tensor, output: torch.Tensor) -> None:
        forward_context: ForwardContext = get_forward_context()
        attn_metadata = forward_context.attn_metadata
        if attn_metadata is not None:
            assert isinstance(attn_metadata, dict)
            attn_metadata = attn_metadata.get(self.prefix)
        if attn_metadata is None:
            # Profile run, or this layer has no tokens: no state pages bound.
            output.zero_()
            return
        assert isinstance(attn_metadata, ParaSLSTMAttentionMetadata)

        state = self.kv_cache[0]
        num_decodes = attn_metadata.num_decode_tokens
        num_prefills = attn_metadata.num_prefill_tokens
        if num_decodes > 0 and attn_metadata.num_accepted_tokens is not None:
            # Speculative decoding: every decode row, drafts or none.
            assert attn_metadata.query_start_loc_d is not None
            assert attn_metadata.state_indices_tensor_d is not None
            paraslstm_verify(
                gates[:num_decodes],
                self.recurrent_weight,
                state,
                attn_metadata.query_start_loc_d,
                attn_metadata.state_indices_tensor_d,
                attn_metadata.num_accepted_tokens,
                output[:num_decodes],
            )
        elif num_decodes > 0:
            assert attn_metadata.state_indices_tensor_d is not None
            paraslstm_update(
                gates[:num_decodes],
                self.recurrent_weight,
                state,
                attn_metadata.state_indices_tensor_d[:num_decodes, 0],
                output[:num_decodes],
            )
        if num_prefills > 0:
            assert attn_metadata.query_start_loc_p is not None
            assert attn_metadata.state_indices_tensor_p is not None
            end = num_decodes + num_prefills
            checkpoint = attn_metadata.checkpoint_meta
            paraslstm_scan(
                gates[num_decodes:end],
                self.recurrent_weight,
                state,
                attn_metadata.query_start_loc_p,
                attn_metadata.state_indices_tensor_p,
                attn_metadata.has_initial_states_p,
                output[num_decodes:end],
                checkpoint_offsets=(
                    None if checkpoint is None else checkpoint.checkpoint_offsets
                ),
                checkpoint_state_indices=(
                    None if checkpoint is None else checkpoint.state_indices
                ),
            )

    def get_state_dtype(self) -> tuple[torch.dtype]:
        cache_config = self.cache_config
        return MambaStateDtypeCalculator.paraslstm_state_dtype(
            "auto" if cache_config is None else cache_config.mamba_ssm_cache_dtype
        )

    def get_state_shape(self) -> tuple[tuple[int, int]]:
        return MambaStateShapeCalculator.paraslstm_state_shape(
            tp_world_size=self.tp_size, hidden_size=self.hidden_size
        )

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec | None:
        spec = super().get_kv_cache_spec(vllm_config)
        if not isinstance(spec, MambaSpec):
            return spec
        # The scan writes the block-boundary state from inside the chunk
        # (checkpoint_meta), so align mode need not split a prompt there.
        return replace(
            spec, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
        )

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.PARASLSTM


@eager_break_during_capture
def paraslstm_mixer(
    gates: torch.Tensor,
    output: torch.Tensor,
    layer_name: LayerNameType,
) -> None:
    forward_context: ForwardContext = get_forward_context()
    self = forward_context.no_compile_layers[_resolve_layer_name(layer_name)]
    self.forward_impl(gates=gates, output=output)


direct_register_custom_op(
    op_name="paraslstm_mixer",
    op_func=paraslstm_mixer,
    mutates_args=["output"],
)
