# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A byte-level BPE tokenizer of any vocabulary size, for dummy-weight serving.

A model with dummy weights samples ids from its whole vocabulary (50,280 in
the engine and serving suites). A tokenizer smaller than that (the demo's has
512 ids) cannot decode most of them: vLLM's incremental detokenizer then never
emits text, and every step re-decodes the prompt and the answer so far, which
makes the API server, not the engine, the bound (`docs/serving.md`). This
tokenizer has exactly `vocab_size` ids, each of which decodes to printable
ASCII, so a served step costs what it would with a real checkpoint's
tokenizer.

Ids 0-255 are the bytes, then two- and three-character tokens of letters (the
first may be a space), built by merges (a deterministic sample of the
three-character ones), and `<|endoftext|>` last.
"""

import json
import random
import string
from pathlib import Path

from transformers.convert_slow_tokenizer import bytes_to_unicode

EOS = "<|endoftext|>"


def tokenizer_json(vocab_size: int, seed: int = 0) -> dict:
    if vocab_size < 258:
        raise ValueError(f"vocab_size must be at least 258, got {vocab_size}")
    # the printable character byte-level BPE stands each byte for
    byte = bytes_to_unicode()
    vocab = {byte[b]: b for b in range(256)}
    tails = [byte[ord(c)] for c in string.ascii_letters]
    heads = [byte[ord(" ")], *tails]
    left = vocab_size - 256 - 1
    pairs = [(a, b) for a in heads for b in tails][:left]
    merges = list(pairs)
    left -= len(pairs)
    if left:
        rng = random.Random(seed)
        triples = rng.sample(range(len(pairs) * len(tails)), left)
        for i in sorted(triples):
            a, b = pairs[i // len(tails)]
            merges.append((a + b, tails[i % len(tails)]))
    for a, b in merges:
        vocab[a + b] = len(vocab)
    eos = vocab[EOS] = len(vocab)
    assert eos == vocab_size - 1
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": eos,
                "content": EOS,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """tokenizer.json and tokenizer_config.json of `vocab_size` ids in folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab_size)))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": EOS,
        "unk_token": EOS,
        "model_max_length": 1 << 20,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
