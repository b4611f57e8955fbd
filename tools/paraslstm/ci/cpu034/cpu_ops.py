# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Torch ports of the vLLM 0.34.0 CPU ops that the 0.32.0 `_C` lacks.

Ported from csrc/cpu/{block_table,input_batch,sampling_kernels}.cpp and
csrc/cpu/sampling/common.h; schemas from csrc/cpu/torch_bindings.cpp.
Importing this module registers each op that `torch.ops._C` does not have yet.
"""

import torch

_I64 = torch.int64
_M32 = 0xFFFFFFFF
_DRAFT_NOISE_SALT = 1 << 30


def _segments(starts: torch.Tensor, ends: torch.Tensor):
    """Per element of the ranges [starts[i], ends[i]): (i, offset, index)."""
    starts, ends = starts.to(_I64), ends.to(_I64)
    lens = (ends - starts).clamp(min=0)
    seg = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    first = torch.cumsum(lens, 0) - lens
    off = torch.arange(seg.numel()) - first[seg]
    return seg, off, starts[seg] + off


def _query_tokens(idx_mapping: torch.Tensor, query_start_loc: torch.Tensor):
    qsl = query_start_loc[: idx_mapping.numel() + 1].to(_I64)
    return _segments(qsl[:-1], qsl[1:])


def gather_block_table_cpu(
    block_table, output, idx_mapping, num_blocks, num_reqs_padded
):
    num_reqs = idx_mapping.numel()
    if num_reqs:
        seg, off, _ = _segments(
            torch.zeros(num_reqs, dtype=_I64), num_blocks[idx_mapping]
        )
        output[seg, off] = block_table[idx_mapping[seg], off]
    output[num_reqs:num_reqs_padded].zero_()


def compute_slot_mapping_cpu(
    block_table,
    slot_mapping,
    idx_mapping,
    query_start_loc,
    positions,
    block_size,
    mapping_enabled,
    pad_slot_id,
):
    num_reqs = idx_mapping.numel()
    num_tokens = int(query_start_loc[num_reqs])
    slot_mapping[num_tokens:].fill_(pad_slot_id)
    seg, _, tok = _query_tokens(idx_mapping, query_start_loc)
    req = idx_mapping[seg]
    valid = req >= 0 if mapping_enabled else torch.zeros_like(req, dtype=torch.bool)
    pos = torch.where(valid, positions[tok], 0)
    block = block_table[
        req.clamp(min=0), torch.div(pos, block_size, rounding_mode="trunc")
    ]
    slots = block.to(_I64) * block_size + torch.fmod(pos, block_size)
    slot_mapping[tok] = torch.where(valid, slots, pad_slot_id)


def prepare_prefill_inputs_cpu(
    input_ids,
    next_prefill_tokens,
    idx_mapping,
    query_start_loc,
    all_token_ids,
    prefill_len,
    num_computed_tokens,
):
    num_reqs = idx_mapping.numel()
    qsl = query_start_loc[: num_reqs + 1].to(_I64)
    computed = num_computed_tokens[idx_mapping].to(_I64)
    prefill = prefill_len[idx_mapping].to(_I64)
    todo = computed < prefill
    if not bool(todo.any()):
        return
    reqs = idx_mapping[todo]
    seg, off, tok = _segments(qsl[:-1][todo], qsl[1:][todo])
    input_ids[tok] = all_token_ids[reqs[seg], computed[todo][seg] + off]

    lookahead = torch.arange(next_prefill_tokens.size(0))
    pos = (computed + qsl[1:] - qsl[:-1])[todo].unsqueeze(1) + lookahead
    in_prompt = pos < prefill[todo].unsqueeze(1)
    col = torch.where(in_prompt, pos, 0)
    tokens = torch.where(in_prompt, all_token_ids[reqs.unsqueeze(1), col], 0)
    next_prefill_tokens[lookahead.unsqueeze(0), reqs.unsqueeze(1)] = tokens.to(
        next_prefill_tokens.dtype
    )


def get_prompt_logprobs_token_ids_cpu(
    num_tokens, query_start_loc, idx_mapping, num_computed_tokens, all_token_ids
):
    token_ids = torch.zeros(num_tokens, dtype=_I64)
    seg, off, tok = _query_tokens(idx_mapping, query_start_loc)
    req = idx_mapping[seg]
    col = num_computed_tokens[req].to(_I64) + 1 + off
    inside = col < all_token_ids.size(1)
    token_ids[tok] = torch.where(
        inside, all_token_ids[req, torch.where(inside, col, 0)].to(_I64), 0
    )
    return token_ids


def prepare_pos_seq_lens_cpu(
    idx_mapping, query_start_loc, num_computed_tokens, pos, seq_lens
):
    num_reqs = idx_mapping.numel()
    qsl = query_start_loc[: num_reqs + 1]
    computed = num_computed_tokens[idx_mapping]
    seq_lens[num_reqs:].zero_()
    seq_lens[:num_reqs] = computed + (qsl[1:] - qsl[:-1]).to(computed.dtype)
    seg, off, tok = _query_tokens(idx_mapping, query_start_loc)
    pos[tok] = computed[seg].to(_I64) + off


def prepare_mrope_positions_cpu(
    positions,
    prefill_positions,
    prefill_delta,
    idx_mapping,
    query_start_loc,
    prefill_lens,
    num_computed_tokens,
):
    num_dims = positions.size(0)
    seg, off, tok = _query_tokens(idx_mapping, query_start_loc)
    req = idx_mapping[seg]
    qsl = query_start_loc[: idx_mapping.numel() + 1].to(_I64)
    query_len = (qsl[1:] - qsl[:-1])[seg]
    computed = num_computed_tokens[req].to(_I64)
    prompt_len = torch.minimum(
        query_len, (prefill_lens[req].to(_I64) - computed).clamp(min=0)
    )
    in_prompt = off < prompt_len
    rows = req.unsqueeze(0) * num_dims + torch.arange(num_dims).unsqueeze(1)
    prompt = prefill_positions[rows, torch.where(in_prompt, computed + off, 0)]
    decode = computed + off + prefill_delta[req].to(_I64)
    positions[:, tok] = torch.where(in_prompt, prompt.to(_I64), decode)


def _column0(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 1 else t.flatten(1)[:, 0]


def combine_sampled_and_draft_tokens_cpu(
    input_ids,
    idx_mapping,
    last_sampled_tokens,
    query_start_loc,
    seq_lens,
    prefill_len,
    draft_tokens,
    cu_num_logits,
    num_logits,
    num_new_sampled_tokens,
):
    num_reqs = idx_mapping.numel()
    logits_indices = torch.zeros(num_logits, dtype=_I64)
    cu = cu_num_logits[: num_reqs + 1].to(_I64)
    query_end = query_start_loc[1 : num_reqs + 1].to(_I64)
    req_num_logits = cu[1:] - cu[:-1]
    logits_start = query_end - req_num_logits
    seg, off, idx = _segments(cu[:-1], cu[1:])
    logits_indices[idx] = logits_start[seg] + off

    seq_len = seq_lens[:num_reqs].to(_I64)
    prefill = prefill_len[idx_mapping].to(_I64)
    decoding = seq_len > prefill
    if num_new_sampled_tokens > 0:
        put = decoding & (seq_len - req_num_logits >= prefill)
        input_ids[logits_start[put]] = _column0(last_sampled_tokens)[
            idx_mapping[put]
        ].to(input_ids.dtype)
    num_draft = torch.where(decoding, req_num_logits - num_new_sampled_tokens, 0)
    seg, off, tok = _segments(query_end - num_draft.clamp(min=0), query_end)
    input_ids[tok] = draft_tokens[idx_mapping[seg], off].to(input_ids.dtype)
    return logits_indices


def post_update_cpu(
    idx_mapping,
    num_computed_tokens,
    last_sampled_tokens,
    output_bin_counts,
    sampled_tokens,
    num_sampled,
    num_rejected,
    query_start_loc,
    all_token_ids,
    total_len,
):
    num_reqs = idx_mapping.numel()
    batch = torch.nonzero(idx_mapping >= 0).flatten()
    req = idx_mapping[batch]
    count = num_sampled[batch].to(_I64)
    old_total = total_len[req].to(_I64)

    has = count > 0
    last = sampled_tokens[batch[has], count[has] - 1]
    _column0(last_sampled_tokens)[req[has]] = last.to(last_sampled_tokens.dtype)
    total_len[req[has]] = (old_total + count)[has].to(total_len.dtype)

    seg, off, _ = _segments(torch.zeros_like(count), count)
    tokens = sampled_tokens[batch[seg], off]
    all_token_ids[req[seg], old_total[seg] + off] = tokens.to(all_token_ids.dtype)
    if output_bin_counts is not None:
        output_bin_counts.index_put_(
            (req[seg], tokens),
            torch.ones_like(tokens, dtype=output_bin_counts.dtype),
            accumulate=True,
        )

    if query_start_loc is None:
        query_len = torch.zeros(num_reqs, dtype=_I64)
    else:
        qsl = query_start_loc[: num_reqs + 1].to(_I64)
        query_len = qsl[1:] - qsl[:-1]
    delta = (query_len - num_rejected[:num_reqs].to(_I64))[batch]
    num_computed_tokens.index_put_(
        (req,), delta.to(num_computed_tokens.dtype), accumulate=True
    )


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 for x < 2**32 without int64 overflow.
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _rotl32(x: torch.Tensor, shift: int) -> torch.Tensor:
    return ((x << shift) | (x >> (32 - shift))) & _M32


def _murmur3_key(key: torch.Tensor) -> torch.Tensor:
    return _mul32(_rotl32(_mul32(key, 0xCC9E2D51), 15), 0x1B873593)


def _murmur3_mix(h: torch.Tensor, scrambled_key: torch.Tensor) -> torch.Tensor:
    return (_rotl32(h ^ scrambled_key, 13) * 5 + 0xE6546B64) & _M32


def _murmur3_hash32(prefix: torch.Tensor, token_keys: torch.Tensor) -> torch.Tensor:
    h = _murmur3_mix(prefix, token_keys) ^ 16
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


def _murmur3_prefix(seeds: torch.Tensor, positions: torch.Tensor, domain: int):
    h = torch.full_like(seeds, domain)
    h = _murmur3_mix(h, _murmur3_key(seeds & _M32))
    h = _murmur3_mix(h, _murmur3_key((seeds >> 32) & _M32))
    return _murmur3_mix(h, _murmur3_key(positions & _M32)).unsqueeze(1)


def _log1p_neg_stable(value: torch.Tensor) -> torch.Tensor:
    polynomial = torch.full_like(value, 1.0 / 8.0)
    for denominator in range(7, 1, -1):
        polynomial = 1.0 / denominator + value * polynomial
    series = -value * (1.0 + value * polynomial)
    direct = torch.log(torch.clamp(1.0 - value, min=2.0**-24))
    return torch.where(value < 0.25, series, direct)


def _gumbel_noise(seeds, positions, token_keys: torch.Tensor, use_fp64: bool):
    low = _murmur3_hash32(_murmur3_prefix(seeds, positions, 0), token_keys)
    if use_fp64:
        high = _murmur3_hash32(
            _murmur3_prefix(seeds, positions, 0x9E3779B9), token_keys
        )
        random53 = (high << 21) | (low >> 11)
        uniform = (random53.to(torch.float64) + 0.5) * 2.0**-53
        uniform = torch.where(uniform == 1.0, uniform - 2.0**-53, uniform)
        return -torch.log(-torch.log(uniform))
    high16 = (low >> 16).to(torch.float32)
    low16 = (low & 0xFFFF).to(torch.float32)
    uniform = high16 * 1.52587890625e-05 + (low16 + 0.5) * 2.3283064365386963e-10
    return -torch.log(-_log1p_neg_stable(uniform))


def _first_argmax(scores: torch.Tensor) -> torch.Tensor:
    # First maximal index; NaN never wins and a row with no score above -inf
    # gives 0, as in the C++ strict `score > best` scan.
    return torch.where(torch.isnan(scores), float("-inf"), scores).argmax(dim=-1)


def gumbel_sample_cpu(
    logits,
    expanded_idx_mapping,
    temperature,
    seeds,
    positions,
    apply_temperature,
    is_drafting,
    use_fp64,
):
    assert logits.dim() == 2 and logits.stride(1) == 1
    num_tokens, vocab_size = logits.shape
    output = torch.empty(num_tokens, dtype=_I64)
    if num_tokens == 0:
        return output
    req = expanded_idx_mapping[:num_tokens]
    valid = req >= 0
    temp = torch.where(valid, temperature[req.clamp(min=0)], 0.0)
    greedy = torch.nonzero(temp == 0.0).flatten()
    if greedy.numel():
        output[greedy] = _first_argmax(logits[greedy].float())
    sampled = torch.nonzero(temp != 0.0).flatten()
    chunk = max(1, (1 << 20) // vocab_size)
    token_keys = _murmur3_key(torch.arange(vocab_size, dtype=_I64)).unsqueeze(0)
    for start in range(0, sampled.numel(), chunk):
        rows = sampled[start : start + chunk]
        pos = positions[rows] + (_DRAFT_NOISE_SALT if is_drafting else 0)
        noise = _gumbel_noise(seeds[req[rows]], pos, token_keys, use_fp64)
        scores = logits[rows].float()
        if apply_temperature:
            scores = scores / temp[rows].unsqueeze(1)
        output[rows] = _first_argmax(scores.to(noise.dtype) + noise)
    return output


def apply_logit_bias_cpu(
    logits,
    expanded_idx_mapping,
    positions,
    num_allowed_token_ids,
    allowed_token_ids,
    num_logit_bias,
    logit_bias_token_ids,
    logit_bias,
    min_lens,
    num_stop_token_ids,
    restore_when_all_masked,
    stop_token_ids,
    check_all_masked_rows,
):
    neg_inf = float("-inf")
    reqs = expanded_idx_mapping[: logits.size(0)].tolist()
    for token_idx, req in enumerate(reqs):
        row = logits[token_idx]
        num_allowed = int(num_allowed_token_ids[req])
        if num_allowed > 0:
            allowed = allowed_token_ids[req, :num_allowed].to(_I64)
            saved = row[allowed]
            row.fill_(neg_inf)
            row[allowed] = saved

        num_bias = int(num_logit_bias[req])
        if num_bias > 0:
            ids = logit_bias_token_ids[req, :num_bias].to(_I64)
            row.index_add_(0, ids, logit_bias[req, :num_bias].to(row.dtype))

        num_stop = int(num_stop_token_ids[req])
        if num_stop == 0 or int(positions[token_idx]) + 1 >= int(min_lens[req]):
            continue
        stop = stop_token_ids[req, :num_stop].to(_I64)
        if not check_all_masked_rows or int(restore_when_all_masked[req]) == 0:
            row[stop] = neg_inf
            continue
        saved = row[stop]
        row[stop] = neg_inf
        if bool((row == neg_inf).all()):
            keep = torch.isfinite(saved)
            row[stop[keep]] = saved[keep]


_SCHEMAS = {
    gather_block_table_cpu: "(Tensor block_table, Tensor(a1!) output, "
    "Tensor idx_mapping, Tensor num_blocks, SymInt num_reqs_padded) -> ()",
    compute_slot_mapping_cpu: "(Tensor block_table, Tensor(a1!) slot_mapping, "
    "Tensor idx_mapping, Tensor query_start_loc, Tensor positions, "
    "SymInt block_size, bool mapping_enabled, SymInt pad_slot_id) -> ()",
    prepare_prefill_inputs_cpu: "(Tensor(a0!) input_ids, "
    "Tensor(a1!) next_prefill_tokens, Tensor idx_mapping, Tensor query_start_loc, "
    "Tensor all_token_ids, Tensor prefill_len, Tensor num_computed_tokens) -> ()",
    get_prompt_logprobs_token_ids_cpu: "(SymInt num_tokens, Tensor query_start_loc, "
    "Tensor idx_mapping, Tensor num_computed_tokens, Tensor all_token_ids) -> Tensor",
    prepare_pos_seq_lens_cpu: "(Tensor idx_mapping, Tensor query_start_loc, "
    "Tensor num_computed_tokens, Tensor(a3!) pos, Tensor(a4!) seq_lens) -> ()",
    prepare_mrope_positions_cpu: "(Tensor(a0!) positions, Tensor prefill_positions, "
    "Tensor prefill_delta, Tensor idx_mapping, Tensor query_start_loc, "
    "Tensor prefill_lens, Tensor num_computed_tokens) -> ()",
    combine_sampled_and_draft_tokens_cpu: "(Tensor(a0!) input_ids, "
    "Tensor idx_mapping, Tensor last_sampled_tokens, Tensor query_start_loc, "
    "Tensor seq_lens, Tensor prefill_len, Tensor draft_tokens, "
    "Tensor cu_num_logits, SymInt num_logits, SymInt num_new_sampled_tokens) "
    "-> Tensor",
    post_update_cpu: "(Tensor idx_mapping, Tensor(a1!) num_computed_tokens, "
    "Tensor(a2!) last_sampled_tokens, Tensor(a3!)? output_bin_counts, "
    "Tensor sampled_tokens, Tensor num_sampled, Tensor num_rejected, "
    "Tensor? query_start_loc, Tensor(a8!) all_token_ids, Tensor(a9!) total_len) "
    "-> ()",
    gumbel_sample_cpu: "(Tensor logits, Tensor expanded_idx_mapping, "
    "Tensor temperature, Tensor seeds, Tensor positions, bool apply_temperature, "
    "bool is_drafting, bool use_fp64) -> Tensor",
    apply_logit_bias_cpu: "(Tensor(a0!) logits, Tensor expanded_idx_mapping, "
    "Tensor positions, Tensor num_allowed_token_ids, Tensor allowed_token_ids, "
    "Tensor num_logit_bias, Tensor logit_bias_token_ids, Tensor logit_bias, "
    "Tensor min_lens, Tensor num_stop_token_ids, Tensor restore_when_all_masked, "
    "Tensor stop_token_ids, bool check_all_masked_rows) -> ()",
}

_lib = torch.library.Library("_C", "FRAGMENT")
REGISTERED: list[str] = []
for _fn, _schema in _SCHEMAS.items():
    if not hasattr(torch.ops._C, _fn.__name__):
        _lib.define(_fn.__name__ + _schema)
        _lib.impl(_fn.__name__, _fn, "CPU")
        REGISTERED.append(_fn.__name__)
