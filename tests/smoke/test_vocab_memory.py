"""At a real vocabulary size no fp32 tensor of batch x length x vocabulary is held whole: the RL scoring
and update passes over 64 sequences of 96 response tokens (Qwen2's 151,936-token vocabulary, a small
width) grow the process's peak memory by well under the 3.5 GiB that the batch's fp32 logits alone
would take (micro-batches of 4, log-probs upcast a byte budget at a time)."""
import subprocess
import sys

from helpers import REPO, cli_env


def test_rl_passes_never_hold_the_whole_batchs_logits():
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "data" / "vocab_peak.py")], env=cli_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    growth, whole = map(float, proc.stdout.split())
    assert whole > 3.4
    assert growth < 0.4 * whole, (growth, whole)
