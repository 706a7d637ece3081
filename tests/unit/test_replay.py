"""Iterative RL's replay: the reward model's own earlier training rows, kept as JSON lines."""
from types import SimpleNamespace

from omegaconf import OmegaConf

from rlft.data.tokenizer import build_char_tokenizer
from rlft.stages import iterative, policy_data

PAIR = {"prompt_text": "Q: 1+2?\nA:\n", "chosen": "1+2=3\n#### 3", "rejected": "1+2=4\n#### 4"}
SOLUTION = {"prompt_text": "Q: 5-1?\nA:\n", "steps": ["5-1=4", "#### 4"], "labels": [1, 1]}


def fake_iterations(tmp_path, ratio=0.1):
    cfg = OmegaConf.create({"iterative": {"replay_ratio": ratio}, "train": {"max_seq_len": 64}, "seed": 0})
    return SimpleNamespace(cfg=cfg, ctx=SimpleNamespace(run_dir=tmp_path / "grpo"))


def test_rows_encode_as_the_reward_stages_encode_them():
    tok = build_char_tokenizer()
    (pair,) = policy_data.encode_rows("rm", tok, [PAIR], 64)
    assert pair["row"] == PAIR and len(pair["chosen_ids"]) > len(tok(PAIR["prompt_text"])["input_ids"])
    (sol,) = policy_data.encode_rows("prm", tok, [SOLUTION], 64)
    assert sol["step_labels"] == [1, 1] and len(sol["step_positions"]) == 2
    # a solution whose steps all fall past max_len trains nothing and is dropped
    assert policy_data.encode_rows("prm", tok, [SOLUTION], 8) == []


def test_rows_round_trip_through_the_file_and_only_rows_are_kept(tmp_path):
    path = tmp_path / "train_data.jsonl"
    assert policy_data.save_rows(path, [{"row": PAIR}, {"chosen_ids": [1]}, {"row": PAIR}]) == 2
    assert policy_data.load_rows(path) == [PAIR, PAIR]
    assert policy_data.save_rows(tmp_path / "none.jsonl", [{"chosen_ids": [1]}]) == 0
    assert not (tmp_path / "none.jsonl").exists()


def test_where_a_reward_models_rows_live(tmp_path):
    assert policy_data.train_data_file(tmp_path / "prm" / "final") == tmp_path / "prm" / "train_data.jsonl"
    it = tmp_path / "grpo" / "iterations" / "iter-0"
    assert policy_data.train_data_file(it / "prm") == it / "prm_train_data.jsonl"


def test_replay_draws_from_the_stage_rows_and_earlier_iterations(tmp_path):
    tok = build_char_tokenizer()
    it = fake_iterations(tmp_path)
    (tmp_path / "rm").mkdir()
    stage_rows = [{**PAIR, "chosen": f"1+2=3\n#### 3{' ' * i}"} for i in range(30)]
    policy_data.save_rows(tmp_path / "rm" / "train_data.jsonl", [{"row": r} for r in stage_rows])
    added = [{**PAIR, "prompt_text": f"Q: {i}+2?\nA:\n"} for i in range(10)]
    it0 = it.ctx.run_dir / "iterations" / "iter-0"
    it0.mkdir(parents=True)
    policy_data.save_rows(it0 / "rm_train_data.jsonl", [{"row": r} for r in added])
    scorer = SimpleNamespace(path=str(tmp_path / "rm" / "final"), tokenizer=tok)

    assert iterative.history_rows(it, "rm", scorer, 0) == stage_rows
    assert iterative.history_rows(it, "rm", scorer, 1) == stage_rows + added
    # 90 new examples -> 10 replayed (10% of the mix), drawn from the history, encoded
    replay = iterative.replay_examples(it, "rm", scorer, 90, 1, seed=3)
    assert len(replay) == 10
    assert all(ex["row"] in stage_rows + added for ex in replay)
    assert replay == iterative.replay_examples(it, "rm", scorer, 90, 1, seed=3)  # seeded
    assert iterative.replay_examples(it, "rm", scorer, 0, 1, seed=3) == []
    assert iterative.replay_examples(fake_iterations(tmp_path, ratio=0.0), "rm", scorer, 90, 1, seed=3) == []


def test_a_reward_model_without_kept_rows_has_no_history(tmp_path):
    scorer = SimpleNamespace(path=str(tmp_path / "rm" / "final"), tokenizer=None)
    assert iterative.history_rows(fake_iterations(tmp_path), "rm", scorer, 1) is None


def test_iteration_rows_with_exact_step_labels_need_no_continuations():
    """iterative.step_labels=exact: each step checked against the worked solution; as many correct as
    incorrect completions, at most label_budget incorrect ones; nothing is sampled."""
    from rlft.config.schema import Config
    from rlft.envs.math import MathEnv

    cfg = OmegaConf.merge(OmegaConf.structured(Config), {"iterative": {"step_labels": "exact", "label_budget": 2}})
    # episodes=None: sampling continuations would fail
    it = SimpleNamespace(cfg=cfg, experience=SimpleNamespace(env=MathEnv(cfg), episodes=None))
    rec = {"prompt_text": "Q: ?\nA:\n", "row": {"prompt": "?", "response": "5-1=4\n4*2=8\n#### 8", "answer": "8"}}
    right = {**rec, "completion": "5-1=4\n4*2=8\n#### 8", "correct": True}
    slip = {**rec, "completion": "5-1=3\n3*2=6\n#### 6", "correct": False}
    late = {**rec, "completion": "5-1=4\n4*2=9\n#### 9", "correct": False}
    newest = {**right, "completion": "5-1=4\n4*2=8\n#### 8.0"}
    rows = iterative.new_rows(it, "prm", [slip, right, slip, late, right, newest])
    # the newest two incorrect completions and as many of the newest correct ones, in that order
    assert [r["labels"] for r in rows] == [[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 0]]
    assert rows[1]["steps"] == ["5-1=4", "4*2=8", "#### 8.0"]


def reference_after_an_iteration(tmp_path, reset: bool):
    """Iterations closes iteration 0 of two (one rollout each) and swaps the experience step's reference
    through its interface."""
    from rlft.config.algorithms import RLConfig
    from rlft.config.schema import Config
    from rlft.stages.experience import Experience

    loaded = []
    cfg = OmegaConf.merge(OmegaConf.structured(Config), {"iterative": {"reset_reference": reset, "iterations": 2},
                                                         "train": {"max_steps": 2}})
    cfg.algo = OmegaConf.structured(RLConfig)
    experience = Experience(cfg, None, None, SimpleNamespace(), rewards=SimpleNamespace(models={}), reference="sft")
    its = iterative.Iterations(cfg, SimpleNamespace(run_dir=tmp_path), experience,
                               SimpleNamespace(export_hf=lambda path, tok: None),
                               lambda path: loaded.append(path) or f"policy at {path}")
    its.samples = [{"completion": "x"}]
    assert its.starts(1) and not its.starts(0) and its.state() == {"samples_log": its.samples}
    report = its.next(1)
    assert its.samples == []
    return experience.reference, loaded, report


def test_the_reference_resets_to_the_policy_unless_told_to_stay(tmp_path):
    ref, loaded, report = reference_after_an_iteration(tmp_path, reset=True)
    policy = str(tmp_path / "iterations" / "iter-0" / "policy")
    assert ref == f"policy at {policy}" and loaded == [policy] and report["reference"] == policy
    ref, loaded, report = reference_after_an_iteration(tmp_path, reset=False)
    assert ref == "sft" and loaded == [] and "reference" not in report
