"""Every YAML under conf/ composes against the structured schema; validation errors are one line.

Composition uses Hydra's compose API on the same conf/ directory and schemas the CLI uses, so a
YAML key that the schema lacks (or a type mismatch) fails here rather than in a user's run.
"""
from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from rlft.config.algorithms import ALGO_SCHEMAS, ALGOS, algo_spec
from rlft.config.arithmetic import grad_accum_steps
from rlft.config.docs import describe_keys
from rlft.config.schema import SECTIONS, TrainConfig, register_schemas
from rlft.config.validate import validate
from rlft.errors import ConfigError
from rlft.overrides import GROUP_KEYS, algo_kind, conf_dir, group_options

# Options whose YAML leaves a mandatory value (???) for the user to fill.
REQUIRED_FILL = {
    ("model", "hf"): ["model.path=/some/hf/dir"],
    ("data", "jsonl"): ["data.source=/some/file.jsonl"],
    ("algo", "distill"): ["teacher.path=builtin:tiny"],
}


def _compose(overrides: list[str]):
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _group_cases():
    cases = []
    for group in GROUP_KEYS:
        for option in group_options(group):
            cases.append((group, option))
    return cases


def test_every_group_has_options_and_descriptions():
    from rlft.overrides import option_description

    assert {"sft", "rm", "prm"} <= set(group_options("algo"))
    assert {"zero0", "zero1", "zero2", "zero3", "cpu"} <= set(group_options("deepspeed"))
    assert {"tiny", "hf"} <= set(group_options("model"))
    assert {"arith", "gsm8k", "jsonl"} <= set(group_options("data"))
    for group, option in _group_cases():
        assert option_description(group, option), f"conf/{group}/{option}.yaml has no leading comment"


def test_defaults_compose_and_validate():
    cfg = _compose([])
    validate(cfg)
    assert cfg.algo.name == "sft"
    assert cfg.deepspeed.zero_stage == 0
    assert cfg.model.path == "auto"
    assert cfg.data.source == "builtin:arith"
    assert cfg.run.name == "default" and cfg.run.root == "runs"
    # the schema's structure survives composition: no key is lost or added by the defaults
    container = OmegaConf.to_container(cfg, resolve=True)
    assert set(container) == set(SECTIONS)


@pytest.mark.parametrize("group,option", _group_cases(), ids=lambda x: str(x))
def test_every_group_option_composes_and_validates(group, option):
    overrides = [f"{group}={option}"] + REQUIRED_FILL.get((group, option), [])
    cfg = _compose(overrides)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # no ??? left, interpolations resolve
    validate(cfg)
    if group == "algo":
        assert cfg.algo.name == option
        assert isinstance(cfg.algo.init_from, str) and cfg.algo.init_from
    if group == "deepspeed" and option.startswith("zero"):
        assert cfg.deepspeed.zero_stage == int(option[len("zero"):])


@pytest.mark.parametrize("algo", group_options("algo"))
def test_algo_yaml_is_typed_by_its_schema(algo):
    """algo=<preset> composes into its loop's dataclass (so its keys are type-checked)."""
    cfg = _compose([f"algo={algo}"])
    kind = algo_kind(algo)
    assert cfg.algo.kind == kind and algo_spec(cfg.algo) is ALGOS[kind]
    schema_keys = {f.name for f in dataclasses.fields(ALGO_SCHEMAS[kind])}
    assert set(cfg.algo.keys()) == schema_keys
    with pytest.raises(Exception):  # struct mode: an unknown algo key is rejected by Hydra too
        _compose([f"algo={algo}", "algo.no_such_key=1"])


def test_engine_zero_options_compose_with_other_groups():
    cfg = _compose(["algo=rm", "deepspeed=zero3", "deepspeed.nproc_per_node=2", "train.batch_size=32",
                    "train.micro_batch_per_device=8"])
    validate(cfg)
    assert (cfg.algo.name, cfg.deepspeed.zero_stage, grad_accum_steps(cfg)) == ("rm", 3, 2)


def _one_line_error(overrides: list[str], *needles: str) -> str:
    cfg = _compose(overrides)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    assert message and "\n" not in message, repr(message)
    for needle in needles:
        assert needle in message, message
    return message


def test_batch_not_divisible_is_one_line():
    _one_line_error(["train.batch_size=10", "train.micro_batch_per_device=4"],
                    "train.batch_size=10", "train.micro_batch_per_device")


def test_batch_not_divisible_counts_ranks():
    # 8 is a multiple of micro 4, but not of 4 x 3 ranks
    _one_line_error(["train.batch_size=8", "train.micro_batch_per_device=4", "deepspeed.nproc_per_node=3"],
                    "4 x 3")


def test_bad_zero_stage_is_one_line():
    _one_line_error(["deepspeed.zero_stage=4"], "deepspeed.zero_stage=4", "0, 1, 2, 3")


def test_eval_k_above_samples_is_one_line():
    _one_line_error(["eval.samples=2", "eval.k=[1,4]"], "eval.k", "eval.samples=2")


def test_other_value_errors_are_one_line():
    _one_line_error(["train.max_steps=0"], "train.max_steps=0")
    _one_line_error(["deepspeed.nnodes=2", "deepspeed.node_rank=2", "deepspeed.master_port=29500"],
                    "deepspeed.node_rank=2")
    _one_line_error(["deepspeed.nnodes=2"], "deepspeed.master_port=0")


def test_fixed_choices_are_checked_by_omegaconf():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as info:
        _compose(["train.lr_schedule=step"])
    assert "expected one of [cosine, linear, constant]" in str(info.value.__cause__)
    cfg = _compose(["train.lr_schedule=linear"])
    assert cfg.train.lr_schedule == "linear" and f"{cfg.train.lr_schedule}" == "linear"


def test_options_the_run_never_reads_are_refused():
    _one_line_error(["algo=grpo", "critic.lr=0.1"], "critic.lr=0.1", "trains no critic")
    _one_line_error(["algo=ppo", "pairwise.c=3"], "pairwise.c=3", "pairwise_loss=None")
    _one_line_error(["algo=p3o", "pairwise.beta=0.3"], "pairwise.beta=0.3", "p3o_joint")
    _one_line_error(["algo=online_dpo", "algo.kl_coef=0.1"], "algo.kl_coef=0.1", "pairwise.beta")
    _one_line_error(["algo=p3o", "algo.advantage=rloo"], "algo.advantage=rloo", "pairwise update")
    _one_line_error(["algo=grpo", "iterative.rm_steps=3"], "iterative.rm_steps=3", "iterations > 1")
    _one_line_error(["algo=sft", "critic.gamma=0.9"], "critic.gamma=0.9")
    _one_line_error(["algo=grpo", "iterative.iterations=2", "iterative.step_labels=exact",
                     "iterative.label_completions=8", "train.max_steps=20"], "iterative.label_completions=8",
                    "step_labels=mc")
    # asynchronous sampling: only the online RL loop, and its threads only when it is on
    _one_line_error(["algo=sft", "rollout.max_staleness=1"], "rollout.max_staleness=1", "online RL loop")
    _one_line_error(["algo=grpo", "rollout.sampler_threads=2"], "rollout.sampler_threads=2", "max_staleness > 0")
    _one_line_error(["algo=grpo", "rollout.max_staleness=1", "rollout.dynamic_sampling=true"],
                    "rollout.dynamic_sampling=true", "use one of them")
    _one_line_error(["algo=grpo", "rollout.max_staleness=1", "rollout.engine=vllm",
                     "rollout.vllm.tensor_parallel_size=2"], "tensor_parallel_size=1", "one sampler per rank")
    validate(_compose(["algo=grpo", "rollout.max_staleness=2", "rollout.sampler_threads=2"]))
    # a policy loss reads the options it declares when it registers
    _one_line_error(["algo=rloo", "algo.clip_eps_high=0.28"], "algo.clip_eps_high=0.28", "algo.policy_loss=reinforce")
    _one_line_error(["algo=grpo", "algo.policy_loss=gspo", "algo.dual_clip_c=3"], "algo.dual_clip_c=3",
                    "algo.policy_loss=gspo")
    validate(_compose(["algo=grpo", "algo.dual_clip_c=3", "algo.clip_eps_high=0.28"]))
    validate(_compose(["algo=p3o", "algo.clip_eps_low=0.1"]))
    # offline DPO samples questions only from the policy
    _one_line_error(["algo=dpo", "algo.num_prompts=50"], "algo.num_prompts=50", "algo.source=policy")
    validate(_compose(["algo=dpo", "algo.source=policy", "algo.num_prompts=50"]))
    validate(_compose(["algo=grpo", "iterative.iterations=2", "iterative.rm_steps=3", "train.max_steps=20"]))
    validate(_compose(["algo=p3o", "algo.pairwise_loss=p3o_separate", "pairwise.kl_at=current"]))
    validate(_compose(["algo=grpo", "algo.advantage=gae", "rollout.samples_per_prompt=2", "critic.lr=1e-3"]))


def test_env_options_the_chosen_environment_never_reads_are_refused_when_given(monkeypatch):
    """An env.* option on the command line that the built-in environment does not read (its `options_read`) is
    one line naming that environment's options; a recipe's options of another environment are not (switching
    env= on top of a recipe is how a user moves it), nor anything a user environment might read."""
    def given(*overrides):
        cfg = _compose(list(overrides))
        validate(cfg, given=list(overrides))

    for overrides, needles in [(["env=math", "env.task=leg_counting"], ["env.task", "env=math", "env.verifier"]),
                               (["env=reasoning_gym", "env.sandbox=none"], ["env.sandbox", "env.task_config"]),
                               (["env=calculator", "env.timeout_s=3"], ["env.timeout_s", "env=calculator"])]:
        cfg = _compose(overrides)
        with pytest.raises(ConfigError) as info:
            validate(cfg, given=overrides)
        assert "\n" not in str(info.value) and all(n in str(info.value) for n in needles), str(info.value)
    given("env=python", "env.sandbox=none", "env.timeout_s=3")
    given("env=reasoning_gym", "env.task=leg_counting", "env.seed=3")
    given("experiment=smollm2_sft", "env=math")  # the recipe's env.task_config is not the user's
    monkeypatch.syspath_prepend(str(conf_dir().parent / "tests" / "data"))
    given("env.name=toy_env:CountA", "env.task=anything")  # tests/data/toy_env.py


def test_each_option_that_only_some_runs_read_declares_a_known_rule():
    """`read_when` names a rule of READ_RULES (a typo would silently exempt the option); every rule is used."""
    from rlft.config.fields import read_rule
    from rlft.config.validate import READ_RULES
    from rlft.rollout.sampling import ENGINES

    declared = set()

    def walk(schema):
        for f in dataclasses.fields(schema):
            default = getattr(schema(), f.name)
            if dataclasses.is_dataclass(default):
                walk(type(default))
            elif read_rule(schema, f):
                name, _, arg = read_rule(schema, f).partition(":")
                assert name in READ_RULES, f"{schema.__name__}.{f.name}: {read_rule(schema, f)}"
                if name == "engine":  # engine:<a registered rollout engine>
                    assert arg in ENGINES and arg != "auto", f"{schema.__name__}.{f.name}: {read_rule(schema, f)}"
                declared.add(name)

    for schema in [*ALGO_SCHEMAS.values(), *(s for s in SECTIONS.values() if dataclasses.is_dataclass(s))]:
        walk(schema)
    assert declared == set(READ_RULES)


def test_rollout_errors_are_one_line():
    _one_line_error(["rollout.engine=sglang"], "rollout.engine='sglang'", "auto, hf, vllm")
    _one_line_error(["rollout.is_correction=clip"], "rollout.is_correction='clip'", "auto, mis, none, tis")
    _one_line_error(["rollout.is_cap=1.0"], "rollout.is_cap=1.0", "above 1")
    _one_line_error(["rollout.vllm.sleep_level=3"], "rollout.vllm.sleep_level=3", "1, 2")


def test_describe_keys_documents_every_key():
    for algo in ALGO_SCHEMAS:
        rows = describe_keys(None, algo)
        assert len(rows) > 40
        keys = [k for k, _, _ in rows]
        assert len(keys) == len(set(keys)), "duplicate keys"
        undocumented = [k for k, _, doc in rows if not doc.strip()]
        assert not undocumented, f"algo={algo}: keys without a docstring: {undocumented}"


def test_describe_keys_filters_by_prefix_and_shows_defaults():
    rows = {k: (d, doc) for k, d, doc in describe_keys("train")}
    assert all(k.startswith("train.") for k in rows)
    assert rows["train.max_samples"][0] == repr(TrainConfig().max_samples)
    assert rows["train.max_steps"][0] == "(table)"  # TrainConfig().max_steps is null: the defaults table fills it
    assert "data.task.seed" in {k for k, _, _ in describe_keys("data.task")}


@pytest.mark.parametrize("key", ["run.name", "seed", "train.max_steps", "deepspeed.zero_stage",
                                 "deepspeed.nproc_per_node"])
def test_public_contract_keys_exist(key):
    documented = {k for k, _, _ in describe_keys()}
    assert key in documented
    cfg = _compose([f"{key}=7" if key != "run.name" else "run.name=contract"])
    value = OmegaConf.select(cfg, key)
    assert value == (7 if key != "run.name" else "contract")


def _steps_for(overrides: list[str]) -> int:
    cfg = _compose(overrides)
    validate(cfg)
    return int(cfg.train.max_steps)


def test_a_sample_budget_sets_the_steps_of_every_loop():
    # RL: whole rollouts; GRPO's rollout is 32 x 8 = 256 completions, one optimizer step each
    assert _steps_for(["algo=grpo", "train.max_samples=25600"]) == 100
    assert _steps_for(["algo=grpo", "train.max_samples=25601"]) == 101  # the fewest steps that reach it
    # PPO: 64 x 1 per rollout, 2 epochs x 2 minibatches = 4 optimizer steps per rollout
    assert _steps_for(["algo=ppo", "train.max_samples=25600"]) == 400 * 4
    # P3O and online DPO: 64 x 2 per rollout
    assert _steps_for(["algo=p3o", "train.max_samples=25600"]) == 200 * 4
    assert _steps_for(["algo=online_dpo", "train.max_samples=25600"]) == 200
    # iterative RL: the same number of rollouts in every iteration
    assert _steps_for(["algo=grpo", "iterative.iterations=2", "train.max_samples=768"]) == 4
    # supervised: sequences, a preference pair counting two
    assert _steps_for(["algo=sft", "train.max_samples=640"]) == 640 // 32
    assert _steps_for(["algo=dpo", "train.max_samples=640"]) == 640 // (2 * 32)
    assert _steps_for(["algo=rft", "train.max_samples=640"]) == 640 // 32
    assert _steps_for(["algo=grpo", "train.max_steps=7"]) == 7  # no budget: max_steps decides
    _one_line_error(["train.max_samples=-1"], "train.max_samples=-1")


def test_the_outcome_weight_needs_process_supervision():
    validate(_compose(["algo=grpo", "algo.advantage=grpo_process", "algo.outcome_weight=0.5"]))
    validate(_compose(["algo=grpo", "algo.advantage=grpo_process_min", "algo.outcome_weight=0.5",
                          "reward.process=exact"]))
    _one_line_error(["algo=grpo", "algo.outcome_weight=0.5"], "algo.outcome_weight=0.5", "grpo_process")


def test_distillation_needs_a_teacher_and_only_it_reads_one():
    validate(_compose(["algo=distill", "teacher.path=builtin:tiny"]))
    validate(_compose(["algo=distill", "teacher.path=builtin:tiny", "algo.outcome_weight=1.0",
                       "algo.distill_coef=0.5"]))
    _one_line_error(["algo=distill"], "teacher.path", "algo.advantage=distill")
    _one_line_error(["algo=grpo", "teacher.path=stage:grpo"], "teacher.path=stage:grpo", "never used")
    _one_line_error(["algo=grpo", "algo.distill_coef=0.5"], "algo.distill_coef=0.5", "never used")
    _one_line_error(["algo=distill", "teacher.path=builtin:tiny", "algo.outcome_weight=1.0",
                     "rollout.samples_per_prompt=1"], "rollout.samples_per_prompt=1")
    # full-distribution divergences: the choice, beta only with jsd, top-k only with a divergence, chunked heads
    validate(_compose(["algo=distill", "teacher.path=builtin:tiny", "algo.distill_divergence=jsd",
                       "algo.distill_beta=0.3", "algo.distill_top_k=16"]))
    _one_line_error(["algo=distill", "teacher.path=builtin:tiny", "algo.distill_divergence=kl"],
                    "algo.distill_divergence='kl'", "forward_kl")
    _one_line_error(["algo=distill", "teacher.path=builtin:tiny", "algo.distill_beta=0.3"], "algo.distill_beta=0.3",
                    "distill_divergence=jsd")
    _one_line_error(["algo=distill", "teacher.path=builtin:tiny", "algo.distill_top_k=5"], "algo.distill_top_k=5",
                    "full-distribution")
    _one_line_error(["algo=distill", "teacher.path=builtin:tiny", "algo.distill_divergence=jsd",
                     "algo.distill_beta=1.0"], "algo.distill_beta=1.0", "(0, 1)")
    _one_line_error(["algo=distill", "teacher.path=builtin:tiny", "algo.distill_divergence=forward_kl",
                     "train.logit_chunk_tokens=0"], "train.logit_chunk_tokens > 0")


def test_engine_options_and_the_kl_controllers_are_refused_where_unread():
    """rollout.hf_* with the vllm engine, rollout.vllm.* with hf (auto may pick either: both read), the adaptive KL
    controller's target and horizon without it."""
    _one_line_error(["algo=grpo", "rollout.engine=vllm", "rollout.hf_cache=dynamic"], "rollout.hf_cache=dynamic",
                    "only the hf rollout engine reads it")
    _one_line_error(["algo=grpo", "rollout.engine=hf", "rollout.vllm.sleep=false"], "rollout.vllm.sleep=False",
                    "only the vllm rollout engine reads it")
    _one_line_error(["algo=ppo", "algo.kl_target=3"], "algo.kl_target=3.0", "algo.adaptive_kl=true")
    validate(_compose(["algo=grpo", "rollout.hf_cache=dynamic", "rollout.vllm.sleep=false"]))  # engine auto
    validate(_compose(["algo=ppo", "algo.adaptive_kl=true", "algo.kl_target=3", "algo.kl_horizon=100"]))


def test_the_exact_step_scorer_needs_process_supervision_and_the_builtin_task():
    validate(_compose(["algo=grpo", "algo.advantage=grpo_process", "reward.process=exact"]))
    _one_line_error(["algo=grpo", "reward.process=exact"], "reward.process=exact", "grpo_process")
    _one_line_error(["algo=grpo", "algo.advantage=grpo_process", "reward.process=exact", "data=jsonl",
                     "data.source=/some/file.jsonl"], "reward.process=exact", "reward.process=prm")


def test_exact_iteration_labels_need_the_builtin_task():
    iterative = ["algo=grpo", "iterative.iterations=2", "train.max_steps=20", "iterative.step_labels=exact"]
    validate(_compose(iterative))
    _one_line_error([*iterative, "data=jsonl", "data.source=/some/file.jsonl"], "iterative.step_labels=exact",
                    "iterative.step_labels=mc")
    _one_line_error(["algo=grpo", "iterative.step_labels=exact"], "iterative.step_labels=exact", "iterations > 1")
