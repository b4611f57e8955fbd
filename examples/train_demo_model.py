# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Train the ParaSLSTM demo model (King James Bible) with pararnn-torch.

The model is pararnn-torch's own ``ParaSLSTMForCausalLM``, trained with its
parallel-in-time Newton solver (``model.train()`` makes every ``ParaRNN``
solve the recurrence with Newton iterations over a parallel scan), AdamW and a
linear-warmup cosine schedule. The data are the uint16 token files written by
``examples/paraslstm_demo_model/prepare_data.py``.

Runs are resumable: the state (fp32 weights, optimizer, step) is saved to
``--run-dir`` every ``--save-every`` steps and when ``--max-minutes`` is
reached, and the next call with the same ``--run-dir`` continues. Batches
depend only on ``(seed, step)``, so a resumed run sees the same data as an
uninterrupted one. When the last step is done the script evaluates held-out
perplexity and writes the checkpoint directory ``--out`` with the library's
``save_pretrained`` (weights cast to ``--save-dtype``; the duplicate legacy
``pytorch_model.bin`` it also writes is removed), plus the tokenizer files.

Needs pararnn-torch (the reference environment ``.venv-ref`` on CPU, or the
wheel on the GPU machine), numpy and safetensors; ``tokenizers`` is optional
(only used to print samples). Uses CUDA when available, else the CPU.

    PY=$(bash tools/paraslstm/ci/setup_reference_env.sh)
    $PY examples/train_demo_model.py --steps 1500 --max-minutes 9
    $PY examples/train_demo_model.py --steps 1500 --max-minutes 9  # resumes

``--export-only`` writes ``--out`` from the latest state without training.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from pararnn.models.causal_lm import ParaSLSTMForCausalLM
from pararnn.models.config import ParaSLSTMConfig

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "paraslstm-kjv"
SAMPLE_PROMPTS = ["In the beginning", "And the LORD said unto Moses,"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=CACHE / "data")
    ap.add_argument("--run-dir", type=Path, default=CACHE / "run")
    ap.add_argument("--out", type=Path, default=CACHE / "paraslstm-kjv")
    ap.add_argument("--seed", type=int, default=0)
    # model
    ap.add_argument("--hidden-size", type=int, default=192)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--mlp-ratio", type=float, default=2.0)
    ap.add_argument("--max-recurrent-norm", type=float, default=0.5)
    # training solver (does not change the function, only convergence)
    ap.add_argument("--picard-iters", type=int, default=8)
    ap.add_argument("--newton-iters", type=int, default=4)
    # optimisation
    ap.add_argument(
        "--steps",
        type=int,
        default=1200,
        help="total steps; 0: chosen after --probe-steps steps (still in warmup, "
        "so the choice changes no earlier step) to fill --auto-minutes of "
        "training, within [--auto-min-steps, --auto-max-steps], then fixed "
        "for the run (saved, reused on resume, recorded in training_info.json)",
    )
    ap.add_argument("--auto-minutes", type=float, default=14.0)
    ap.add_argument("--auto-min-steps", type=int, default=300)
    ap.add_argument("--auto-max-steps", type=int, default=3000)
    ap.add_argument("--probe-steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    # bookkeeping
    ap.add_argument("--max-minutes", type=float, default=9.0)
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument(
        "--eval-tokens",
        type=int,
        default=0,
        help="held-out tokens for periodic evals (0: all)",
    )
    ap.add_argument(
        "--final-eval-tokens",
        type=int,
        default=0,
        help="held-out tokens for the final (sequential) eval (0: all)",
    )
    ap.add_argument("--eval-len", type=int, default=512)
    ap.add_argument("--save-dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: keep)")
    ap.add_argument("--export-only", action="store_true")
    return ap.parse_args(argv)


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def model_config(args: argparse.Namespace, meta: dict) -> ParaSLSTMConfig:
    return ParaSLSTMConfig(
        vocab_size=int(meta["vocab_size"]),
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        mlp_ratio=args.mlp_ratio,
        max_recurrent_norm=args.max_recurrent_norm,
        mix="diag",
        tie_word_embeddings=True,
        picard_iters=args.picard_iters,
        newton_iters=args.newton_iters,
    )


def load_tokens(path: Path) -> torch.Tensor:
    arr = np.fromfile(path, dtype=np.uint16)
    if arr.size == 0:
        raise SystemExit(f"train: {path} is empty")
    return torch.from_numpy(arr.astype(np.int64))


def batch_at(tokens: torch.Tensor, step: int, args: argparse.Namespace) -> torch.Tensor:
    """Random windows of ``seq_len`` tokens; a pure function of (seed, step)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    hi = tokens.numel() - args.seq_len
    starts = torch.randint(0, hi, (args.batch_size,), generator=g)
    idx = starts[:, None] + torch.arange(args.seq_len)[None, :]
    return tokens[idx]


def lr_at(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    cos = 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
    return args.lr * (args.min_lr_ratio + (1.0 - args.min_lr_ratio) * cos)


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # matrices (incl. the tied embedding) decay; norms, biases, R do not
        (decay if p.dim() >= 2 else no_decay).append(p)
        del name
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


@torch.no_grad()
def evaluate(
    model: ParaSLSTMForCausalLM,
    tokens: torch.Tensor,
    args: argparse.Namespace,
    device: torch.device,
    max_tokens: int = 0,
    solver: str = "newton",
) -> dict:
    """Mean next-token NLL over non-overlapping windows (zero initial state).

    ``solver="newton"`` uses the training solver (fast, parallel);
    ``"sequential"`` the exact step-by-step recurrence of ``model.eval()``.
    """
    was_training = model.training
    model.train(solver == "newton")
    if max_tokens:
        tokens = tokens[:max_tokens]
    n = args.eval_len
    total, count = 0.0, 0
    windows = tokens[: tokens.numel() // n * n].view(-1, n)
    for i in range(0, windows.shape[0], args.batch_size):
        x = windows[i : i + args.batch_size].to(device)
        logits = model(x).float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll = -lp.gather(-1, x[:, 1:, None]).squeeze(-1)
        total += float(nll.sum())
        count += nll.numel()
    model.train(was_training)
    mean = total / count
    return {"nll": mean, "ppl": math.exp(mean), "tokens": count, "solver": solver}


def sample(model: ParaSLSTMForCausalLM, data_dir: Path, device: torch.device) -> None:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    tok = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    was_training = model.training
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(prompt).ids], device=device)
        out = model.generate(ids, max_new_tokens=40)
        log(f"sample: {tok.decode(out[0].tolist())!r}")
    model.train(was_training)


def save_state(run_dir: Path, model, opt, state: dict) -> None:
    """Atomic save; model and optimizer in separate files (each < 16 MB)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, obj in (("model.pt", model.state_dict()), ("optim.pt", opt.state_dict())):
        tmp = run_dir / (name + ".tmp")
        torch.save(obj, tmp)
        os.replace(tmp, run_dir / name)
    tmp = run_dir / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, run_dir / "state.json")


def export(
    model: ParaSLSTMForCausalLM,
    args: argparse.Namespace,
    meta: dict,
    state: dict,
) -> None:
    out: Path = args.out
    cfg_dict = model.config.to_dict()
    export_model = ParaSLSTMForCausalLM(ParaSLSTMConfig.from_dict(cfg_dict))
    export_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    export_model.to(getattr(torch, args.save_dtype)).eval()
    shutil.rmtree(out, ignore_errors=True)
    export_model.save_pretrained(out)
    (out / "model.safetensors").chmod(0o644)
    (out / "pytorch_model.bin").unlink()  # legacy duplicate of model.safetensors
    for name in TOKENIZER_FILES:
        shutil.copyfile(args.data / name, out / name)
    config = json.loads((out / "config.json").read_text())
    config["eos_token_id"] = int(meta["eos_token_id"])
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    info = {
        "data": {k: meta[k] for k in sorted(meta)},
        "train": {k: v for k, v in state.items() if k not in ("log",)},
        "parameters": sum(p.numel() for p in model.parameters()),
        "save_dtype": args.save_dtype,
    }
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir())
    log(f"exported {out} ({size / 1e6:.2f} MB)")


# Arguments that must not change when a run is resumed.
_RUN_KEYS = (
    "seed",
    "hidden_size",
    "layers",
    "mlp_ratio",
    "max_recurrent_norm",
    "steps",
    "batch_size",
    "seq_len",
    "lr",
    "min_lr_ratio",
    "warmup",
    "weight_decay",
)


def _check_same_run(saved: dict, args: argparse.Namespace) -> None:
    diff = {
        k: (saved.get(k), getattr(args, k))
        for k in _RUN_KEYS
        if k in saved and saved[k] != getattr(args, k)
    }
    if diff:
        raise SystemExit(
            f"train: --run-dir {args.run_dir} holds a run with other settings "
            f"(saved, given): {diff}; use the same arguments or a new --run-dir"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.monotonic()
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu")
        if args.device == "auto"
        else args.device
    )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    meta = json.loads((args.data / "meta.json").read_text())
    train_tokens = load_tokens(args.data / "train.bin")
    held_tokens = load_tokens(args.data / "heldout.bin")
    log(
        f"device={device} train_tokens={train_tokens.numel()} "
        f"heldout_tokens={held_tokens.numel()} vocab={meta['vocab_size']}"
    )

    torch.manual_seed(args.seed)
    model = ParaSLSTMForCausalLM(model_config(args, meta)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, args)
    state = {"step": 0, "elapsed_s": 0.0, "args": None, "log": []}
    if (args.run_dir / "state.json").is_file():
        state = json.loads((args.run_dir / "state.json").read_text())
        model.load_state_dict(
            torch.load(args.run_dir / "model.pt", map_location=device)
        )
        opt.load_state_dict(torch.load(args.run_dir / "optim.pt", map_location=device))
        log(f"resumed at step {state['step']} from {args.run_dir}")
        saved = state.get("args") or {}
        if args.steps == 0:
            args.steps = int(saved.get("steps") or 0)
            if args.steps == 0 and int(state["step"]) > 0:
                raise SystemExit(
                    "train: the saved run stopped before --steps was chosen; "
                    "pass --steps N explicitly"
                )
        _check_same_run(saved, args)
    state["args"] = {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
    }
    log(f"parameters={n_params} config={model.config.to_dict()}")

    if args.export_only:
        export(model, args, meta, state)
        return

    model.train()
    deadline = t_start + 60.0 * args.max_minutes
    t_seg = time.monotonic()
    seg_tokens = 0
    step = int(state["step"])
    if args.steps == 0 and args.warmup <= args.probe_steps:
        raise SystemExit("train: --steps 0 needs --warmup > --probe-steps")
    t_probe = None
    while args.steps == 0 or step < args.steps:
        if args.steps == 0 and step == 5:
            _sync(device)
            t_probe = time.monotonic()
        if args.steps == 0 and step == args.probe_steps:
            _sync(device)
            per_step = (time.monotonic() - t_probe) / (args.probe_steps - 5)
            want = int(60.0 * args.auto_minutes / per_step)
            args.steps = max(args.auto_min_steps, min(args.auto_max_steps, want))
            state["args"]["steps"] = args.steps
            state["steps_auto"] = {"sec_per_step": per_step, "wanted": want}
            log(
                f"{per_step * 1e3:.1f} ms/step -> --steps {args.steps} "
                f"(wanted {want} for {args.auto_minutes} min)"
            )
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        x = batch_at(train_tokens, step, args).to(device, non_blocking=True)
        _, loss = model(x, labels=x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        seg_tokens += x.numel()
        if step % args.log_every == 0 or step == 1:
            now = time.monotonic()
            tps = seg_tokens / max(1e-9, now - t_seg)
            rec = {
                "step": step,
                "loss": round(float(loss.detach()), 4),
                "lr": lr,
                "gnorm": round(float(gnorm), 3),
                "tok_s": round(tps),
            }
            state["log"].append(rec)
            log(json.dumps(rec))
        if step % args.eval_every == 0 and step < args.steps:
            ev = evaluate(model, held_tokens, args, device, args.eval_tokens)
            state["log"].append({"step": step, "eval": ev})
            log(f"eval step {step}: {json.dumps(ev)}")
        now = time.monotonic()
        state["elapsed_s"] = float(state["elapsed_s"]) + (now - t_seg)
        t_seg, seg_tokens = now, 0
        state["step"] = step
        stop = now >= deadline
        if step % args.save_every == 0 or stop or step == args.steps:
            save_state(args.run_dir, model, opt, state)
        if stop and (args.steps == 0 or step < args.steps):
            log(f"time budget reached at step {step}/{args.steps}; state saved")
            sample(model, args.data, device)
            return

    final = evaluate(
        model, held_tokens, args, device, args.final_eval_tokens, solver="sequential"
    )
    state["heldout_final"] = final
    state["parameters"] = n_params
    save_state(args.run_dir, model, opt, state)
    log(f"final held-out (sequential): {json.dumps(final)}")
    sample(model, args.data, device)
    export(model, args, meta, state)


if __name__ == "__main__":
    sys.exit(main())
