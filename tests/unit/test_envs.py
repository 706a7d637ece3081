"""Environments (rlft/envs): the calculator's parser and tool, the math answer check (exact and
math-verify), reasoning-gym rows and scores, the sandbox's limits, user environments by import
path, and GAE over a trajectory whose environment tokens are not steps."""
from __future__ import annotations

import os
import sys
from fractions import Fraction

import pytest
import torch
from omegaconf import OmegaConf

from helpers import require, sandbox_missing
from rlft import envs
from rlft.config.schema import Config
from rlft.envs import calculator as C
from rlft.envs import sandbox
from rlft.envs.math import MathEnv, answers_equal
from rlft.envs.python_tool import PythonEnv, last_block, with_instruction
from rlft.errors import ConfigError
from rlft.registry import UnknownNameError

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def cfg_with(**env):
    cfg = OmegaConf.structured(Config)
    for key, value in env.items():
        OmegaConf.update(cfg, f"env.{key}", value, merge=False)
    return cfg


# ----------------------------------------------------------------------------- calculator
@pytest.mark.parametrize("expr, value", [("48/2", 24), ("2*(3+4)", 14), ("-3+5", 2), ("1/3", Fraction(1, 3)),
                                         ("1,000-1", 999), ("2.5*4", 10), ("((2))", 2), ("- -3", 3),
                                         ("10-2*3+8/4", 6)])
def test_the_calculator_evaluates_arithmetic_exactly(expr, value):
    assert C.evaluate(expr) == value


@pytest.mark.parametrize("expr, why", [("7/0", "division by zero"), ("2**3", "unexpected '*'"), ("", "empty"),
                                       ("3+", "ends too early"), ("(1+2", "not closed"),
                                       ("__import__('os').system('x')", "unexpected character"),
                                       ("9" * 40, "more than 30 digits"), ("1+" * 150 + "1", "longer than 200")])
def test_the_calculator_refuses_what_is_not_arithmetic(expr, why):
    with pytest.raises(C.CalcError, match=why):
        C.evaluate(expr)
    assert C.calculate(expr)[0] == "?"


def test_results_print_as_gsm8k_writes_them():
    assert [C.format_number(Fraction(x)) for x in ("24", "-3", "1/2", "1/3", "2/3")] == \
        ["24", "-3", "0.5", "0.333333", "0.666667"]


def test_the_calculator_answers_an_open_call_and_ignores_other_equals_signs():
    env = C.CalculatorEnv(cfg_with(name="calculator"))
    assert env.stop == ("=",) and env.max_turns == 8
    reply = env.step({}, "<<12+5=29>>\n<<29-7=")
    assert (reply.text, reply.error, reply.tool_call, reply.done) == ("22>>", None, True, False)
    assert env.step({}, "so 3+4=").text == ""  # no open call: the model's turn goes on
    bad = env.step({}, "<<12/0=")
    assert bad.text == "?>>" and "division by zero" in bad.error


def test_calculator_demonstrations_leave_the_tools_results_untrained():
    env = C.CalculatorEnv(cfg_with(name="calculator"))
    # the built-in task's sloppy demonstration: 17+25 written as 32; the tool says 42, and the next
    # line starts from the tool's value, so does the final answer
    segments = env.demonstration({"response": "17+25=32\n32-7=25\n#### 25", "answer": "35"})
    assert segments == [("<<17+25=", True), ("42>>", False), ("\n<<42-7=", True), ("35>>", False),
                        ("\n#### 35", True)]
    # GSM8K's own annotations are kept, their results recomputed by the tool
    gsm = env.demonstration({"response": "She sold 48/2 = <<48/2=24>>24 clips.\n#### 24", "answer": "24"})
    assert gsm == [("She sold 48/2 = <<48/2=", True), ("24>>", False), ("24 clips.\n#### 24", True)]
    assert env.step_labels({"response": "2+3=5\n#### 5", "answer": "5"}, ["<<2+3=5>>", "#### 5"]) == [1, 1]


# ----------------------------------------------------------------------------- math
def test_the_math_answer_check_is_exact_for_numbers_and_math_verify_for_the_rest():
    assert answers_equal("1,000", "1000") and answers_equal("0.50", "1/2")
    assert not answers_equal("3", "4") and not answers_equal(None, "4")
    assert answers_equal("\\frac{1}{2}", "0.5")
    assert answers_equal("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}")
    assert not answers_equal("\\sqrt{2}/2", "\\frac{\\sqrt{3}}{2}")
    assert not answers_equal("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", verifier="exact")
    assert answers_equal("x+1", "1+x", verifier="math_verify")
    env = MathEnv(cfg_with())
    score = env.score({"answer": "Some work\n#### 12"}, "I think\n#### 12.0")
    assert (score.reward, score.correct, score.answer) == (1.0, True, "12")
    assert env.score({"answer": "\\frac{3}{4}"}, "so \\boxed{0.75}").correct


def test_the_math_environment_serves_the_data_and_its_demonstrations():
    env = MathEnv(cfg_with())
    cfg = env.cfg
    cfg.data.task.num_train, cfg.data.task.num_test = 50, 10
    rows = env.rows("train")
    assert len(rows) == 50 and env.rows("test")[0]["prompt"] not in {r["prompt"] for r in rows}
    assert env.demonstration(rows[0]) == [(rows[0]["response"], True)]
    with pytest.raises(ValueError, match="env.verifier='sympy' is not valid"):
        MathEnv(cfg_with(verifier="sympy"))


# ----------------------------------------------------------------------------- reasoning-gym
def test_reasoning_gym_rows_are_seeded_disjoint_and_scored_by_the_task():
    cfg = cfg_with(name="reasoning_gym", task="gsm_symbolic", train_size=60, test_size=20)
    env = envs.build(cfg)
    train, test = env.rows("train"), env.rows("test")
    assert len(test) == 20 and 0 < len(train) <= 60
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert [r["prompt"] for r in envs.build(cfg).rows("test")] == [r["prompt"] for r in test]  # seeded
    row = test[0]
    right, wrong = env.score(row, f"work\n#### {row['answer']}"), env.score(row, "#### 123456789")
    assert (right.reward, right.correct) == (1.0, True)
    assert 0.0 < wrong.reward < 1.0 and not wrong.correct  # the task's partial credit for an answer, kept
    assert env.score(row, "no answer").reward == 0.0
    assert env.score(row, f"<answer>{row['answer']}</answer>").correct
    assert env.demonstration(row) == [(f"#### {row['answer']}", True)]


def test_reasoning_gym_training_split_shares_no_generated_item_with_the_held_out_split(capsys):
    """reasoning-gym seeds item i of a dataset seeded s with s + i: with the splits' seeds 97 apart, 303 of 400
    training rows of chain_sum repeated a held-out row and were dropped. Now only genuine repeats are."""
    cfg = cfg_with(name="reasoning_gym", task="chain_sum", train_size=400, test_size=500,
                   task_config={"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2})
    train = envs.build(cfg).rows("train")
    assert len(train) == 400 and "dropped" not in capsys.readouterr().out


def test_reasoning_gym_says_when_its_task_settings_have_few_distinct_questions(capsys):
    """count_bits up to 7 has 7 questions: most training rows repeat a held-out one and are dropped."""
    cfg = cfg_with(name="reasoning_gym", task="count_bits", task_config={"min_n": 1, "max_n": 7}, train_size=40,
                   test_size=10)
    train = envs.build(cfg).rows("train")
    out = capsys.readouterr().out
    assert len(train) < 20 and "of 40 training row(s)" in out and "widen env.task_config" in out


def test_reasoning_gym_tasks_mix_by_weight_with_their_own_options():
    cfg = cfg_with(name="reasoning_gym", tasks={"chain_sum": 1, "basic_arithmetic": 3}, train_size=80, test_size=8,
                   task_config={"chain_sum": {"min_terms": 2, "max_terms": 2}})
    rows = envs.build(cfg).rows("test")
    tasks = [r["task"] for r in rows]
    assert tasks.count("chain_sum") == 2 and tasks.count("basic_arithmetic") == 6
    assert all(r["prompt"].count("+") + r["prompt"].count(" - ") == 1 for r in rows if r["task"] == "chain_sum")
    with pytest.raises(ValueError, match="unknown reasoning-gym task 'no_such_task'"):
        envs.build(cfg_with(name="reasoning_gym", task="no_such_task"))


def test_a_task_option_the_task_lacks_is_one_line_naming_its_options():
    with pytest.raises(ConfigError, match=r"^env.task_config: reasoning-gym task 'leg_counting' has no option "
                                          r"'min_animal'; its options: min_animals, max_animals, "):
        envs.build(cfg_with(name="reasoning_gym", task="leg_counting", task_config={"min_animal": 1}))
    mixed = {"chain_sum": 1, "leg_counting": 1}
    with pytest.raises(ConfigError, match=r"^env.task_config.chain_sum: .* no option 'min_term'"):
        envs.build(cfg_with(name="reasoning_gym", tasks=mixed, task_config={"chain_sum": {"min_term": 2}}))
    with pytest.raises(ConfigError, match=r"^env.task_config.min_terms: with env.tasks, env.task_config maps each"):
        envs.build(cfg_with(name="reasoning_gym", tasks=mixed, task_config={"min_terms": 2}))


# ----------------------------------------------------------------------------- user environments
def test_a_user_environment_loads_by_import_path_and_bad_paths_are_one_line_errors():
    sys.path.insert(0, DATA)
    try:
        env = envs.build(cfg_with(name="toy_env:CountA"))
        assert env.name == "count_a" and env.max_turns == 3 and len(env.rows("train")) == 6
        assert envs.build(cfg_with(name="toy_env:CountA", max_turns=2)).max_turns == 2
    finally:
        sys.path.remove(DATA)
    for name, needle in [("nope", "unknown environment 'nope'; valid: math, calculator"),
                         ("no_such_module:Env", "cannot import no_such_module"),
                         ("os:path", "is not a subclass of rlft.envs.Environment")]:
        with pytest.raises(UnknownNameError, match=needle) as err:
            envs.env_class(name)
        assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- python tool
def test_python_blocks_are_found_only_when_they_close_the_turn():
    assert last_block("Let me compute.\n```python\nprint(2+3)\n```") == "print(2+3)\n"
    assert last_block("```python\nprint(2+3)\n```\n") == "print(2+3)\n"
    assert last_block("Let me compute.\n```") is None  # an opening fence
    assert with_instruction("Q?", "Use python.") == "Q?\nUse python."
    assert with_instruction([{"role": "user", "content": "Q?"}], "Go.")[0]["content"] == "Q?\nGo."


def test_the_python_tool_runs_code_and_returns_its_output_as_a_tool_message():
    require(sandbox_missing())
    env = PythonEnv(cfg_with(name="python", instruction=""))
    reply = env.step({}, "```python\nprint(17 * 23)\n```")
    assert reply.tool_call and reply.error is None and reply.role == "tool"
    assert reply.content == "391\n" and reply.text == "\n<output>\n391\n\n</output>\n"
    assert env.step({}, "Let me use python.\n```").text == ""
    crash = env.step({}, "```python\n1/0\n```")
    assert "ZeroDivisionError" in crash.content and crash.error == "exit code 1"


# ----------------------------------------------------------------------------- the sandbox's parts
# (its behaviour against hostile code: tests/smoke/test_sandbox.py)
def test_a_python_is_offered_to_nobody_only_through_folders_others_may_enter(tmp_path):
    closed, open_ = tmp_path / "closed", tmp_path / "open"
    for folder, mode in ((closed, 0o700), (open_, 0o755)):
        folder.mkdir()
        (folder / "python3").write_text("")
        (folder / "python3").chmod(0o755)
        folder.chmod(mode)
    tmp_path.chmod(0o755)
    top = tmp_path
    while str(top) != "/" and os.stat(top).st_mode & 0o001:
        top = top.parent
    reachable = str(top) == "/"  # a parent folder of the test's temporary folder may itself be closed
    assert sandbox.others_can_run(str(open_ / "python3")) is reachable
    assert not sandbox.others_can_run(str(closed / "python3"))
    (open_ / "python3").chmod(0o750)
    assert not sandbox.others_can_run(str(open_ / "python3"))
    assert not sandbox.others_can_run(str(tmp_path / "missing"))


def test_the_sandbox_mounts_the_system_and_the_pythons_prefix_read_only():
    mounts = sandbox.bwrap_mounts(("/opt/conda", "/usr"))
    ro = sandbox.read_only_paths(mounts)
    assert "/usr" in ro and "/opt/conda" in ro and ro.count("/usr") == 1
    assert "--bind" not in mounts and "--dev-bind" not in mounts  # nothing of the host is writable
    for path in ("/bin", "/lib"):
        if os.path.islink(path):  # a merged /usr: recreated as the symlink it is
            assert ("--symlink", os.readlink(path), path) in zip(mounts, mounts[1:], mounts[2:])


def test_exit_statuses_name_what_stopped_the_code():
    assert sandbox.exit_error(0, "", 128) is None
    assert sandbox.exit_error(128 + 24, "", 128) == "cpu time limit"  # bwrap: 128 + the signal
    assert sandbox.exit_error(-9, "", None) == "killed"
    assert sandbox.exit_error(1, "MemoryError\n", 128) == "memory limit"
    assert sandbox.exit_error(3, "", 128) == "exit code 3"


def test_an_unknown_or_unavailable_sandbox_is_one_line_naming_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match="env.sandbox=docker: expected one of bwrap, trusted"):
        PythonEnv(cfg_with(name="python", sandbox="docker"))
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable) as err:
            PythonEnv(cfg_with(name="python")).describe()
        message = str(err.value)
        assert "bubblewrap (bwrap) is not on PATH" in message and "apt-get install bubblewrap" in message
        assert "env.sandbox=trusted" in message and "\n" not in message
    finally:
        sandbox.isolation.cache_clear()


def test_a_sandbox_bubblewrap_cannot_start_is_one_line_with_bwraps_reason(monkeypatch):
    require(sandbox_missing())
    said = "bwrap: setting up uid map: Permission denied"
    monkeypatch.setattr(sandbox, "run", lambda *a, **k: sandbox.Result(said + "\n", 1, "exit code 1", 0.01))
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable) as err:
            sandbox.describe()
    finally:
        sandbox.isolation.cache_clear()
    message = str(err.value)
    assert message.startswith(f"env.sandbox=bwrap: bubblewrap could not start the sandbox ({said}); it needs unprivileged")
    assert "seccomp=unconfined" in message and "env.sandbox=trusted" in message and "\n" not in message


def test_without_libseccomp_the_header_says_no_filter_is_in_force(monkeypatch):
    require(sandbox_missing())
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # its import fails, as where libseccomp is missing
    for cached in (sandbox.seccomp_filter, sandbox.isolation):
        cached.cache_clear()
    try:
        assert "no seccomp filter (libseccomp: " in sandbox.describe()
        assert sandbox.run("print(1)", sandbox.Limits()).output == "1\n"
    finally:
        for cached in (sandbox.seccomp_filter, sandbox.isolation):
            cached.cache_clear()


def test_the_trusted_mode_says_so_and_runs_the_code_as_the_trainers_user():
    env = PythonEnv(cfg_with(name="python", sandbox="trusted", instruction=""))
    assert env.describe().startswith("sandbox: NONE (env.sandbox=trusted)")
    reply = env.step({}, "```python\nimport os\nprint(os.geteuid())\n```")
    assert reply.content == f"{os.geteuid()}\n" and reply.error is None
    limited = sandbox.run("while True: pass", sandbox.Limits(timeout_s=15, cpu_s=1), "trusted")
    assert limited.error == "cpu time limit"


def test_each_run_has_a_fresh_private_working_directory():
    require(sandbox_missing())
    first = sandbox.run("import os\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read(), os.getcwd())",
                        sandbox.Limits())
    assert first.error is None and first.output == f"hi {sandbox.WORKDIR}\n"
    second = sandbox.run("import os; print(os.listdir('.'))", sandbox.Limits())
    assert second.output == "['main.py']\n"


# ----------------------------------------------------------------------------- GAE over tool outputs
def test_gae_passes_over_environment_tokens():
    from rlft.algos.value import gae

    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.5]])
    hole = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])  # columns 2-3: a tool's output
    adv, returns = gae(rewards, values, hole, 0.9, 0.8)
    # the same as the trajectory without the environment's columns
    adv_ref, returns_ref = gae(rewards[:, [0, 1, 4]], values[:, [0, 1, 4]], torch.ones(1, 3), 0.9, 0.8)
    torch.testing.assert_close(adv[:, [0, 1, 4]], adv_ref)
    torch.testing.assert_close(returns[:, [0, 1, 4]], returns_ref)
    assert adv[0, 2:4].tolist() == [0.0, 0.0]


def test_a_mapping_on_the_command_line_replaces_a_dict_options_default():
    """env.task_config={...} as the docs write it (Hydra alone would merge into the empty default and refuse
    the new keys); the CLI hands Hydra the overrides through replace_dicts."""
    from hydra import compose, initialize_config_dir

    from rlft.config.schema import register_schemas
    from rlft.overrides import conf_dir, replace_dicts

    register_schemas()
    args = ["env=reasoning_gym", "env.task_config={min_terms:2,max_terms:2}", "env.options={k:1}"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=replace_dicts(args))
    assert cfg.env.task_config == {"min_terms": 2, "max_terms": 2} and cfg.env.options == {"k": 1}
    assert replace_dicts(["env=math", "env.name=x"]) == ["env=math", "env.name=x"]
