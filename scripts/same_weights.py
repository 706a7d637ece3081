"""Does a change to rlft leave training where it was? Thirteen short seeded runs on the built-in model, one per
stage and algorithm (sft, rm, prm, dpo, rft, grpo, grpo_process, iterative, online_rft, ppo, p3o joint and
separate, online_dpo), each trained by this checkout and by a git revision of it, and their final weights
compared tensor by tensor.

    python scripts/same_weights.py --baseline HEAD~1                 # this checkout against the last commit
    python scripts/same_weights.py --baseline 2a58d41 --stages sft,grpo
    python scripts/same_weights.py --baseline HEAD -- train.logit_chunk_tokens=0   # overrides for both sides

Each side runs the whole chain in its own folder (sft first; rm and prm from it; every other stage from the
sft model, with the rm or prm as its reward), so a difference in a parent reaches its children too. The
baseline is checked out once as a git worktree under the output folder and run from there (PYTHONPATH), the
current side from this checkout. Writes runs/<out>/same_weights.{md,json}: per stage the largest absolute
difference of any weight, the largest relative to that tensor's largest magnitude, and whether every
tensor is bitwise equal, and how far each stage moved from the SFT model (so an equality is not that of two
untrained copies). Runs already finished are not redone.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from rlft.experiments import rlft_command

REPO = Path(__file__).resolve().parents[1]

SMALL = ["train.log_every=1", "train.save_every=0", "logger.wandb=disabled", "logger.progress=false",
         "deepspeed.threads_per_rank=1", "data.task.num_train=200", "data.task.num_test=20"]
SUPERVISED = ["train.max_steps=4", "train.batch_size=8", "train.micro_batch_per_device=4"]
# every other completion rewarded (tests/data/rl_user_reward.py): a 4-step SFT model solves nothing, and with all
# rewards equal an RL update would not move the weights, and the comparison would show nothing
RL = ["train.max_steps=3", "rollout.prompts_per_step=4", "rollout.max_new_tokens=24", "algo.eval_every=0",
      "train.micro_batch_per_device=8", "reward.functions=[rl_user_reward:alternate]"]
# PPO's and P3O's presets take 4 optimizer steps a rollout (2 passes x 2 minibatches of 4 sequences)
FOUR_STEPS = ["train.max_steps=4", "train.micro_batch_per_device=4"]

# name: (algo preset, overrides); the chain's order: parents first
STAGES = {
    "sft": ("sft", SUPERVISED),
    "rm": ("rm", SUPERVISED),
    "prm": ("prm", SUPERVISED),
    "dpo": ("dpo", SUPERVISED),
    # a 4-step SFT model solves nothing: keep every sample (reward 0 > -1), so the fine-tuning has data
    "rft": ("rft", ["train.max_steps=3", "train.batch_size=8", "train.micro_batch_per_device=4",
                    "rollout.max_new_tokens=24", "algo.rft_threshold=-1.0"]),
    "grpo": ("grpo", [*RL, "rollout.samples_per_prompt=4"]),
    "grpo_process": ("grpo_process", [*RL, "rollout.samples_per_prompt=4"]),
    "iterative": ("grpo", [*RL, "rollout.samples_per_prompt=4", "reward=prm", "iterative.iterations=2",
                           "iterative.rm_steps=2", "train.max_steps=4"]),
    "online_rft": ("online_rft", [*RL, "rollout.samples_per_prompt=4"]),
    "ppo": ("ppo", [*RL, "rollout.samples_per_prompt=2", *FOUR_STEPS]),
    "p3o_joint": ("p3o", [*RL, "algo.pairwise_loss=p3o_joint", *FOUR_STEPS]),
    "p3o_separate": ("p3o", [*RL, "algo.pairwise_loss=p3o_separate", *FOUR_STEPS]),
    "online_dpo": ("online_dpo", [*RL, "rollout.samples_per_prompt=2"]),
}


def baseline_tree(out: Path, rev: str) -> Path:
    """The revision checked out (once) as a detached worktree under the output folder."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    tree = out / f"baseline-{sha[:10]}"
    if not (tree / "rlft").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), sha], check=True,
                       capture_output=True)
    return tree


def train(code: Path, root: Path, name: str, extra: list[str], log: Path) -> float:
    """One stage with the rlft of `code` under root/<name>; returns its wall time (0 when already done)."""
    algo, overrides = STAGES[name]
    if (root / name / "manifest.json").exists():  # a finished stage
        return 0.0
    args = ["train", f"algo={algo}", "run.name=chain", f"run.root={root.parent}", f"run.dir={root / name}", "seed=0",
            *SMALL, *overrides, *extra]  # parents: stage:sft, stage:rm, ...
    env = {"PYTHONPATH": os.pathsep.join([str(code), str(code / "tests" / "data")]), "WANDB_MODE": "disabled"}
    return rlft_command(args, log, tag=f"same_weights {code.name}", env=env, cwd=root).seconds


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def compare(a: Path, b: Path) -> dict:
    wa, wb = weights(a), weights(b)
    if set(wa) != set(wb):
        return {"same_names": False}
    abs_max = rel_max = 0.0
    bitwise = True
    for k in wa:
        diff = (wa[k].double() - wb[k].double()).abs().max().item() if wa[k].numel() else 0.0
        scale = max(wa[k].double().abs().max().item(), 1e-12) if wa[k].numel() else 1.0
        abs_max, rel_max = max(abs_max, diff), max(rel_max, diff / scale)
        bitwise &= bool(wa[k].equal(wb[k]))
    return {"same_names": True, "max_abs": abs_max, "max_rel": rel_max, "bitwise": bitwise, "tensors": len(wa)}


def moved(parent: Path, child: Path) -> float:
    """The largest absolute change of a tensor the two models share."""
    wa, wb = weights(parent), weights(child)
    common = [k for k in wa if k in wb and wa[k].shape == wb[k].shape]
    return max(((wa[k].double() - wb[k].double()).abs().max().item() for k in common if wa[k].numel()), default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision to compare this checkout with")
    ap.add_argument("--out", default="same_weights")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path("runs") / args.out
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    base = baseline_tree(out, args.baseline)
    wanted = set(args.stages.split(",")) | {"sft", "rm", "prm"}  # the parents, always
    results = {}
    for name in [s for s in STAGES if s in wanted]:
        row = {}
        for side, code in (("baseline", base), ("current", REPO)):
            root = out / side / "chain"
            root.mkdir(parents=True, exist_ok=True)
            row[f"{side}_s"] = round(train(code, root, name, args.overrides, root / f"{name}.log"), 1)
        row.update(compare(out / "baseline" / "chain" / name / "final", out / "current" / "chain" / name / "final"))
        if name != "sft":  # how far training moved it from the SFT model (common tensors): the check is not vacuous
            row["moved"] = moved(out / "current" / "chain" / "sft" / "final", out / "current" / "chain" / name / "final")
        results[name] = row
        print(f"[same_weights] {name}: {row}", flush=True)
    (out / "same_weights.json").write_text(json.dumps({"baseline": args.baseline, "overrides": args.overrides,
                                                       "stages": results}, indent=1))
    lines = [f"baseline {args.baseline} vs this checkout; overrides: {' '.join(args.overrides) or 'none'}", "",
             "| stage | bitwise equal | largest abs. difference | largest relative | moved from SFT (abs.) | baseline s | "
             "current s |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r.get('bitwise')} | {r.get('max_abs', float('nan')):.2e} | "
                     f"{r.get('max_rel', float('nan')):.2e} | {r.get('moved', float('nan')):.2e} | {r['baseline_s']} | "
                     f"{r['current_s']} |")
    (out / "same_weights.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
