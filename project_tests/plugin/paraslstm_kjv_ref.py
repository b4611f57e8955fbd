# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""pararnn-torch side of the trained-demo-model test (`test_paraslstm_kjv.py`).

Runs in the reference environment (`.venv-ref`), never in the vLLM one:

    python paraslstm_kjv_ref.py JOB.json RESULT.json

JOB: ``{"model": dir, "sequences": [[id, ...], ...], "prompts": [[id, ...]],
"max_new_tokens": n}``. The checkpoint is loaded with the library's
``from_pretrained`` and cast to float32. RESULT: for every sequence, the
log-probability of each token after the first (``model.eval()`` forward, the
library's exact sequential recurrence; log-softmax in float64), and for every
prompt the greedy continuation from ``generate()``.
"""

import json
import sys

import torch
from pararnn.models.causal_lm import ParaSLSTMForCausalLM


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    torch.manual_seed(0)
    model = ParaSLSTMForCausalLM.from_pretrained(job["model"]).float().eval()
    token_logprobs = []
    greedy = []
    with torch.no_grad():
        for seq in job["sequences"]:
            ids = torch.tensor([seq], dtype=torch.long)
            logits = model(ids)[0, :-1].double()
            lp = torch.log_softmax(logits, dim=-1)
            token_logprobs.append(lp.gather(-1, ids[0, 1:, None])[:, 0].tolist())
        for prompt in job["prompts"]:
            ids = torch.tensor([prompt], dtype=torch.long)
            out = model.generate(ids, max_new_tokens=int(job["max_new_tokens"]))
            greedy.append(out[0, len(prompt) :].tolist())
    with open(sys.argv[2], "w") as f:
        json.dump({"token_logprobs": token_logprobs, "greedy": greedy}, f)


if __name__ == "__main__":
    main()
