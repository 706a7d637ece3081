#!/usr/bin/env python3
"""KL-reward frontier (P3O paper, section 5): sweep the KL coefficient beta of each RL algorithm
from one SFT model, evaluate every run's held-out reward and KL to the SFT model, and plot each
algorithm's frontier.

    python scripts/frontier.py                                   # PPO, P3O, GRPO on the built-in task
    python scripts/frontier.py --run frontier --algos ppo,p3o,grpo,online_dpo --steps 100
    python scripts/frontier.py --betas grpo=0,0.04,0.2 --rl-arg rollout.prompts_per_step=16 -- deepspeed.threads_per_rank=1
    python scripts/frontier.py --algos ppo,p3o --budget 6400 --seeds 0,1,2     # equal samples, 3 seeds

Overrides after `--` go to every rlft command (training and evaluation); --rl-arg and --parent-arg
to the RL trainings or the SFT/RM trainings only.

Per algorithm one Hydra multirun, `rlft train -m algo=<algo> algo.kl_coef=<b1>,<b2>,... seed=<s1>,...`
(online DPO: `pairwise.beta`), each run `--steps` optimizer steps or, with `--budget`, that many sampled
completions (`train.max_samples`: equal samples whatever the algorithm's rollout shape), into
runs/<run>/frontier/<algo>/<job>/; the SFT (and RM, which PPO's critic starts from) are trained
first unless complete. Each job is then evaluated with `rlft eval` on the same held-out problems:
the mean reward of the policy's own samples at temperature 1 and the sequence-level KL to the SFT
model on the same samples (eval.reference=stage:sft). Finished trainings and evaluations are not
redone, so an interrupted frontier resumes where it stopped.

Writes runs/<run>/frontier/frontier.csv (algo, beta, seed, reward, kl_to_ref, accuracy, ...; one row per
run) and frontier.png (reward against KL, one line per algorithm through the means over seeds, with
±1 std bars; the SFT model at KL 0).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from rlft.experiments import rlft_command
from rlft.files.handoff import read_manifest

DEFAULT_BETAS = {"ppo": [0.01, 0.05, 0.2], "p3o": [0.01, 0.05, 0.2], "grpo": [0.01, 0.04, 0.2],
                 "online_dpo": [0.05, 0.1, 0.5]}
# The key that sets each algorithm's KL strength: DPO's beta for online DPO, algo.kl_coef otherwise.
BETA_KEY = {"online_dpo": "pairwise.beta"}
# Algorithms that are a preset with other options: name -> (preset, overrides).
VARIANTS = {"p3o_separate": ("p3o", ["algo.pairwise_loss=p3o_separate"])}
DEFAULT_BETAS["p3o_separate"] = DEFAULT_BETAS["p3o"]


def preset(algo: str) -> tuple[str, list[str]]:
    """The preset an algorithm of the frontier runs, and the overrides that make it that algorithm."""
    return VARIANTS.get(algo, (algo, []))
COLUMNS = ["algo", "beta", "seed", "reward", "kl_to_ref", "kl_to_ref_per_token", "greedy_accuracy", "rm_score",
           "samples_seen", "dir"]


def rlft(*args: str) -> None:
    rlft_command(list(args), tag="frontier")


def job_dirs(sweep: Path, algo: str) -> list[Path]:
    return sorted((p / algo for p in sweep.iterdir() if (p / algo).is_dir()), key=lambda p: int(p.parent.name)) \
        if sweep.is_dir() else []


def beta_of(stage_dir: Path) -> float:
    from omegaconf import OmegaConf

    return float(OmegaConf.select(OmegaConf.load(stage_dir / "config.yaml"),
                                  BETA_KEY.get(stage_dir.name, "algo.kl_coef")))


def seed_of(stage_dir: Path) -> int:
    from omegaconf import OmegaConf

    return int(OmegaConf.load(stage_dir / "config.yaml").seed)


def finished(sweep: Path, algo: str) -> list[Path]:
    return [d for sub in sorted(sweep.glob("sweep*")) for d in job_dirs(sub, algo) if read_manifest(d) is not None]


def train_sweep(args, algo: str, betas: list[float], common: list[str]) -> list[Path]:
    sweep = args.root / args.run / "frontier" / algo
    name, options = preset(algo)  # each job writes <sweep>/<job>/<preset name>/
    done = {(beta_of(d), seed_of(d)) for d in finished(sweep, name)}
    length = f"train.max_samples={args.budget}" if args.budget else f"train.max_steps={args.steps}"
    for seed in args.seeds:
        todo = [b for b in betas if (b, seed) not in done]
        if todo:
            # one multirun per seed for the betas still missing (an interrupted frontier adds a new sub-sweep)
            sub = sweep / f"sweep{len(list(sweep.glob('sweep*')))}"
            rlft("train", "-m", f"algo={name}", *options,
                 f"{BETA_KEY.get(name, 'algo.kl_coef')}={','.join(str(b) for b in todo)}",
                 f"seed={seed}", length, f"hydra.sweep.dir={sub}", *common, *args.rl_arg)
    return [d for d in finished(sweep, name) if beta_of(d) in betas and seed_of(d) in args.seeds]


def evaluate(args, algo: str, stage_dir: Path, common: list[str]) -> dict:
    beta, seed = beta_of(stage_dir), seed_of(stage_dir)
    tag = f"frontier_{algo}_beta{beta:g}" + (f"_s{seed}" if seed else "")
    record = args.root / args.run / "eval" / tag / "eval.json"
    if not record.is_file() or record.stat().st_mtime < (stage_dir / "manifest.json").stat().st_mtime:
        rlft("eval", f"model.path={stage_dir / 'final'}", f"eval.tag={tag}", "eval.reference=stage:sft",
             *args.eval_args, *common)
    m = json.loads(record.read_text())["metrics"]
    seen = json.loads((stage_dir / "manifest.json").read_text()).get("summary", {}).get("samples_seen", "")
    return {"algo": algo, "beta": beta, "seed": seed, "reward": m["reward"], "kl_to_ref": m["kl_to_ref"],
            "kl_to_ref_per_token": m["kl_to_ref_per_token"], "greedy_accuracy": m["greedy_accuracy"],
            "rm_score": m.get("rm_score", ""), "samples_seen": seen, "dir": str(stage_dir)}


def sft_point(args, common: list[str]) -> dict:
    record = args.root / args.run / "eval" / "frontier_sft" / "eval.json"
    sft = args.root / args.run / "sft"
    if not record.is_file() or record.stat().st_mtime < (sft / "manifest.json").stat().st_mtime:
        rlft("eval", "model.path=stage:sft", "eval.tag=frontier_sft", *args.eval_args, *common)
    m = json.loads(record.read_text())["metrics"]
    return {"algo": "sft", "beta": "", "seed": "", "reward": m["reward"], "kl_to_ref": 0.0, "kl_to_ref_per_token": 0.0,
            "greedy_accuracy": m["greedy_accuracy"], "rm_score": m.get("rm_score", ""), "samples_seen": "",
            "dir": str(sft)}


def mean_points(rows: list[dict]) -> list[dict]:
    """One point per (algo, beta): mean and std over its seeds of reward, KL and greedy accuracy."""
    from rlft.eval.compare import mean_std

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["algo"], r["beta"]), []).append(r)
    points = []
    for (algo, beta), runs in groups.items():
        point = {"algo": algo, "beta": beta, "seeds": len(runs)}
        for key in ("reward", "kl_to_ref", "greedy_accuracy"):
            point[key], point[key + "_std"] = mean_std([float(r[key]) for r in runs])
        points.append(point)
    return points


def plot(points: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    sft = [r for r in points if r["algo"] == "sft"]
    for algo in dict.fromkeys(r["algo"] for r in points if r["algo"] != "sft"):
        line = sorted((r for r in points if r["algo"] == algo), key=lambda r: r["kl_to_ref"])
        bars = ax.errorbar([r["kl_to_ref"] for r in line], [r["reward"] for r in line],
                           xerr=[r["kl_to_ref_std"] for r in line], yerr=[r["reward_std"] for r in line],
                           marker="o", capsize=3, label=algo)
        for r in line:
            ax.annotate(f"β={r['beta']:g}", (r["kl_to_ref"], r["reward"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points", color=bars.lines[0].get_color())
    if sft:
        ax.scatter([0.0], [sft[0]["reward"]], color="black", marker="s", label="SFT (KL 0)", zorder=3)
    ax.set_xlabel("KL(policy || SFT), nats per completion (held-out prompts)")
    ax.set_ylabel("reward of the policy's samples (held-out)")
    ax.set_title("KL-reward frontier" + (" (mean ± std over seeds)" if any(r["seeds"] > 1 for r in points) else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_betas(specs: list[str], algos: list[str]) -> dict[str, list[float]]:
    betas = {a: DEFAULT_BETAS.get(a, [0.01, 0.05, 0.2]) for a in algos}
    for spec in specs:
        algo, _, values = spec.partition("=")
        if algo not in betas or not values:
            raise SystemExit(f"--betas {spec}: expected <algo>=<b1>,<b2>,... with algo in {','.join(algos)}")
        betas[algo] = [float(v) for v in values.split(",")]
    return betas


def main(argv: list[str]) -> None:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default="frontier", help="run name (runs/<run>/...)")
    p.add_argument("--root", type=Path, default=Path("runs"), help="run.root")
    p.add_argument("--algos", default="ppo,p3o,grpo", help="comma-separated RL algorithms: presets, or "
                   + ", ".join(f"{k} ({v[0]} with {' '.join(v[1])})" for k, v in VARIANTS.items()))
    p.add_argument("--betas", action="append", default=[], help="<algo>=<b1>,<b2>,... (repeatable)")
    p.add_argument("--steps", type=int, default=100, help="RL optimizer steps per run (without --budget)")
    p.add_argument("--budget", type=int, default=0, help="sampled completions per run (train.max_samples)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds of every (algo, beta)")
    p.add_argument("--eval-problems", type=int, default=200, help="held-out problems per evaluation")
    p.add_argument("--policy-samples", type=int, default=4, help="samples per problem for reward and KL")
    p.add_argument("--rl-arg", action="append", default=[], help="an override for the RL trainings only")
    p.add_argument("--parent-arg", action="append", default=[], help="an override for the SFT and RM trainings only")
    args = p.parse_args(argv)
    algos = [a for a in args.algos.split(",") if a]
    args.seeds = [int(x) for x in args.seeds.split(",") if x]
    betas = parse_betas(args.betas, algos)
    common = [f"run.name={args.run}", f"run.root={args.root}", *extra]
    args.eval_args = [f"eval.num_problems={args.eval_problems}", f"eval.policy_samples={args.policy_samples}",
                      "eval.samples=4", "eval.k=[1,4]"]
    for stage in ("sft", "rm"):
        if read_manifest(args.root / args.run / stage) is None:
            rlft("train", f"algo={stage}", *common, *args.parent_arg)
    rows = [sft_point(args, common)]
    for algo in algos:
        for stage_dir in train_sweep(args, algo, betas[algo], common):
            rows.append(evaluate(args, algo, stage_dir, common))
    out = args.root / args.run / "frontier"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "frontier.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    points = mean_points(rows)
    plot(points, out / "frontier.png")
    print("| algo | beta | seeds | reward | KL to SFT (nats) | greedy accuracy |\n|---|---|---|---|---|---|")
    for r in points:
        beta = f"{r['beta']:g}" if r["beta"] != "" else "-"
        cells = [f"{r[k]:.3f} ± {r[k + '_std']:.3f}" for k in ("reward", "kl_to_ref", "greedy_accuracy")]
        print(f"| {r['algo']} | {beta} | {r['seeds']} | " + " | ".join(cells) + " |")
    print(f"[frontier] wrote {out / 'frontier.csv'} and {out / 'frontier.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
