# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from dataclasses import dataclass, replace
from typing import Any

import torch

from vllm.config import VllmConfig
from vllm.model_executor.layers.mamba.checkpoint import (
    MambaPrefillCheckpointBuilder,
    MambaPrefillCheckpointMetadata,
)
from vllm.v1.attention.backend import AttentionBackend, CommonAttentionMetadata
from vllm.v1.attention.backends.mamba_attn import (
    BaseMambaAttentionMetadata,
    BaseMambaAttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import MambaSpec


class ParaSLSTMAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "PARASLSTM_ATTN"

    @staticmethod
    def get_builder_cls() -> type["ParaSLSTMAttentionMetadataBuilder"]:
        return ParaSLSTMAttentionMetadataBuilder

    @classmethod
    def is_ssm(cls) -> bool:
        return True


@dataclass
class ParaSLSTMAttentionMetadata(BaseMambaAttentionMetadata):
    # Prefix caching: where the scan also writes each prefill row's state
    # inside its chunk, instead of a split chunk.
    checkpoint_meta: MambaPrefillCheckpointMetadata | None = None


class ParaSLSTMAttentionMetadataBuilder(
    BaseMambaAttentionMetadataBuilder[ParaSLSTMAttentionMetadata]
):
    metadata_cls = ParaSLSTMAttentionMetadata
    # No convolution state.
    needs_causal_conv1d_metadata = False
    # The verify kernel writes one state page per draft token.
    supports_spec_decode_metadata = True

    def __init__(
        self,
        kv_cache_spec: MambaSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.checkpoint_builder = MambaPrefillCheckpointBuilder(
            vllm_config, kv_cache_spec
        )

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
        *,
        num_accepted_tokens: torch.Tensor | None = None,
        num_decode_draft_tokens_cpu: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> ParaSLSTMAttentionMetadata:
        common = self._compute_common_metadata(
            common_attn_metadata,
            num_accepted_tokens=num_accepted_tokens,
            num_decode_draft_tokens_cpu=num_decode_draft_tokens_cpu,
        )
        if common.num_prefills == 0:
            return common
        first = common.num_reqs - common.num_prefills
        checkpoint = self.checkpoint_builder.build(
            common_attn_metadata, list(range(first, common.num_reqs))
        )
        return replace(common, checkpoint_meta=checkpoint)

    def update_block_table(
        self,
        metadata: ParaSLSTMAttentionMetadata,
        blk_table: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> ParaSLSTMAttentionMetadata:
        new_metadata = super().update_block_table(metadata, blk_table, slot_mapping)
        if metadata.checkpoint_meta is None:
            return new_metadata
        # Checkpoint pages are block-table entries: each group its own.
        return replace(
            new_metadata,
            checkpoint_meta=metadata.checkpoint_meta.regather_state_indices(blk_table),
        )
