"""The tests' shared helpers: running `rlft` as a subprocess and reading what it wrote; the online-RL pieces.

Every test runs `rlft` as a subprocess with cwd=tmp_path, so runs land in tmp_path/runs. The
environment pins one torch thread per process (OMP_NUM_THREADS=1 and deepspeed.threads_per_rank=1):
on a small shared CPU machine, thread oversubscription makes torch 20x slower. wandb is always
disabled (WANDB_MODE=disabled and logger.wandb=disabled): wandb with no network can hang.

Online RL:
* `DATA_DIR` (tests/data) goes on sys.path here and on PYTHONPATH for CLI subprocesses, so the
  user reward module is importable as `rl_user_reward:<function>` from any working directory
  (pytest from the repo root, a fresh clone, or a subprocess whose cwd is a tmp dir).
* `RL_SMALL`: a rollout small enough for one CPU core (4 prompts x 4 samples, 24 new tokens).
* `make_parents`: SFT (and RM / PRM) for a few steps, the inputs an RL stage reads.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The tiny model on a small built-in task: a few seconds per stage on one CPU core.
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "data.task.num_train=200", "data.task.num_test=20", "train.max_seq_len=128",
    "deepspeed.threads_per_rank=1", "logger.wandb=disabled", "logger.progress=false",
]
# The same without the built-in task's knobs (for local data files).
TINY_MODEL = [a for a in TINY if not a.startswith("data.task.")]
# A small global batch: 8 sequences = 4 per micro-batch x 2 accumulation steps on one rank.
SMALL_BATCH = ["train.batch_size=8", "train.micro_batch_per_device=4", "train.log_every=1"]


def require(missing: str | None, module: bool = False) -> None:
    """Skip a test (`module`: a whole test file, called at its top) whose prerequisite is missing (`missing` says
    what), except in CI (CI=true), where `make test` installs every prerequisite and a skip would hide a test
    that never ran: there it fails. The one skip guard of the suite."""
    import pytest

    if missing and os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI runs this test, but: {missing}", pytrace=False)
    if missing:
        pytest.skip(missing, allow_module_level=module)


def sandbox_missing() -> str | None:
    """Why env=python's default sandbox (bubblewrap) cannot run here, or None (`make test` installs it)."""
    from rlft.envs import sandbox

    try:
        sandbox.isolation("bwrap")
    except sandbox.SandboxUnavailable as exc:
        return str(exc)
    return None


def cli_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false", HYDRA_FULL_ERROR="0")
    env.update(extra)
    return env


def run_cli(tmp_path: Path, *args: str, timeout: float = 300, env: dict | None = None,
            prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """`rlft *args` in tmp_path; returns the CompletedProcess (text stdout/stderr), never raises on rc."""
    cmd = (prefix or [sys.executable, "-m", "rlft.cli"]) + [str(a) for a in args]
    return subprocess.run(cmd, cwd=tmp_path, env=env or cli_env(), capture_output=True, text=True,
                          timeout=timeout)


# A rank of a CPU (gloo) job very rarely dies inside the communication library with this message
# (seen once in many full runs, not reproducible); multi-rank tests retry only that abort, once.
GLOO_ABORT = "terminate called without an active exception"


def run_cli_retrying_abort(tmp_path: Path, *args: str, clean: Path, **kwargs) -> subprocess.CompletedProcess:
    """run_cli, run once more (after removing `clean`, the run's directory) only when a rank died
    with GLOO_ABORT; the first attempt's output is printed. Any other failure is returned as is."""
    proc = run_cli(tmp_path, *args, **kwargs)
    if proc.returncode != 0 and GLOO_ABORT in proc.stderr:
        print(f"a rank aborted in the communication library; retrying once\n{proc.stderr[-2000:]}")
        shutil.rmtree(clean, ignore_errors=True)
        proc = run_cli(tmp_path, *args, **kwargs)
    return proc


def popen_cli(tmp_path: Path, *args: str, env: dict | None = None, log: Path | None = None,
              prefix: list[str] | None = None) -> subprocess.Popen:
    """Start `rlft *args` in its own session (so os.killpg reaches the whole process tree)."""
    cmd = (prefix or [sys.executable, "-m", "rlft.cli"]) + [str(a) for a in args]
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(cmd, cwd=tmp_path, env=env or cli_env(), stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def explain(proc: subprocess.CompletedProcess) -> str:
    """The tail of a failed run's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command (no traceback)."""
    assert proc.returncode != 0, explain(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, explain(proc)
    assert "Traceback" not in proc.stderr
    return lines[0]


def check_ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, explain(proc)
    return proc


def stage_dir(tmp_path: Path, run_name: str, algo: str) -> Path:
    return Path(tmp_path) / "runs" / run_name / algo


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl (a file, or a stage directory holding one) as a list of dicts."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_records(path: Path, key: str = "loss") -> list[dict]:
    """The per-step training records (those carrying `key`), in file order."""
    return [r for r in read_metrics(path) if key in r]


def loss_curve(path: Path) -> list[float]:
    return [r["loss"] for r in train_records(path)]


def assert_finite(values) -> None:
    values = list(values)
    assert values, "no values"
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in values), values


def read_manifest(directory: Path) -> dict:
    return json.loads((Path(directory) / "manifest.json").read_text())


def load_safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    path = Path(path)
    return load_file(str(path / "model.safetensors" if path.is_dir() else path))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tmp_leftovers(root: Path) -> list[Path]:
    """Half-written outputs: anything named .tmp-* (or .old-*) under root."""
    return [p for p in Path(root).rglob("*") if p.name.startswith((".tmp", ".old-"))]


# A driver that runs `rlft` in-process with two hooks that do not change what is computed:
#  * the stage's load_model is wrapped to snapshot the parameters the stage starts from;
#  * rlft.stages.common.finish is wrapped to record, just before the HF export, the live
#    (DeepSpeed-wrapped) model's parameters and its logits on fixed texts.
# Single-rank training runs inside the driver process (rlft.launch), so the hooks see the real
# training objects. The record goes to $RLFT_PROBE_OUT (torch.save).
PROBE_DRIVER = r"""
import os, sys, torch
import rlft.stages.common as common
import rlft.stages.reward as reward
import rlft.stages.sft as sft

OUT = os.environ["RLFT_PROBE_OUT"]
TEXTS = ["Q: 12+7?\nA:\n12+7=19\n#### 19", "Q: 3*4-5?\nA:\n3*4=12\n12-5=7\n#### 7"]
record = {"texts": TEXTS}

def snapshot(model):
    return {n: p.detach().clone().cpu() for n, p in model.named_parameters()}

def wrap_load(module):
    original = module.load_model
    def load_model(*args, **kwargs):
        model = original(*args, **kwargs)
        record["initial"] = snapshot(model)
        return model
    module.load_model = load_model

wrap_load(sft)
wrap_load(reward)
original_finish = common.finish

def finish(ctx, engine, tokenizer, parent, summary):
    model = engine.module
    was_training = model.training
    model.eval()
    record["final"] = snapshot(model)
    record["input_ids"], record["logits"] = [], []
    with torch.no_grad():
        for text in TEXTS:
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            record["input_ids"].append(ids)
            record["logits"].append(model(input_ids=ids.to(engine.device)).logits.float().cpu())
    model.train(was_training)
    torch.save(record, OUT)
    return original_finish(ctx, engine, tokenizer, parent, summary)

common.finish = finish
from rlft.cli import main
main(sys.argv[1:])
"""


def run_probed(tmp_path: Path, probe_out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """run_cli through PROBE_DRIVER (single rank only); the record lands in probe_out."""
    return run_cli(tmp_path, *args, timeout=timeout, env=cli_env(RLFT_PROBE_OUT=str(probe_out)),
                   prefix=[sys.executable, "-c", PROBE_DRIVER])


# ----------------------------------------------------------------------------- online RL
DATA_DIR = REPO / "tests" / "data"
if str(DATA_DIR) not in sys.path:
    sys.path.insert(0, str(DATA_DIR))

USER_REWARD = "rl_user_reward"

# One rollout = 4 prompts x 4 samples = 16 sequences = one optimizer step (micro 8, 2 accumulation steps).
RL_SMALL = [
    "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=24", "algo.eval_problems=8",
    "rollout.batch_size=16", "train.micro_batch_per_device=8", "train.log_every=1", "train.save_every=0",
]
PARENT_STEPS = {"sft": 3, "rm": 2, "prm": 2}
PARENT_ARGS = ["train.batch_size=8", "train.micro_batch_per_device=8", "train.log_every=1", "train.save_every=0"]


def rl_env(**extra: str) -> dict:
    """cli_env with tests/data on PYTHONPATH (user reward functions)."""
    env = cli_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(DATA_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def rl_cli(tmp_path: Path, *args: str, timeout: float = 300):
    """`rlft *args` (tiny model) in tmp_path with the user reward module importable."""
    return run_cli(tmp_path, *args, *TINY, timeout=timeout, env=rl_env())


def make_parents(root: Path, run_name: str, stages=("sft",)) -> dict[str, Path]:
    """Train the given stages (sft first, then rm / prm from it) for a few steps each."""
    out = {}
    for stage in stages:
        check_ok(rl_cli(root, "train", f"algo={stage}", f"run.name={run_name}",
                        f"train.max_steps={PARENT_STEPS[stage]}", *PARENT_ARGS))
        out[stage] = stage_dir(root, run_name, stage)
    return out


def sharpened_teacher(model_dir: Path, out: Path, scale: float = 20.0) -> Path:
    """A distillation teacher that differs from the model at `model_dir` in a known way: the same model with
    its final norm, so every logit, scaled `scale` times (a peaked, confident copy); tokenizer files copied."""
    import shutil

    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(model_dir)
    teacher.model.norm.weight.data *= scale
    teacher.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out / name)
    return out


def changed_tensors(before: dict, after: dict, atol: float = 0.0) -> list[str]:
    """Names of tensors present in both whose values differ by more than atol."""
    names = sorted(set(before) & set(after))
    return [n for n in names if (before[n].float() - after[n].float()).abs().max().item() > atol]


# A compact Hermes-style template (as Qwen2.5's): tools in a system turn, calls as <tool_call> JSON,
# tool results as a user turn in <tool_response>.
HERMES_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n<tools>' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{%- for c in m.tool_calls or [] %}{{ '<tool_call>\\n' }}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{{ '\\n</tool_call>' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response>"
    "<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


class Scripted:
    """An engine that writes given turns (text, encoded by the tokenizer), each up to its first stop
    string per call (as a real engine's output ends there), the rest of the turn in the next call."""

    def __init__(self, tok, turns: list[str]):
        self.tok, self.left = tok, list(turns)

    def generate(self, prompt_ids, n, sampling, seed=None):
        from rlft.rollout.generate import Generations

        text = self.left[0]
        cuts = [text.index(s) + len(s) for s in sampling.stop if s in text]
        cut = min(cuts) if cuts else len(text)
        self.left[0] = text[cut:]
        if not self.left[0] and len(self.left) > 1:
            self.left.pop(0)
        stopped = bool(cuts)
        ids = self.tok(text[:cut], add_special_tokens=False)["input_ids"]
        ids = ids if stopped else ids + [self.tok.eos_token_id]
        rows = len(prompt_ids) * n
        return Generations(prompt_index=[i for i in range(len(prompt_ids)) for _ in range(n)],
                           completion_ids=[list(ids) for _ in range(rows)], texts=[""] * rows,
                           truncated=[False] * rows, logp=[[-1.0] * len(ids) for _ in range(rows)],
                           stopped=[stopped] * rows)


def compose_config(*overrides: str):
    """rlft's composed config for these overrides (Hydra, the package's conf/), as a run sees it before
    validation."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlft.config.schema import register_schemas
    from rlft.overrides import conf_dir

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("config", overrides=list(overrides))
