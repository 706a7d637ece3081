"""scripts/smollm2_table.py's pure parts: the GSM8K-format files it writes and the table it makes."""
from __future__ import annotations

import importlib.util
import json

from helpers import REPO

spec = importlib.util.spec_from_file_location("smollm2_table", REPO / "scripts" / "smollm2_table.py")
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)


def test_gsm8k_files_are_disjoint_and_ask_for_the_answer_format(tmp_path):
    train, test = table.gsm8k_files(tmp_path / "rows", train_rows=60, test_rows=20)
    rows = {name: [json.loads(line) for line in open(path)] for name, path in (("train", train), ("test", test))}
    assert len(rows["test"]) == 20 and 0 < len(rows["train"]) <= 60
    assert not {r["question"] for r in rows["train"]} & {r["question"] for r in rows["test"]}
    for r in rows["train"] + rows["test"]:
        assert r["question"].endswith(table.INSTRUCTION) and r["answer"].startswith("#### ")
    assert table.gsm8k_files(tmp_path / "rows") == (train, test)  # written once, then reused


def write_eval(root, tag: str, greedy: float) -> None:
    out = root / "eval" / tag
    out.mkdir(parents=True)
    (out / "eval.json").write_text(json.dumps({"metrics": {"greedy_accuracy": greedy, "pass@4": greedy + 0.1}}))


def test_table_gains_over_the_base_model_and_over_each_seeds_sft(tmp_path):
    write_eval(tmp_path, "chain_sum-base", 0.0)
    for seed, (sft, grpo) in enumerate([(0.50, 0.56), (0.40, 0.50)]):
        write_eval(tmp_path, f"chain_sum-sft_s{seed}", sft)
        write_eval(tmp_path, f"chain_sum-grpo_s{seed}", grpo)
    times = {"chain_sum/grpo_s0": 3000.0, "chain_sum/grpo_s1": 3600.0}
    table.write_table(tmp_path, ["chain_sum"], [0, 1], ["grpo", "online_rft"], times)
    lines = (tmp_path / "smollm2_table.md").read_text().splitlines()
    grpo = next(line for line in lines if "| grpo |" in line)
    cells = [c.strip() for c in grpo.split("|")[1:-1]]
    assert cells[2] == "2" and cells[3] == "53.0 ± 4.2"  # greedy over the two seeds
    assert cells[5] == "53.0 ± 4.2" and cells[6] == "8.0 ± 2.8"  # over base (0), over each seed's own SFT
    assert cells[7] == ""  # no samples written, no paired count
    assert cells[8] == "55"  # minutes, the mean run time
    assert not any("online_rft" in line for line in lines)  # no evaluation, no row


def write_samples(root, tag: str, right: list[bool]) -> None:
    with open(root / "eval" / tag / "samples.jsonl", "w") as f:
        for i, ok in enumerate(right):
            f.write(json.dumps({"prompt": f"q{i % 3}", "greedy": {"correct": ok}}) + "\n")


def test_fixed_and_broken_problems_pair_each_seed_with_its_own_sft(tmp_path):
    write_eval(tmp_path, "chain_sum-base", 0.0)
    runs = {0: ([0, 0, 1, 1], [1, 1, 1, 0]), 1: ([1, 0, 0, 1], [1, 1, 0, 1])}  # seed: (sft, grpo) per problem
    for seed, (sft, grpo) in runs.items():
        for name, right in (("sft", sft), ("grpo", grpo)):
            write_eval(tmp_path, f"chain_sum-{name}_s{seed}", sum(right) / 4)
            write_samples(tmp_path, f"chain_sum-{name}_s{seed}", [bool(r) for r in right])
    table.write_table(tmp_path, ["chain_sum"], [0, 1], ["grpo"], {})
    grpo = next(line for line in (tmp_path / "smollm2_table.md").read_text().splitlines() if "| grpo |" in line)
    assert grpo.split("|")[8].strip() == "3 / 1 (p = 0.31)"  # seed 0: 2 fixed, 1 broken; seed 1: 1 fixed


def test_grpo_40_stops_the_grpo_run_that_grpo_resumes_and_distillation_learns_from_it(tmp_path):
    algos = ["grpo_40", "grpo", "distill", "distill_outcome"]
    out, done, half = table.train_args(tmp_path, "chain_sum", 1, "grpo_40", algos)
    assert out == tmp_path / "chain_sum" / "grpo_s1" and done == out / "manifest.json"
    assert "train.max_steps=40" in half and "resume=true" not in half
    out_full, done_full, full = table.train_args(tmp_path, "chain_sum", 1, "grpo", algos)
    assert out_full == out and done_full is None  # a continued run leaves no file of its own: times.json says
    assert {"resume=true", "train.max_steps=80", "seed=1"} <= set(full)
    assert "resume=true" not in table.train_args(tmp_path, "chain_sum", 1, "grpo", ["grpo"])[2]  # alone: 80 at once
    _, _, distill = table.train_args(tmp_path, "chain_sum", 1, "distill_outcome", algos)
    teacher = f"teacher.path={(tmp_path / 'chain_sum' / 'grpo_s1' / 'final').resolve()}"
    student = f"model.path={(tmp_path / 'chain_sum' / 'sft_s1' / 'final').resolve()}"
    assert {teacher, student, "algo=distill", "algo.kl_coef=0", "train.max_steps=40",
            "algo.outcome_weight=1.0"} <= set(distill)
    assert table.order_problem(algos) is None
    assert "grpo_40 before grpo" in table.order_problem(["grpo", "grpo_40"])
    assert "grpo before distill" in table.order_problem(["distill", "grpo"])
    assert "grpo before distill" in table.order_problem(["grpo_40", "distill"])  # no teacher at all
    assert table.order_problem(["distill"], teacher="/m/teacher") is None  # one teacher for every seed (--teacher)
    assert "teacher.path=/m/teacher" in table.train_args(tmp_path, "chain_sum", 1, "distill", ["distill"],
                                                         "/m/teacher")[2]


def test_the_distillation_recipe_composes_from_the_grpo_recipe():
    from helpers import compose_config

    _, _, args = table.train_args(REPO / "runs", "chain_sum", 0, "distill_outcome", ["grpo", "distill_outcome"])
    cfg = compose_config(*[a for a in args if not a.startswith("run.dir=")])
    assert cfg.algo.name == "distill" and cfg.algo.kl_coef == 0 and cfg.algo.outcome_weight == 1.0
    assert cfg.train.max_steps == 40 and cfg.rollout.prompts_per_step == 16 and cfg.train.lr == 2e-6  # the recipe's
    assert cfg.teacher.path.endswith("grpo_s0/final")


def test_distillation_table_shares_of_the_teachers_gain_and_pairs_with_grpo_at_equal_samples(tmp_path):
    right = {"sft": [0, 0, 0, 1], "grpo": [1, 1, 0, 1], "grpo_40": [1, 0, 0, 1], "distill": [1, 1, 0, 0]}
    for name, r in right.items():  # one seed; the teacher (grpo) gains 50 points, grpo_40 25, distill 25
        write_eval(tmp_path, f"chain_sum-{name}_s0", sum(r) / 4)
        write_samples(tmp_path, f"chain_sum-{name}_s0", [bool(x) for x in r])
    lines = table.distill_lines(tmp_path, "chain_sum", [0], ["grpo_40", "distill", "distill_outcome"])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[4:]}
    assert set(rows) == {"sft", "grpo_40", "distill"}  # no distill_outcome evaluation, no row
    assert rows["distill"] == ["1", "25.0", "50%", "1 / 1 (p = 0.75)", "75.0%"]  # vs grpo_40: q1 fixed, q3 broken
    assert rows["grpo_40"][2:] == ["50%", "", "75.0%"] and rows["sft"][3:] == ["", "50.0%"]


def test_a_shared_teachers_evaluation_is_every_seeds_teacher(tmp_path):
    write_eval(tmp_path, "chain_sum-teacher", 0.9)  # --teacher: evaluated once, the teacher of seeds 0 and 1
    for seed, (sft, distill) in enumerate([(0.5, 0.7), (0.7, 0.7)]):
        write_eval(tmp_path, f"chain_sum-sft_s{seed}", sft)
        write_eval(tmp_path, f"chain_sum-distill_s{seed}", distill)
    lines = table.distill_lines(tmp_path, "chain_sum", [0, 1], ["distill"], shared=True)
    distill = next(line for line in lines if line.startswith("| distill |"))
    assert [c.strip() for c in distill.split("|")[2:5]] == ["2", "10.0 ± 14.1", "33%"]  # 10 of the mean 30 points
    assert "--teacher" in lines[0]
    assert not [line for line in table.distill_lines(tmp_path, "chain_sum", [0, 1], ["distill"]) if "| distill" in line]
    for seed in (0, 1):
        write_eval(tmp_path, f"chain_sum-grpo_40_s{seed}", 0.6)
    table.write_table(tmp_path, ["chain_sum"], [0, 1], ["grpo_40", "distill"], {}, shared_teacher=True)
    rows = [line.split("|")[1].strip() for line in (tmp_path / "smollm2_table.md").read_text().split("\n\n")[-1]
            .splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["model", "sft", "grpo_40", "distill"]  # each model once
