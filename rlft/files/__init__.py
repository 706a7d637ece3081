"""A run's files on disk, in one place.

    runs/<run.name>/<algo>/
        .lock            the one writer of this stage (rundir.py)
        config.yaml      resolved config of the stage
        metrics.jsonl    one JSON object per logged step
        manifest.json    stage, parent checkpoint, summary metrics; written last = stage complete (handoff.py)
        checkpoints/     resumable checkpoints step-NNNNNNN/, each with config.json and checksums.json
                         (checkpoints.py)
        final/           Hugging Face model directory with checksums.json (handoff.save_hf_dir)

- `handoff`: stage folders, `stage:<algo>` paths and how a stage finds another's output, manifests,
  atomic JSON files, atomic Hugging Face folders.
- `checkpoints`: writing a checkpoint through a temporary folder, finding the newest intact one, the
  resume config diff.
- `integrity`: checksum lists, and the disk-space checks before and during a write.
- `rundir`: the stage lock, a dead writer's temporaries, refusing to overwrite a completed stage.
- `cache`: folders derived once from a model the user names (a GGUF file's plain folder, an adapter
  merged onto its base), under `$RLFT_CACHE/models/`.

Everything here writes through a temporary path that is renamed into place, so a folder that exists is
complete. The trainer (rlft/trainer) only produces the state that goes in.
"""
