"""rlft's configuration, one module per job.

- `fields`: fixed string choices (enums OmegaConf checks) and `read_when`, the declaration of which runs
  read an option.
- `schema`: the sections Hydra composes into (`Config`), a docstring under each field as its
  documentation; `register_schemas` stores them in Hydra's ConfigStore.
- `algorithms`: each training loop's `algo` schema and the algorithm table (`ALGOS`, `algo_spec`), with
  the sections only RL reads (critic, pairwise, iterative).
- `arithmetic`: values that follow from others (the RL batch, a sample budget's steps, accumulation).
- `validate`: the checks types cannot make, each a one-line `ConfigError`, and the refusal of options
  a run never reads (derived from the `read_when` declarations).
- `docs`: `rlft list keys` (field docstrings read from the source).

Public contract (scripts rely on these names): `run.name`, `seed`, `train.max_steps`,
`deepspeed.zero_stage`, `deepspeed.nproc_per_node`.
"""
