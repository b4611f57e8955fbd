# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build the tiny random-weight test checkpoint `examples/paraslstm-tiny`.

Weights: a random (seeded) ParaSLSTM written by pararnn-torch's own
`save_pretrained`, through the reference script in `.venv-ref`. Tokenizer: a
byte-level BPE trained offline with `tokenizers` on Python's own docstrings.
Run with the vLLM environment's Python from the repo root:

    .venv/bin/python tools/paraslstm/demo_model/make_demo_checkpoint.py
"""

import builtins
import inspect
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tests.models.language.generation.paraslstm_pararnn_utils import (  # noqa: E402
    make_reference_checkpoints,
)

OUT = ROOT / "examples" / "paraslstm-tiny"
VOCAB = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _corpus() -> list[str]:
    docs = []
    for name in sorted(dir(builtins)):
        doc = inspect.getdoc(getattr(builtins, name))
        if doc:
            docs.append(doc)
    return docs


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def main() -> None:
    tok = _tokenizer()
    config = {
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "mlp_ratio": 2.0,
        "max_recurrent_norm": 0.5,
        "mix": "diag",
        "tie_word_embeddings": True,
    }
    job = {
        "config": config,
        "seed": 0,
        "dtype": "float32",
        "prompts": [[0]],
        "max_new_tokens": 1,
        "num_logprobs": 1,
    }
    with tempfile.TemporaryDirectory() as tmp:
        (result,) = make_reference_checkpoints([job], tmp)
        shutil.rmtree(OUT, ignore_errors=True)
        OUT.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(Path(result["out_dir"]) / name, OUT / name)
    tok.save(str(OUT / "tokenizer.json"))
    eos = "<|endoftext|>"
    (OUT / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": eos,
                "bos_token": eos,
                "unk_token": eos,
                "model_max_length": 2048,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    config_json = json.loads((OUT / "config.json").read_text())
    config_json["eos_token_id"] = tok.token_to_id(eos)
    (OUT / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
