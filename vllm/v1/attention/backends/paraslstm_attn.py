# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from dataclasses import dataclass
from typing import Any

from vllm.v1.attention.backend import AttentionBackend, CommonAttentionMetadata
from vllm.v1.attention.backends.mamba_attn import (
    BaseMambaAttentionMetadata,
    BaseMambaAttentionMetadataBuilder,
)


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
    pass


class ParaSLSTMAttentionMetadataBuilder(
    BaseMambaAttentionMetadataBuilder[ParaSLSTMAttentionMetadata]
):
    """Decode-first split and state indices of the Mamba base builder.

    ParaSLSTM has no convolution state, so the causal-conv1d metadata is
    not computed.
    """

    metadata_cls = ParaSLSTMAttentionMetadata
    needs_causal_conv1d_metadata = False

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
        **kwargs: Any,
    ) -> ParaSLSTMAttentionMetadata:
        return self._compute_common_metadata(common_attn_metadata)
