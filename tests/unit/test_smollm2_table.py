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
