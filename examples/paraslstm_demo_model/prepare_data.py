# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Prepare the training data of the ParaSLSTM demo model (King James Bible).

Source: Debian's ``bible-kjv`` package (the ``bible`` program plus the
``bible-kjv-text`` data). Only the *text* is used; it is public domain (the
translation dates from 1611, see /usr/share/doc/bible-kjv-text/copyright).
The package's software is GPL-2+ and is not used beyond printing the text.

Steps (idempotent; every failure raises):

1. ``bible -l0 gen1:1-rev22:21`` (installs ``bible-kjv`` with apt when the
   program is missing and we are root).
2. Clean: drop chapter headers and verse numbers; one verse per line; one
   chapter is one document.
3. Split: every 20th chapter (index 19, 39, ...) is held out.
4. Train a byte-level BPE tokenizer (``tokenizers``) on the training chapters.
5. Write ``train.bin`` / ``heldout.bin`` (uint16 token ids; each chapter is
   followed by ``<|endoftext|>``), ``tokenizer.json``,
   ``tokenizer_config.json``, ``meta.json`` (counts, sha256 sums) and
   ``heldout_sample.txt`` (the first ``SAMPLE_CHAPTERS`` held-out chapters,
   the text of the fidelity test).

Run with the vLLM environment's Python (it has ``tokenizers``):

    .venv/bin/python examples/paraslstm_demo_model/prepare_data.py

Output goes to ``.cache/paraslstm-kjv/data`` (gitignored) unless ``--out``.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import regex as re
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "paraslstm-kjv" / "data"
BIBLE_RANGE = "gen1:1-rev22:21"
EOS = "<|endoftext|>"
VOCAB_SIZE = 3072
HELDOUT_EVERY = 20
SAMPLE_CHAPTERS = 2
COPYRIGHT = Path("/usr/share/doc/bible-kjv-text/copyright")
# Expected shape of the package's output; a different text fails loudly.
EXPECTED_CHAPTERS = 1189
EXPECTED_VERSES = 31102
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

_VERSE = re.compile(r"^ +(\d+) (\S.*)$")


def fetch_raw_text() -> str:
    """Return the whole KJV as printed by ``bible``; install it if needed."""
    if shutil.which("bible") is None:
        if os.geteuid() != 0:
            raise SystemExit(
                "prepare_data: the 'bible' program is missing; as root run "
                "`apt-get update && apt-get install -y bible-kjv`"
            )
        print("prepare_data: installing bible-kjv with apt-get", file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "bible-kjv"], check=True, env=env)
    proc = subprocess.run(
        ["bible", "-l0", BIBLE_RANGE],
        check=True,
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    if not proc.stdout.strip():
        raise SystemExit("prepare_data: `bible` printed nothing")
    return proc.stdout


def split_chapters(raw: str) -> list[list[str]]:
    """Parse ``bible -l0`` output into chapters of verse texts.

    A header line (``Genesis 1``) is unindented; a verse line is indented and
    starts with its number; blank lines separate them. Verse numbers must
    count 1, 2, ... within each chapter.
    """
    chapters: list[list[str]] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m is None:
            if line.startswith(" "):
                raise SystemExit(f"prepare_data: unexpected line {lineno}: {line!r}")
            chapters.append([])  # chapter header
            continue
        if not chapters:
            raise SystemExit(f"prepare_data: verse before any header at line {lineno}")
        num, text = int(m.group(1)), m.group(2).strip()
        if num != len(chapters[-1]) + 1:
            raise SystemExit(f"prepare_data: verse {num} out of order at line {lineno}")
        chapters[-1].append(" ".join(text.split()))
    n_verses = sum(len(c) for c in chapters)
    if len(chapters) != EXPECTED_CHAPTERS or n_verses != EXPECTED_VERSES:
        raise SystemExit(
            f"prepare_data: got {len(chapters)} chapters / {n_verses} verses, "
            f"expected {EXPECTED_CHAPTERS} / {EXPECTED_VERSES}"
        )
    return chapters


def chapter_text(verses: list[str]) -> str:
    return "\n".join(verses) + "\n"


def is_heldout(index: int) -> bool:
    return index % HELDOUT_EVERY == HELDOUT_EVERY - 1


def train_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    if tok.token_to_id(EOS) != 0:
        raise SystemExit("prepare_data: expected <|endoftext|> to be id 0")
    return tok


def encode(tok: Tokenizer, docs: list[str]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eos)
    arr = np.asarray(ids, dtype=np.int64)
    if arr.max() >= 2**16:
        raise SystemExit("prepare_data: token id does not fit uint16")
    return arr.astype(np.uint16)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": EOS,
        "unk_token": EOS,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    out: Path = args.out

    chapters = split_chapters(fetch_raw_text())
    docs = [chapter_text(c) for c in chapters]
    train_docs = [d for i, d in enumerate(docs) if not is_heldout(i)]
    held_docs = [d for i, d in enumerate(docs) if is_heldout(i)]
    clean = "".join(docs).encode("utf-8")

    tok = train_tokenizer(train_docs)
    train_ids = encode(tok, train_docs)
    held_ids = encode(tok, held_docs)

    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2) + "\n"
    )
    # chapters separated by a blank line
    (out / "heldout_sample.txt").write_text("\n".join(held_docs[:SAMPLE_CHAPTERS]))
    train_ids.tofile(out / "train.bin")
    held_ids.tofile(out / "heldout.bin")
    meta = {
        "source": f"Debian bible-kjv-text via `bible -l0 {BIBLE_RANGE}`",
        "license": "KJV text: public domain (see " + str(COPYRIGHT) + ")",
        "clean_text_sha256": sha256(clean),
        "clean_text_bytes": len(clean),
        "chapters": len(chapters),
        "verses": sum(len(c) for c in chapters),
        "heldout_rule": f"chapter index % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1}",
        "train_chapters": len(train_docs),
        "heldout_chapters": len(held_docs),
        "vocab_size": tok.get_vocab_size(),
        "eos_token_id": tok.token_to_id(EOS),
        "train_tokens": int(train_ids.size),
        "heldout_tokens": int(held_ids.size),
        "train_bin_sha256": sha256(train_ids.tobytes()),
        "heldout_bin_sha256": sha256(held_ids.tobytes()),
        "tokenizer_json_sha256": sha256((out / "tokenizer.json").read_bytes()),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    print(f"prepare_data: wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
