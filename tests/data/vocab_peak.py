"""Peak memory of RL's scoring and update passes at a real vocabulary size (Qwen2's 151,936) and a
small width: prints the growth of the process's peak resident set over the passes and the size of the
whole batch's fp32 logits, in GiB. Run in a fresh process by tests/smoke/test_vocab_memory.py."""
import resource
import types

import torch
import transformers

from rlft.stages.experience import rollout_logp
from rlft.stages.update import micro_forward

torch.set_num_threads(1)
V, B, PROMPT, RESPONSE, MICRO = 151936, 64, 32, 96, 4
cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                               max_position_embeddings=256)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg)
ids = torch.randint(10, V, (B, PROMPT + RESPONSE))
mask = torch.zeros(B, PROMPT + RESPONSE - 1)
mask[:, PROMPT - 1:] = 1
ro = types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), mask=mask)


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


before = peak_bytes()
rollout_logp(model, ro, MICRO, 1.0)  # old / reference log-probs, no grad
for i in range(0, B, MICRO):  # the update: forward with grad, loss, backward
    _, _, cols, m, _, logp = micro_forward(model, ro, slice(i, i + MICRO), 1.0)
    (-(logp * m).sum() / m.sum()).backward()
print(f"{(peak_bytes() - before) / 2**30:.4f} {B * RESPONSE * V * 4 / 2**30:.4f}")
