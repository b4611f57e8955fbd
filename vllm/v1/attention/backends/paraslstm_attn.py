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
from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor
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
    # Speculative decoding: one-token prompts that the scheduler padded with
    # placeholder drafts are prefill rows, but the next step reads the state
    # after their accepted tokens, as after a verify step. The mixer reruns
    # them (their tokens in the prefill slice, rows of 1 + k tokens) from a
    # zero state to store the state after each token.
    padded_prompt_token_indices_p: torch.Tensor | None = None
    padded_prompt_query_start_loc: torch.Tensor | None = None
    padded_prompt_state_indices: torch.Tensor | None = None
    padded_prompt_num_accepted_tokens: torch.Tensor | None = None


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
        common = replace(common, checkpoint_meta=checkpoint)
        if num_decode_draft_tokens_cpu is None:
            return common
        return self._add_padded_prompts(
            common, common_attn_metadata, num_decode_draft_tokens_cpu
        )

    def _add_padded_prompts(
        self,
        common: ParaSLSTMAttentionMetadata,
        common_attn_metadata: CommonAttentionMetadata,
        num_decode_draft_tokens_cpu: torch.Tensor,
    ) -> ParaSLSTMAttentionMetadata:
        first = common.num_reqs - common.num_prefills
        query_start_loc_cpu = common_attn_metadata.query_start_loc_cpu[first:]
        query_lens = torch.diff(query_start_loc_cpu)
        seq_lens = common_attn_metadata.seq_lens_cpu_upper_bound
        assert seq_lens is not None
        num_drafts = num_decode_draft_tokens_cpu[first : common.num_reqs]
        padded = (
            (num_drafts > 0)
            & (query_lens == num_drafts + 1)
            & (seq_lens[first : common.num_reqs] == query_lens)
        )
        if not torch.any(padded).item():
            return common
        rows = padded.nonzero()[:, 0]
        starts = query_start_loc_cpu[rows] - common.num_decode_tokens
        lens = query_lens[rows]
        token_indices = torch.cat(
            [torch.arange(s, s + n) for s, n in zip(starts.tolist(), lens.tolist())]
        )
        query_start_loc = torch.zeros(len(rows) + 1, dtype=torch.int32)
        torch.cumsum(lens, 0, out=query_start_loc[1:])
        device = common_attn_metadata.query_start_loc.device
        state_indices = mamba_get_block_table_tensor(
            common_attn_metadata.block_table_tensor,
            common_attn_metadata.seq_lens,
            self.kv_cache_spec,
            self.vllm_config.cache_config.mamba_cache_mode,
        )
        if state_indices.dim() == 1:
            state_indices = state_indices.unsqueeze(-1)
        state_indices = state_indices[
            (first + rows).to(device), : 1 + self.num_spec_tokens
        ]
        return replace(
            common,
            padded_prompt_token_indices_p=token_indices.to(device, non_blocking=True),
            padded_prompt_query_start_loc=query_start_loc.to(device, non_blocking=True),
            padded_prompt_state_indices=state_indices,
            padded_prompt_num_accepted_tokens=torch.ones(
                len(rows), dtype=torch.int32, device=device
            ),
        )

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
